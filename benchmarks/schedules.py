"""On a GPU: what the catalog's rewrites are worth on kernels it was not written against. For every
kernel of the given sets, every rewrite the catalog proposes (up to --per-transform parameter
choices each, the ones its own weights rank first) is evaluated against the kernel as written by the
harness — checked at every declared size and seed, timed at the first (largest) size — and the
first size's memory-bound floor (every input read and every output written once, over the
device-to-device copy bandwidth measured on it) is kept with the harness's own floor (the least
traffic the outputs were seen to depend on over the best bandwidth: a bound, not a target).
For fixtures/corpus, the kernel's PyTorch equivalent (fixtures/corpus/torch_equivalents.py) is
timed on the same inputs the same way (CUDA events, an L2 flush before each call, TF32 off).

    python3 benchmarks/schedules.py --out DIR [--sets corpus,holdout,wild] [--per-transform 2]
        [--only KERNEL ...] [--shard i/n] [--seconds S] [--files FILE.cu ...]
        [--transforms window_tile,...]

--files measures the given files' kernels (each one that has a spec) instead of the sets: kernels
written elsewhere, such as `optiml generate --from-torch`'s of KernelBench's tasks.

Writes DIR/schedules.json after every kernel (a run cut short keeps what it measured): per kernel
the original's time and floor, PyTorch's time where there is an equivalent, and per proposal its
verdict, time and speedup; and a summary per set: kernels with a correct rewrite, with one ≥ 1.2×,
the geometric mean of the best correct speedup, of the kept kernel's time over the memory-bound
floor (memory-bound kernels: all but matrix-matrix contractions) and how many are within 1.3× of
it, and on the corpus
the geometric mean of (best time / PyTorch time). Light touches (qualifiers, launch bounds,
unrolling, block size) are left out: they are the search's refinements, not schedules.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import functools
import importlib.util
import json
import math
import platform
import subprocess
import sys
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from kernelbench import commit  # noqa: E402

from optiml import __version__  # noqa: E402
from optiml.errors import OptimlError  # noqa: E402
from optiml.executors import LocalExecutor  # noqa: E402
from optiml.executors.base import Job  # noqa: E402
from optiml.harness.evaluate import EvalOptions  # noqa: E402
from optiml.harness.work import moved_bytes  # noqa: E402
from optiml.search.catalog import CATALOG, Context  # noqa: E402
from optiml.search.priors import family_of  # noqa: E402
from optiml.search.variant import Variant  # noqa: E402
from optiml.spec import load  # noqa: E402

SETS = {
    "corpus": ("fixtures/corpus", "kernel"),
    "holdout": ("fixtures/holdout", "kernel"),
    "wild": ("fixtures/wild", "fixture"),
}
GAIN = 1.2  # a rewrite that counts as a real gain


def kernels(sets: list[str]) -> list[dict]:
    out = []
    for name in sets:
        folder, table = SETS[name]
        for e in tomllib.loads((ROOT / folder / "manifest.toml").read_text())[table]:
            out.append({"set": name, "path": ROOT / folder / e["file"], **e})
    return out


def file_kernels(files: list[Path]) -> list[dict]:
    """Each file's kernels that have a spec, as entries of the set "files"."""
    from optiml.cuda.source import SourceFile

    out = []
    for path in files:
        source = SourceFile(path.read_text(), str(path))
        for k in source.kernels:
            if k.spec_comment is not None:
                out.append({"set": "files", "path": path.resolve(), "kernel": k.name})
    return out


def shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def proposals(path: Path, kernel: str, per_transform: int) -> list:
    ctx = Context.of(Variant(path.read_text()), str(path), kernel)
    out = []
    for name, t in sorted(CATALOG.items()):
        if t.gain < 1.0:
            continue
        try:
            found = list(t.propose(ctx))
        except Exception as e:  # a transformation that breaks on a kernel is a finding, not a stop
            out.append((name, {"error": f"{type(e).__name__}: {e}"}))
            continue
        # the ones the search would try first: the transformation's own weights, highest first
        ranked = sorted(found, key=lambda p: -p.weight)
        out += [(name, p) for p in ranked[:per_transform]]
    return out


def family(source, kernel) -> str:
    """The family the lifting reads the kernel as ("opaque" where it cannot), as the policy does."""
    return family_of(source.text, source.path, kernel.name) or "opaque"


def memory_bound(row: dict) -> bool:
    """A kernel whose floor is its memory traffic: all but matrix-matrix contractions (and the
    stencils, pools and convolutions that contract a window, which the lifting reads as such)."""
    return not row["family"].startswith("contraction (matrix-matrix)")


