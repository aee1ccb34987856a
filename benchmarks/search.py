"""The search benchmark: MCTS against random search, greedy best-first and exhaustive enumeration of
a bounded space of variants, at equal evaluation budgets, over several seeds.

Method. For each fixture the bounded space is every sequence of up to --depth catalog
transformations that apply (each with its --grid best-ranked parameter choices), deduplicated by the
code they produce. Phase 1 (on the GPU) measures every variant of the space once, exactly as the
search evaluates a candidate (compile, check at every size and 2 seeds, time the first size
interleaved with the input), and keeps the results in a table (--table, resumable: variants already
measured are not measured again). Phase 2 (no GPU) runs each strategy over that table: a strategy's
evaluation of a variant looks its measurement up, so all strategies see the same numbers and the
exhaustive best is known. Priors of MCTS come from the offline policy with the input's profile
(measured once per fixture; variants of the space are not profiled in the table).

    python3 benchmarks/search.py measure --table T.json [--fixtures ...] [--seconds S]
    python3 benchmarks/search.py compare --table T.json --out DIR [--seeds 5] [--budgets 8,16,24]
    python3 benchmarks/search.py at-size --table T.json --fixture F::K --size n=268435456 --out F.json

`at-size` (on the GPU) re-measures a fixture's confirmed best, as `optiml optimize` confirms a
winner, at another problem size than the fixture's first: e.g. one whose buffers dwarf the L2 and
whose time dwarfs a launch, to tell a kernel's bandwidth from the fixed costs of a small size. It
checks against the original with the spec's tolerance, which may not hold at other sizes: the
naive reduce_sum's own rounding at 2^28 floats (8.2 from an accurate rewrite's sum) is past its atol.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import functools
import json
import math
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from optiml.cuda.types import DTYPES  # noqa: E402
from optiml.search.mcts import Evaluation, Search, SearchConfig  # noqa: E402
from optiml.search.policy import JITTER, NodeView, OfflinePolicy  # noqa: E402
from optiml.search.trajectory import Edit, Measurement, ProfileSummary  # noqa: E402
from optiml.search.variant import Variant  # noqa: E402
from optiml.spec import load  # noqa: E402

# One fixture per memory-bound category of the bar, and the naive SGEMM.
FIXTURES = [
    ("saxpy.cu", "saxpy"),
    ("reduce_sum.cu", "reduce_sum"),
    ("transpose.cu", "transpose_naive"),
    ("softmax.cu", "softmax_rows"),
    ("layernorm.cu", "layernorm_forward"),
    ("stencil2d.cu", "jacobi_step"),
    ("histogram.cu", "histogram_global"),
    ("sgemm.cu", "sgemm_naive"),
]


@dataclass
class Space:
    """The bounded space of one fixture: variant key -> (variant, path of edit keys), and edges."""

    variants: dict[str, Variant]
    paths: dict[str, list[str]]
    children: dict[str, list[tuple[Edit, float, str]]]  # parent key -> (edit, prior, child key)


def enumerate_space(
    file: str, kernel: str, depth: int, grid: int, profile: ProfileSummary | None
) -> Space:
    source, k, _ = load(ROOT / "fixtures" / file, kernel)
    policy = OfflinePolicy()
    root = Variant(source.text)
    variants = {root.key: root}
    paths = {root.key: []}
    children: dict[str, list[tuple[Edit, float, str]]] = {}
    frontier = [(root, ())]
    for _ in range(depth):
        nxt = []
        for variant, applied in frontier:
            request = NodeView(
                variant=variant,
                path=str(ROOT / "fixtures" / file),
                kernel=k.name,
                applied=applied,
                profile=profile,
            )
            per_transform: dict[str, int] = {}
            edges = []
            for c in policy.candidates(request):
                seen = per_transform.get(c.edit.transform, 0)
                if seen >= grid:
                    continue
                per_transform[c.edit.transform] = seen + 1
                key = c.variant.key
                edges.append((c.edit, c.prior, key))
                if key not in variants:
                    variants[key] = c.variant
                    paths[key] = [*paths[variant.key], c.edit.key]
                    nxt.append((c.variant, (*applied, c.edit.transform)))
            children[variant.key] = edges
        frontier = nxt
    return Space(variants, paths, children)


# ---- phase 1: measure ---------------------------------------------------------------------------


def measure(args: argparse.Namespace) -> None:
    from optiml.cuda.source import SourceFile
    from optiml.executors import LocalExecutor
    from optiml.executors.base import Job
    from optiml.search.optimize import OptimizeOptions
    from optiml.search.problem import ProblemOptions
    from optiml.search.problem import measure as measure_one

    table = _load(args.table)
    executor = LocalExecutor()
    opts = OptimizeOptions()
    search_opts = ProblemOptions(eval=opts.search_eval, profile=False)
    base_opts = ProblemOptions(eval=opts.search_eval, profile=True)
    deadline = time.monotonic() + args.seconds
    wanted = [f for f in FIXTURES if not args.fixtures or f[0] in args.fixtures]

    async def run() -> None:
        # Every fixture's space first, then breadth first over depths across fixtures: if time
        # runs out, every fixture has its depth-1 variants measured and its best confirmed.
        spaces = {}
        for file, kernel in wanted:
            name = f"{file}::{kernel}"
            entry = table.setdefault(name, {"measurements": {}, "baseline": None})
            source, k, spec = load(ROOT / "fixtures" / file, kernel)
            if entry["baseline"] is None:
                job = Job(source, k, spec, candidate=SourceFile(source.text, source.path))
                base = await measure_one(executor, job, base_opts)
                if base.speedup is None:  # one object for both: timed once, 1.0 by definition
                    base.speedup, base.reference_ms = 1.0, base.candidate_ms
                entry["baseline"] = base.model_dump()
                _save(args.table, table)
            base = Measurement.model_validate(entry["baseline"])
            space = enumerate_space(file, kernel, args.depth, args.grid, base.profile)
            entry["space_size"] = len(space.variants)
            entry["depth"], entry["grid"] = args.depth, args.grid
            spaces[name] = (entry, space, source, k, spec)
            print(f"{name}: {len(space.variants)} variants", flush=True)
        for depth in range(1, args.depth + 1):
            pending: set[asyncio.Task] = set()
            for entry, space, source, k, spec in spaces.values():
                for key, v in space.variants.items():
                    if len(space.paths[key]) != depth or key in entry["measurements"]:
                        continue
                    if time.monotonic() > deadline:
                        break
                    job = Job(
                        source, k, spec, candidate=SourceFile(v.text, source.path), flags=v.flags
                    )
                    task = asyncio.create_task(measure_one(executor, job, search_opts))
                    task.key, task.entry = v.key, entry  # type: ignore[attr-defined]
                    pending.add(task)
                    if len(pending) >= 2 * executor.slots + 2:
                        done, pending = await asyncio.wait(
                            pending, return_when=asyncio.FIRST_COMPLETED
                        )
                        _record(done)
                        _save(args.table, table)
            if pending:
                done, _ = await asyncio.wait(pending)
                _record(done)
            _save(args.table, table)
            for entry, space, source, k, spec in spaces.values():
                await _confirm_best(executor, opts, entry, space, source, k, spec)
                _save(args.table, table)
            print(f"depth {depth} done", flush=True)
            if time.monotonic() > deadline:
                print("time is up; the table is saved and the next run goes on from it")
                break

    asyncio.run(run())
    table["_meta"] = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "device": _device(),
        "method": "each variant measured once as the search evaluates it (2 seeds, every size checked, first size timed interleaved with the input)",
    }
    _save(args.table, table)


async def _confirm_best(executor, opts, entry, space, source, k, spec) -> None:
    """Re-measure the space's fastest variant as `optiml optimize` confirms a winner (longer,
    interleaved with the input): the figure the bar is read from."""
    from optiml.cuda.source import SourceFile
    from optiml.executors.base import Job

    ok = {
        key: m for key, m in entry["measurements"].items() if m["status"] == "ok" and m["speedup"]
    }
    if not ok:
        return
    best = max(ok, key=lambda key: ok[key]["speedup"])
    if entry.get("best_confirmed", {}).get("key") == best:
        return
    v = space.variants[best]
    job = Job(source, k, spec, candidate=SourceFile(v.text, source.path), flags=v.flags)
    m = Measurement.of(await executor.evaluate(job, opts.confirm_eval))
    entry["best_confirmed"] = {
        "key": best,
        "path": space.paths[best],
        "status": m.status,
        "speedup": m.speedup,
        "candidate_ms": m.candidate_ms,
        "reference_ms": m.reference_ms,
        "noise": m.noise,
        "kernel": v.text,
        "flags": list(v.flags),
    }


def _record(done) -> None:
    for t in done:
        m = t.result()
        t.entry["measurements"][t.key] = {
            "status": m.status,
            "speedup": m.speedup,
            "candidate_ms": m.candidate_ms,
            "reference_ms": m.reference_ms,
            "noise": m.noise,
            "message": m.message[:200],
        }


def _device() -> str | None:
    from optiml.harness.gpu import local_gpus

    gpus = local_gpus()
    return gpus[0][0] if gpus else None


def _load(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def _save(path: Path, table: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(table, indent=1, sort_keys=True))
    tmp.replace(path)


# ---- phase 2: compare ---------------------------------------------------------------------------


def speedup_of(entry: dict, key: str, root_key: str) -> float | None:
    if key == root_key:
        return 1.0
    m = entry["measurements"].get(key)
    if m is None or m["status"] != "ok" or not m["speedup"]:
        return None
    return m["speedup"]


class ReplayProblem:
    """The search problem over a measured space: evaluations are look-ups."""

    def __init__(self, space: Space, entry: dict, root_key: str, profile: ProfileSummary | None):
        self.space, self.entry, self.root_key, self.profile = space, entry, root_key, profile

    def propose(self, node, k, rng):
        edges = self.space.children.get(node.state.key, [])
        # the offline policy's seeded jitter (optiml.search.policy.JITTER), as in a real search
        return [
            (edit, prior * (1 + JITTER * rng.random()))
            for edit, prior, child in edges
            if child in self.entry["measurements"] or child == self.root_key
        ]

    def apply(self, state, action):
        for edit, _, child in self.space.children[state.key]:
            if edit.key == action.key:
                return self.space.variants[child]
        raise KeyError(action.key)

    def evaluate(self, state):
        s = speedup_of(self.entry, state.key, self.root_key)
        return Evaluation(reward=None if s is None else math.log(s))

    def action_key(self, action):
        return action.key


def run_mcts(space, entry, root_key, profile, budget, seed) -> list[float]:
    problem = ReplayProblem(space, entry, root_key, profile)
    search = Search(problem, space.variants[root_key], SearchConfig(seed=seed))
    trace: list[float] = []

    def on_progress(p):
        trace.append(math.exp(p.best_reward) if p.best_reward is not None else 1.0)

    asyncio.run(search.run(max_evaluations=budget, on_progress=on_progress))
    return trace


def run_random(space, entry, root_key, budget, seed) -> list[float]:
    """Random walks from the input: each step takes a random applicable edit or stops."""
    rng = random.Random(seed)
    seen, trace, best = {root_key}, [1.0], 1.0
    attempts = 0
    while len(trace) < budget and attempts < 100 * budget:
        attempts += 1
        key = root_key
        while True:
            edges = [c for _, _, c in space.children.get(key, []) if c in entry["measurements"]]
            if not edges or (key != root_key and rng.random() < 0.35):
                break
            key = rng.choice(edges)
        if key in seen:
            continue
        seen.add(key)
        s = speedup_of(entry, key, root_key)
        best = max(best, s or 0)
        trace.append(best)
    return trace


def run_greedy(space, entry, root_key, budget, seed) -> list[float]:
    """Best-first: evaluate every child of the best evaluated variant not yet expanded (ties and
    the order among children broken by the seed)."""
    rng = random.Random(seed)
    evaluated = {root_key: 1.0}
    expanded: set[str] = set()
    trace, best = [1.0], 1.0
    while len(trace) < budget:
        open_nodes = [k for k, s in evaluated.items() if s is not None and k not in expanded]
        if not open_nodes:
            break
        top = max(evaluated[k] for k in open_nodes)
        key = rng.choice([k for k in open_nodes if evaluated[k] == top])
        expanded.add(key)
        kids = [
            c
            for _, _, c in space.children.get(key, [])
            if c in entry["measurements"] and c not in evaluated
        ]
        rng.shuffle(kids)
        for child in kids:
            if len(trace) >= budget:
                break
            s = speedup_of(entry, child, root_key)
            evaluated[child] = s
            best = max(best, s or 0)
            trace.append(best)
    return trace


def compare(args: argparse.Namespace) -> None:
    table = _load(args.table)
    budgets = [int(b) for b in args.budgets.split(",")]
    rows = []
    for file, kernel in FIXTURES:
        name = f"{file}::{kernel}"
        entry = table.get(name)
        if not entry or not entry.get("measurements"):
            continue
        base = Measurement.model_validate(entry["baseline"])
        space = enumerate_space(
            file, kernel, entry.get("depth", args.depth), entry.get("grid", args.grid), base.profile
        )
        root_key = next(iter(space.variants))
        measured = [k for k in space.variants if k in entry["measurements"] or k == root_key]
        best_key = max(measured, key=lambda k: speedup_of(entry, k, root_key) or 0)
        best = speedup_of(entry, best_key, root_key)
        complete = len(measured) == len(space.variants)
        row = {
            "fixture": name,
            "space": len(space.variants),
            "measured": len(measured),
            "complete": complete,
            "exhaustive_best": best,
            "exhaustive_best_path": space.paths[best_key],
            "exhaustive_evaluations": len(measured),
            "strategies": {},
        }
        target = 0.95 * best

        def run(sname: str, budget: int, seed: int) -> list[float]:
            if sname == "mcts":
                return run_mcts(space, entry, root_key, base.profile, budget, seed)  # noqa: B023
            fn = run_random if sname == "random" else run_greedy
            return fn(space, entry, root_key, budget, seed)  # noqa: B023

        strategies = ("mcts", "random", "greedy")
        for sname in strategies:
            fn = functools.partial(run, sname)
            per_budget = {}
            for b in budgets:
                bests, reach = [], []
                for seed in range(args.seeds):
                    trace = fn(min(b, len(measured)), seed)
                    bests.append(max(trace) if trace else 1.0)
                    hit = next((i + 1 for i, v in enumerate(trace) if v >= target), None)
                    reach.append(hit)
                per_budget[str(b)] = {
                    "best_speedup_mean": statistics.fmean(bests),
                    "best_speedups": bests,
                    "evals_to_95pct": reach,
                }
            full = [fn(len(measured), seed) for seed in range(args.seeds)]
            to95 = [next((i + 1 for i, v in enumerate(t) if v >= target), None) for t in full]
            per_budget["evals_to_95pct_of_exhaustive"] = to95
            row["strategies"][sname] = per_budget
        rows.append(row)
        print(
            f"{name}: space {len(space.variants)}, exhaustive best {best:.2f}x; "
            + ", ".join(
                f"{s}@{budgets[-1]} {row['strategies'][s][str(budgets[-1])]['best_speedup_mean']:.2f}x"
                for s in strategies
            )
            + f"; MCTS reaches 95% in {row['strategies']['mcts']['evals_to_95pct_of_exhaustive']} of {len(measured)}",
            flush=True,
        )
    summary = {}
    for b in budgets:
        summary[str(b)] = (
            {
                s: math.exp(
                    statistics.fmean(
                        math.log(r["strategies"][s][str(b)]["best_speedup_mean"]) for r in rows
                    )
                )
                for s in ("mcts", "random", "greedy")
            }
            if rows
            else {}
        )
    report = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "table": table.get("_meta"),
        "bar": bar(table, args.baselines),
        "seeds": args.seeds,
        "budgets": budgets,
        "geomean_best_speedup": summary,
        "fixtures": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "search-compare.json").write_text(json.dumps(report, indent=1))
    print(json.dumps(summary, indent=1))


def bar(table: dict, baselines_path: Path) -> list[dict]:
    """Per fixture: the confirmed best variant's time at the first size, the bandwidth that gives
    (the fewest bytes the operation must move over that time) against the measured copy ceiling,
    and PyTorch's time for the same operation (or cuBLAS's, for SGEMM)."""
    base = json.loads(baselines_path.read_text()) if baselines_path.exists() else {}
    copy_tbps = base.get("copy", {}).get("tbps")
    torch_ms: dict[str, float] = {}
    for row in base.get("fixtures", []):
        key = f"{row['fixture']}::{row['kernel']}"
        torch_ms[key] = min(torch_ms.get(key, math.inf), row["ms"])
    out = []
    for file, kernel in FIXTURES:
        name = f"{file}::{kernel}"
        best = table.get(name, {}).get("best_confirmed")
        if not best or best["status"] != "ok":
            continue
        row = {
            "fixture": name,
            "input_ms": best["reference_ms"],
            "best_ms": best["candidate_ms"],
            "speedup": best["speedup"],
            "path": best["path"],
        }
        if kernel == "sgemm_naive":
            cublas = base.get("sgemm_fp32_4096_tf32_off", {}).get("ms")
            row["cublas_ms"] = cublas
            row["vs_cublas"] = best["candidate_ms"] / cublas if cublas else None
        else:
            nbytes = bytes_moved(file, kernel)
            tbps = nbytes / best["candidate_ms"] / 1e9
            row.update(
                bytes=nbytes,
                tbps=tbps,
                of_copy_ceiling=tbps / copy_tbps if copy_tbps else None,
                of_4_3_tbps=tbps / 4.3,
            )
            if name in torch_ms:
                row["torch_ms"] = torch_ms[name]
                row["vs_torch"] = best["candidate_ms"] / torch_ms[name]
        out.append(row)
    return out


def bytes_moved(file: str, kernel: str, size: dict[str, int] | None = None) -> int:
    """The fewest bytes the kernel must move at its first size (or `size`): inputs read once,
    outputs written once (an inout buffer both)."""
    _, _, spec = load(ROOT / "fixtures" / file, kernel)
    case = spec.case(size or spec.sizes[0])
    total = 0
    for b in spec.buffers:
        size = case.lengths[b.name] * DTYPES[b.dtype].size
        total += size * (2 if b.role == "inout" else 1)
    return total


# ---- at another size ----------------------------------------------------------------------------


def parse_size(items: list[str]) -> dict[str, int]:
    """`n=268435456 cols=4096` -> {"n": 268435456, "cols": 4096}."""
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name or not value.strip().isdigit():
            raise SystemExit(f"error: --size takes NAME=INTEGER, got {item!r}")
        out[name.strip()] = int(value)
    return out


def at_size(args: argparse.Namespace) -> None:
    import dataclasses

    from optiml.cuda.source import SourceFile
    from optiml.errors import OptimlError
    from optiml.executors import LocalExecutor
    from optiml.executors.base import Job
    from optiml.search.optimize import OptimizeOptions

    table = _load(args.table)
    best = table.get(args.fixture, {}).get("best_confirmed")
    if not best:
        raise SystemExit(f"error: {args.table} has no confirmed best for {args.fixture}")
    file, kernel = args.fixture.split("::")
    size = parse_size(args.size)
    source, k, spec = load(ROOT / "fixtures" / file, kernel)
    spec.case(size)  # a size the spec cannot evaluate fails here, with the spec's own message
    opts = dataclasses.replace(OptimizeOptions().confirm_eval, sizes=[size])
    job = Job(
        source,
        k,
        spec,
        candidate=SourceFile(best["kernel"], source.path),
        flags=tuple(best["flags"]),
    )
    try:
        m = Measurement.of(asyncio.run(LocalExecutor().evaluate(job, opts)))
    except OptimlError as e:  # no GPU, no nvcc: one line, not a traceback
        raise SystemExit(f"error: {e}") from None
    nbytes = bytes_moved(file, kernel, size)
    tbps = nbytes / m.candidate_ms / 1e9 if m.status == "ok" and m.candidate_ms else None
    out = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "device": _device(),
        "fixture": args.fixture,
        "size": size,
        "path": best["path"],
        "status": m.status,
        "message": m.message,
        "best_ms": m.candidate_ms,
        "input_ms": m.reference_ms,
        "bytes": nbytes,
        "tbps": tbps,
        "of_4_3_tbps": tbps / 4.3 if tbps else None,
    }
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure")
    m.add_argument("--table", type=Path, required=True)
    m.add_argument("--fixtures", nargs="*", default=None)
    m.add_argument("--depth", type=int, default=2)
    m.add_argument("--grid", type=int, default=2)
    m.add_argument("--seconds", type=float, default=1e9)
    c = sub.add_parser("compare")
    c.add_argument("--table", type=Path, required=True)
    c.add_argument("--out", type=Path, required=True)
    c.add_argument("--depth", type=int, default=2)
    c.add_argument("--grid", type=int, default=2)
    c.add_argument("--seeds", type=int, default=5)
    c.add_argument("--budgets", default="8,16,24")
    c.add_argument(
        "--baselines",
        type=Path,
        default=ROOT / "benchmarks" / "results" / "torch-baselines-h200.json",
        help="PyTorch and cuBLAS times (benchmarks/torch_baselines.py)",
    )
    a = sub.add_parser("at-size")
    a.add_argument("--table", type=Path, required=True)
    a.add_argument("--fixture", required=True, help="FILE::KERNEL, as the table names it")
    a.add_argument("--size", nargs="+", required=True, help="NAME=INTEGER for each size variable")
    a.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    {"measure": measure, "compare": compare, "at-size": at_size}[args.cmd](args)


if __name__ == "__main__":
    main()
