"""What `optiml optimize` delivers, with its default settings, on kernels written apart from the
catalog: fixtures/corpus (each with a PyTorch equivalent), fixtures/holdout and fixtures/wild.

    python3 benchmarks/corpus.py --out DIR [--sets corpus,holdout,wild] [--only KERNEL ...]
                                 [--shard i/n] [--cap 300] [--no-gpu]

For each kernel: a copy of its file is optimized (`optiml optimize --write`, no budget or time
given: the defaults a user gets), its wall time kept (the bar: the delivered result within 90 s);
the delivered kernel (the confirmed and judged winner written into the copy, else the kernel as
written) is timed by `optiml eval` at the spec's first size, with the memory-bound floor of that
size (benchmarks/schedules.py's: what the outputs depend on read once, every output written once,
over the measured copy bandwidth); on the corpus, its PyTorch equivalent is timed on the same
inputs (CUDA events, L2 flush, TF32 off). Writes DIR/corpus.json (or corpus-I-of-N.json) after
every kernel: a row each (each step's time or error), and per set the geometric mean of
delivered / PyTorch, how many memory-bound kernels are within 1.3x of their floor, how many were
delivered within 90 s, and how many got a confirmed winner. A kernel that fails at a step is a row
with its error; the run goes on. `--no-gpu` stops after copying (a check of the set-up).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from kernelbench import (  # noqa: E402
    _optiml,
    delivered_ms,
    environment,
    failure,
    geomean,
    memory_floor_ms,
    run_optimize,
    save,
    shard,
)
from schedules import SETS, family, kernels, memory_bound, torch_ms  # noqa: E402

from optiml.spec import load  # noqa: E402

DELIVERED_WITHIN_S = 90.0  # the bar's wall time for a delivered result
NEAR_FLOOR = 1.3


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--sets", default="corpus,holdout,wild")
    p.add_argument("--only", nargs="*", help="kernel names")
    p.add_argument(
        "--shard", type=shard, default=(1, 1), help="i/n: every n-th kernel from the i-th"
    )
    p.add_argument(
        "--cap",
        type=float,
        default=300.0,
        help="seconds one optimize may take before it is stopped",
    )
    p.add_argument("--eval-timeout", type=float, default=300.0)
    p.add_argument("--no-gpu", action="store_true", help="only copy the files (a set-up check)")
    args = p.parse_args(argv)
    args.sets = [s for s in args.sets.split(",") if s]
    bad = [s for s in args.sets if s not in SETS]
    if bad:
        p.error(f"--sets: unknown set {bad[0]} (known: {', '.join(SETS)})")
    return args


def chosen(args: argparse.Namespace) -> list[dict]:
    entries = kernels(args.sets)
    if args.only:
        entries = [e for e in entries if e["kernel"] in args.only]
    i, n = args.shard
    return entries[i - 1 :: n]


def eval_step(row: dict, cu: Path, args: argparse.Namespace) -> dict | None:
    verdict, error = _optiml(["eval", str(cu), "--kernel", row["kernel"]], args.eval_timeout)
    if verdict is None or verdict.get("status") != "ok":
        row["delivered_error"] = error or (verdict or {}).get("message", "")
        return None
    row["delivered_ms"] = delivered_ms(verdict)
    return verdict


def floor_step(row: dict, cu: Path, entry: dict, verdict: dict) -> None:
    """The memory-bound floor of the first size: the delivered kernel's verdict says what its
    outputs depend on and which GPU ran it, the harness's cache what bandwidth that GPU has; and
    on the corpus, the PyTorch equivalent's time at that size."""
    _, _, spec = load(cu, row["kernel"])
    if floor := memory_floor_ms(spec, verdict):
        row["floor_ms"] = floor
    row["torch_ms"] = torch_ms(entry, spec)


def summary(rows: list[dict]) -> dict:
    out = {}
    for name in dict.fromkeys(r["set"] for r in rows):
        rs = [r for r in rows if r["set"] == name]
        vs_torch = [
            r["delivered_ms"] / r["torch_ms"]
            for r in rs
            if r.get("delivered_ms") and r.get("torch_ms")
        ]
        floors = [
            r["delivered_ms"] / r["floor_ms"]
            for r in rs
            if r.get("delivered_ms") and r.get("floor_ms") and memory_bound(r)
        ]
        timed = [r for r in rs if "optimize_s" in r]
        out[name] = {
            "kernels": len(rs),
            "with_a_winner": sum(bool(r.get("winner")) for r in rs),
            "geomean_delivered_over_torch": geomean(vs_torch),
            "with_torch": len(vs_torch),
            f"memory_bound_within_{NEAR_FLOOR}_of_floor": sum(f <= NEAR_FLOOR for f in floors),
            "memory_bound_with_a_floor": len(floors),
            f"delivered_within_{DELIVERED_WITHIN_S:.0f}_s": sum(
                r["optimize_s"] <= DELIVERED_WITHIN_S for r in timed
            ),
            "optimized": len(timed),
        }
    return out


def run(args: argparse.Namespace) -> dict:
    args.out.mkdir(parents=True, exist_ok=True)
    table = {
        **environment(),
        "args": {"sets": args.sets, "only": args.only, "shard": "/".join(map(str, args.shard))},
        "rows": [],
    }
    i, n = args.shard
    target = args.out / ("corpus.json" if n == 1 else f"corpus-{i}-of-{n}.json")
    save(table, target, summary)
    for entry in chosen(args):
        row: dict = {"set": entry["set"], "file": str(entry["path"].relative_to(ROOT))}
        row["kernel"] = entry["kernel"]
        try:
            source, kernel, _ = load(
                entry["path"], entry["kernel"]
            )  # a spec that fails is the row's error
            row["family"] = family(source, kernel)
            work = args.out / "work" / entry["set"] / entry["kernel"]
            work.mkdir(parents=True, exist_ok=True)
            cu = work / entry["path"].name
            shutil.copy(entry["path"], cu)
            # NumPy references and headers the file names stay reachable from the copy
            for extra in entry["path"].parent.glob("*.py"):
                shutil.copy(extra, work / extra.name)
            if not args.no_gpu:
                run_optimize(row, cu, [], timeout=args.cap)  # the defaults a user gets
                verdict = eval_step(row, cu, args)
                if verdict is not None:
                    floor_step(row, cu, entry, verdict)
        except Exception as e:  # never a crash: the row says what went wrong
            row["error"] = failure(e)
        table["rows"].append(row)
        save(table, target, summary)
        print(
            f"{row['set']:8} {row['kernel']:32} "
            + (
                f"{row.get('optimize_s', '-')} s, delivered {row.get('delivered_ms')} ms, "
                f"torch {row.get('torch_ms')} ms, floor {row.get('floor_ms')} ms"
                if not args.no_gpu
                else "copied"
            )
            + (f"  [{row['error']}]" if "error" in row else ""),
            flush=True,
        )
    return table


def main(argv: list[str] | None = None) -> None:
    table = run(parse_args(argv))
    print(json.dumps(table["summary"], indent=1))


if __name__ == "__main__":
    main()