def first_case(verdict, spec) -> dict:
    """The timed case's candidate and reference medians, in ms, and two floors: the harness's
    (the least DRAM traffic the outputs were seen to depend on, writes that fit the L2 left
    out, over the best bandwidth the device could have: a bound no honest kernel is under) and
    the memory-bound one (`moved_bytes` over the device-to-device copy bandwidth measured on
    it: what a kernel bound by memory reaches at best)."""
    from optiml.harness.ceilings import device_ceilings

    ceilings = device_ceilings(verdict.device) if verdict.device else None
    cases = {c.label: c for c in spec.cases()}
    for c in verdict.cases:
        if c.timing is not None:
            moved = moved_bytes(spec, cases[c.label], c.dependence) if c.label in cases else None
            return {
                "case": c.label,
                "ms": c.timing.candidate.median_ms,
                "original_ms": c.timing.reference.median_ms if c.timing.reference else None,
                "harness_floor_ms": c.floor.ms if c.floor else None,
                "moved_bytes": moved,
                "floor_ms": moved / (ceilings.copy_gbs * 1e6) if moved and ceilings else None,
            }
    return {}


@functools.cache
def _torch_equivalents():
    """fixtures/corpus/torch_equivalents.py, loaded once."""
    path = ROOT / "fixtures" / "corpus" / "torch_equivalents.py"
    mod_spec = importlib.util.spec_from_file_location("corpus_torch", path)
    module = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(module)
    return module


def torch_ms(entry: dict, spec) -> float | None:
    """The PyTorch equivalent's median time at the spec's first size, on the harness's inputs."""
    if entry["set"] != "corpus" or not entry.get("torch"):
        return None
    import numpy as np
    import torch
    from torch_baselines import timed

    from optiml.cuda.types import DTYPES
    from optiml.harness import inputs
    from optiml.harness.evaluate import default_dist

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    fn = getattr(_torch_equivalents(), entry["torch"])
    case = spec.cases()[0]
    arrays = {}
    for bi, b in enumerate(spec.buffers):
        n = case.lengths[b.name]
        if b.role == "out":
            arr = np.zeros(n, dtype=DTYPES[b.dtype].np_dtype())
        else:
            dist = default_dist(spec, case, b.name)
            arr = inputs.generate(
                b.dtype, bi, n, 1, dist.lo, dist.hi, inputs.Mode(dist.mode), dist.extra
            )
        t = torch.from_numpy(arr.view(np.int16) if b.dtype == "bf16" else arr).cuda()
        arrays[b.name] = t.view(torch.bfloat16) if b.dtype == "bf16" else t
    args = [arrays[p] if p in arrays else case.scalars[p] for p in spec.params]
    return timed(lambda: fn(*args), reps=30)


async def measure(entry: dict, args, ex: LocalExecutor) -> dict:
    path, name = entry["path"], entry["kernel"]
    source, kernel, spec = load(path, name)
    row: dict = {
        "set": entry["set"],
        "file": shown(path),
        "kernel": name,
        "family": family(source, kernel),
    }
    opts = EvalOptions(time_all_sizes=False, target_ms=150.0, reps_max=100, timeout_s=240)
    found = proposals(path, name, args.per_transform)
    if args.transforms:
        found = [(t, p) for t, p in found if t in args.transforms]

    async def one(transform: str, p) -> dict:
        if isinstance(p, dict):
            return {"transform": transform, "status": "proposal-error", "message": p["error"]}
        job = Job.of_variant(source, kernel, spec, p.variant)
        try:
            v = await ex.evaluate(job, opts)
        except OptimlError as e:
            return {
                "transform": transform,
                "params": p.params,
                "status": "error",
                "message": str(e),
            }
        return {
            "transform": transform,
            "params": p.params,
            "status": v.status,
            "message": v.message[:300],
            "speedup": v.speedup,
            **first_case(v, spec),
        }

    row["proposals"] = list(await asyncio.gather(*(one(t, p) for t, p in found)))
    ok = [p for p in row["proposals"] if p["status"] == "ok" and p.get("speedup")]
    timed_any = next((p for p in row["proposals"] if p.get("original_ms")), None)
    if timed_any is None:  # nothing proposed (or nothing ran): the kernel as written, timed alone
        v = await ex.evaluate(Job(source, kernel, spec), opts)
        alone = first_case(v, spec)
        timed_any = {**alone, "original_ms": alone.get("ms")}
    row["original_ms"] = timed_any["original_ms"]
    row["floor_ms"] = timed_any.get("floor_ms")
    row["moved_bytes"] = timed_any.get("moved_bytes")
    best = max(ok, key=lambda p: p["speedup"], default=None)
    row["best"] = (
        {k: best.get(k) for k in ("transform", "params", "speedup", "ms")} if best else None
    )
    try:
        row["torch_ms"] = torch_ms(entry, spec)
    except Exception as e:  # the comparison is a measurement; a failure is recorded, not fatal
        row["torch_ms"], row["torch_error"] = None, f"{type(e).__name__}: {e}"[:300]
    return row


