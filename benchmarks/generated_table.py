"""One table from the shards of `benchmarks/kernelbench.py` or `benchmarks/intents.py` (their
JSON files, from one or more runs): for each task or intent the latest row wins; the summary is
recomputed over the merged rows by the benchmark's own `summary`; a Markdown table per row — what
was delivered, PyTorch eager and torch.compile, the memory-bound floor, what the search did — with
the device, dates and versions of the runs. No GPU.

    python3 benchmarks/generated_table.py kernelbench RUN.json ... --out kernelbench-h200.json \\
        --md kernelbench-h200.md
    python3 benchmarks/generated_table.py intents RUN.json ... --out intents-h200.json --md ...
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
    rows: dict[str, dict] = {}
    for run in runs:
        for row in run.get("rows", []):
            rows[row[key]] = row
    bench = load_script(f"benchmarks/{kind}.py", f"{kind}_for_table")
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
    for r in table["rows"]:
        lines.append(
            f"| `{r[key]}` | {_ms(r.get('delivered_ms'))} | {_ms(r.get('eager_ms'))} | "
            f"{_ms(r.get('compile_ms'))} | {_x(r.get('speedup_vs_eager'))} | "
            f"{_x(r.get('speedup_vs_compile'))} | {_x(r.get('over_floor'))} | {_search(r)} | "
            f"{_what(r)} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("kind", choices=sorted(KEYS))
    ap.add_argument("runs", type=Path, nargs="+")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--md", type=Path, required=True)
    args = ap.parse_args(argv)
    table = merge(args.kind, [json.loads(p.read_text()) for p in args.runs])
    args.out.write_text(json.dumps(table, indent=1) + "\n")
    args.md.write_text(markdown(args.kind, table))
    print(json.dumps(table["summary"]))


if __name__ == "__main__":
    main()
