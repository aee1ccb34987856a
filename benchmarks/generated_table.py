"""One table from the shards of `benchmarks/kernelbench.py` or `benchmarks/intents.py` (their
JSON files, from one or more runs): for each task or intent the latest row wins; the summary is
recomputed over the merged rows by the benchmark's own `summary`; a Markdown table per row — what
was delivered, PyTorch eager and torch.compile, the memory-bound floor, what the search did — with
the device, dates and versions of the runs. No GPU.

    python3 benchmarks/generated_table.py kernelbench RUN.json ... --out kernelbench-h200.json \\
        --md kernelbench-h200.md
    python3 benchmarks/generated_table.py intents RUN.json ... --out intents-h200.json --md ...

`--tasks DIR` keeps the rows of the task files in DIR (a run may hold tasks of both folders).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support import load_script  # noqa: E402

# what names a row, per benchmark
KEYS = {"kernelbench": "task", "intents": "intent"}
RUN_FIELDS = ("date", "device", "torch", "cuda", "nvcc", "python", "optiml", "args")


def merge(kind: str, runs: list[dict]) -> dict:
    """The runs' rows, the latest run's row for each name (runs in the order given), in the order
    the names first appeared; the runs' environments; the summary of the merged rows."""
    key = KEYS[kind]
    bench = load_script(f"benchmarks/{kind}.py", f"{kind}_for_table")
    normalize = getattr(bench, "normalize", lambda row: row)
    rows: dict[str, dict] = {}
    for run in runs:
        for row in run.get("rows", []):
            row = normalize(row)
            earlier = rows.get(row[key])
            if earlier is not None and "optimize" not in row.get("steps", ["optimize"]):
                # a run that timed only PyTorch: its times replace the earlier row's, whose
                # delivered kernel stays
                times = {k: row[k] for k in bench.TORCH_FIELDS if k in row}
                row = {k: v for k, v in earlier.items() if k not in bench.TORCH_FIELDS}
                row = {k: v for k, v in row.items() if not k.startswith("speedup_vs_")}
                row.update(times, torch_from=f"a later run ({run.get('date')})")
                bench.speedups(row)
            rows[row[key]] = row
    merged = list(rows.values())
    return {
        "runs": [{f: run.get(f) for f in RUN_FIELDS} for run in runs],
        "summary": bench.summary(merged),
        "rows": merged,
    }


def _ms(x: float | None) -> str:
    return f"{x:.4g}" if isinstance(x, int | float) else "–"


def _x(x: float | None) -> str:
    return f"{x:.2f}×" if isinstance(x, int | float) else "–"


def _search(row: dict) -> str:
    s = row.get("search")
    if not s:
        return "–"
    ok = [n for n in s.get("nodes", []) if n.get("status") == "ok"]
    best = max((n["speedup"] for n in ok if n.get("speedup")), default=None)
    return (
        f"{s.get('evaluations')} evaluated, {len(ok)} correct, best {_x(best)}, "
        f"stopped: {s.get('stop')}"
    )


def _what(row: dict) -> str:
    for k in ("why", "error", "optimize_error", "delivered_error"):
        if row.get(k):
            return str(row[k]).replace("|", "/").replace("\n", " ")[:160]
    outcome = str(row.get("optimize_outcome") or "").replace("|", "/")[:160]
    if row.get("delivered_flags"):
        outcome += f" (built with {' '.join(row['delivered_flags'])})"
    return outcome


def markdown(kind: str, table: dict) -> str:
    key = KEYS[kind]
    runs, s = table["runs"], table["summary"]
    devices = sorted({r.get("device") or "no GPU" for r in runs})
    lines = [
        f"# {'KernelBench level 1' if kind == 'kernelbench' else 'Formula intents'}: "
        f"delivered kernels against PyTorch on {' and '.join(devices)}",
        "",
        f"From `benchmarks/generated_table.py` over {len(runs)} run(s) of `benchmarks/{kind}.py` "
        f"({', '.join(str(r.get('date')) for r in runs)}; torch {runs[0].get('torch')}, "
        f"CUDA {runs[0].get('cuda')}, {runs[0].get('nvcc')}; Python {runs[0].get('python')}; "
        f"optimize's budget {(runs[0].get('args') or {}).get('budget')} evaluations, "
        f"{(runs[0].get('args') or {}).get('time')} s).",
        "",
        "Summary: "
        + ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in s.items())
        + ".",  # fmt: skip
        "",
        "*over copy floor*: the delivered time over every byte the task reads and writes once at "
        "the device-to-device copy bandwidth measured on that GPU (an elementwise kernel can beat "
        "cudaMemcpy's rate: under 1x); the harness holds candidates to another floor, the DRAM's.",
        "",
        f"| {key} | delivered ms | eager ms | compile ms | vs eager | vs compile | over copy floor "
        "| search | outcome |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    if kind == "kernelbench":
        lines[-4:-4] = [
            "*eager*, *compile*: PyTorch in fp32 with TF32 off, the contract the delivered kernel "
            "is checked to; *vs eager (defaults)*: where a task holds a convolution, eager with "
            "PyTorch's defaults (cuDNN's TF32 on, less accurate than the delivered kernel), also "
            "in the summary's `vs_eager_defaults` (elsewhere the defaults are fp32: the same "
            "figure). A convolution's row from a run that timed PyTorch with the defaults only "
            "shows – for fp32.",
            "",
        ]
        lines[-2] = lines[-2].replace("| vs compile |", "| vs compile | vs eager (defaults) |")
        lines[-1] += "---|"
    for r in table["rows"]:
        # the defaults' figure is the fp32 one where they are the same (no convolution)
        fallback = r.get("speedup_vs_eager_default", r.get("speedup_vs_eager"))
        default = f"{_x(fallback)} | " if kind == "kernelbench" else ""
        lines.append(
            f"| `{r[key]}` | {_ms(r.get('delivered_ms'))} | {_ms(r.get('eager_ms'))} | "
            f"{_ms(r.get('compile_ms'))} | {_x(r.get('speedup_vs_eager'))} | "
            f"{_x(r.get('speedup_vs_compile'))} | {default}{_x(r.get('over_floor'))} | "
            f"{_search(r)} | {_what(r)} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("kind", choices=sorted(KEYS))
    ap.add_argument("runs", type=Path, nargs="+")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--md", type=Path, required=True)
    ap.add_argument(
        "--tasks",
        type=Path,
        default=None,
        help="only the rows whose task file is in this folder (KernelBench's level 1 of "
        "../shared, apart from this project's own tasks in fixtures/kb_extra run beside them)",
    )
    args = ap.parse_args(argv)
    runs = [json.loads(p.read_text()) for p in args.runs]
    if args.tasks is not None:
        names = {p.name for p in args.tasks.iterdir()}
        key = KEYS[args.kind]
        runs = [{**r, "rows": [w for w in r.get("rows", []) if w[key] in names]} for r in runs]
    table = merge(args.kind, runs)
    args.out.write_text(json.dumps(table, indent=1) + "\n")
    args.md.write_text(markdown(args.kind, table))
    print(json.dumps(table["summary"]))


if __name__ == "__main__":
    main()