def geomean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def summary(rows: list[dict]) -> dict:
    out = {}
    for name in dict.fromkeys(r["set"] for r in rows):
        rs = [r for r in rows if r["set"] == name]
        proposed = [r for r in rs if r["proposals"]]
        best = [r for r in rs if r["best"]]

        def kept_ms(r: dict) -> float | None:  # the kernel as delivered: the best, else as written
            return r["best"]["ms"] if r["best"] else r["original_ms"]

        floors = [
            kept_ms(r) / r["floor_ms"]
            for r in rs
            if r.get("floor_ms") and kept_ms(r) and memory_bound(r)
        ]
        torch_ratio = [kept_ms(r) / r["torch_ms"] for r in rs if r.get("torch_ms") and kept_ms(r)]
        out[name] = {
            "kernels": len(rs),
            "with_a_proposal": len(proposed),
            "proposals": sum(len(r["proposals"]) for r in rs),
            "proposals_ok": sum(p["status"] == "ok" for r in rs for p in r["proposals"]),
            "proposals_wrong": [
                f"{r['kernel']}: {p['transform']} {p.get('params')}: {p['status']}"
                for r in rs
                for p in r["proposals"]
                if p["status"] != "ok"
            ],
            "with_a_correct_rewrite": len(best),
            f"with_a_gain_of_{GAIN}": sum(r["best"]["speedup"] >= GAIN for r in best),
            "geomean_best_speedup": geomean([r["best"]["speedup"] for r in best]),
            # memory-bound kernels: the kept one's time over the memory-bound floor
            "geomean_kept_over_floor": geomean(floors),
            "within_1.3_of_floor": sum(f <= 1.3 for f in floors),
            "memory_bound_with_a_floor": len(floors),
            "geomean_kept_over_torch": geomean(torch_ratio),
            "with_torch": len(torch_ratio),
        }
    return out


def environment() -> dict:
    def tool(cmd: list[str]) -> str | None:
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return None

    gpu = tool(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"])
    nvcc = tool(["nvcc", "--version"]) or ""
    try:
        import torch

        torch_version = torch.__version__
    except ImportError:
        torch_version = None
    return {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "optiml": __version__,
        "commit": commit(),
        "gpu": gpu.splitlines()[0] if gpu else None,
        "nvcc": nvcc.splitlines()[-1] if nvcc else None,
        "torch": torch_version,
        "python": platform.python_version(),
    }


async def main(args) -> dict:
    entries = file_kernels(args.files) if args.files else kernels(args.sets)
    if args.only:
        entries = [e for e in entries if e["kernel"] in args.only]
    i, n = args.shard
    entries = entries[i - 1 :: n]
    report = {**environment(), "per_transform": args.per_transform, "rows": []}
    out = args.out / "schedules.json"
    args.out.mkdir(parents=True, exist_ok=True)
    ex = LocalExecutor()
    start = time.monotonic()
    try:
        for entry in entries:
            if args.seconds and time.monotonic() - start > args.seconds:
                report["cut_short"] = f"stopped after {args.seconds} s"
                break
            row = await measure(entry, args, ex)
            report["rows"].append(row)
            report["summary"] = summary(report["rows"])
            out.write_text(json.dumps(report, indent=1, default=str))
            b = row["best"]
            print(
                f"{row['set']:8} {row['kernel']:32} {len(row['proposals']):3} proposals, "
                + (f"best {b['transform']} {b['speedup']:.2f}x" if b else "no correct rewrite")
                + (f", torch {row['torch_ms']:.4f} ms" if row.get("torch_ms") else ""),
                flush=True,
            )
    finally:
        await ex.close()
    print(json.dumps(report.get("summary", {}), indent=1))
    return report


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--sets", default="corpus,holdout,wild")
    p.add_argument("--per-transform", type=int, default=2)
    p.add_argument("--only", nargs="*")
    p.add_argument("--shard", default="1/1")
    p.add_argument("--seconds", type=float, default=0.0, help="stop starting kernels after this")
    p.add_argument("--files", nargs="*", type=Path, help="these files' kernels, not the sets'")
    p.add_argument(
        "--transforms", default="", help="only these transformations' rewrites (comma-separated)"
    )
    args = p.parse_args(argv)
    args.sets = [s for s in args.sets.split(",") if s]
    args.transforms = [t for t in args.transforms.split(",") if t]
    unknown = [t for t in args.transforms if t not in CATALOG]
    if unknown:
        p.error(f"--transforms: no transformation {unknown[0]} (known: {', '.join(CATALOG)})")
    bad = [s for s in args.sets if s not in SETS]
    if bad:
        p.error(f"--sets: unknown set {bad[0]} (known: {', '.join(SETS)})")
    i, _, n = args.shard.partition("/")
    args.shard = (int(i), int(n))
    return args


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "benchmarks"))
    asyncio.run(main(parse_args()))
