"""KernelBench level 1 through OptiML-G and OptiML-X, against PyTorch eager and torch.compile.

    python3 benchmarks/kernelbench.py --out DIR [--tasks DIR] [--budget 8] [--time 60]
                                      [--only 50,94] [--shard 1/4] [--steps optimize,torch]
                                      [--torch-from TABLE.json,...]

For each task: `optiml generate --from-torch` (the formula, the plain kernel, its NumPy reference),
`optiml optimize --write` on the generated file (budget and time caps from the arguments), then
the delivered kernel (the confirmed winner, else the plain kernel) timed by `optiml eval` at the
task's sizes, and the module itself timed on the GPU with the task's `get_inputs()` — eager and
`torch.compile` — with CUDA events after an L2 flush (`torch_baselines.timed`).

PyTorch runs in fp32 with TF32 off (`eager_ms`, `compile_ms`): the contract the delivered kernel
is held to (its spec's fp32 tolerance against a float64 reference; TF32's 10-bit mantissa misses it
on a convolution's long sums). PyTorch's defaults differ from that only in cuDNN's convolutions
(`torch.backends.cudnn.allow_tf32` is on by default, matmul's is off), so a task holding one is
also timed eager with the defaults (`eager_default_ms`, `speedup_vs_eager_default`): both figures
are in the table. Rows of earlier runs timed with the defaults count as such (`normalize`). Writes
DIR/kernelbench.json (rewritten after every task): one row per task (translated or the reason it
is not, each step's time or error), speedups, geometric means over the rows with both times, the
device, the date and the versions. A task that fails at any step is a row with its error; the run
goes on. `--shard i/n` (1-based) takes every n-th task from the i-th, to split the run.
`--steps` runs some of the GPU steps (`optimize` includes the delivered kernel's `optiml eval`);
`--torch-from` takes a task's PyTorch times from committed tables measured on the same GPU with
the same torch (the row says which), so that a rerun of OptiML's side need not time PyTorch again.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import math
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from optiml import __version__  # noqa: E402
from optiml.errors import OptimlError  # noqa: E402
from optiml.generate import generate  # noqa: E402
from optiml.generate.from_torch import translate  # noqa: E402
from optiml.harness.ceilings import device_ceilings  # noqa: E402
from optiml.harness.evaluate import numpy_sizes  # noqa: E402
from optiml.harness.verdict import Dependence, DeviceInfo  # noqa: E402
from optiml.harness.work import moved_bytes  # noqa: E402
from optiml.search.variant import DEFAULT_FLAGS  # noqa: E402
from optiml.spec import Spec, load  # noqa: E402

DEFAULT_TASKS = ROOT.parent / "shared" / "kernelbench" / "level1"
STEPS = ("optimize", "torch")


def shard(text: str) -> tuple[int, int]:
    m = re.fullmatch(r"(\d+)/(\d+)", text)
    if not m or not 1 <= int(m.group(1)) <= int(m.group(2)):
        raise argparse.ArgumentTypeError(f"--shard {text!r}: write i/n with 1 <= i <= n, e.g. 2/4")
    return int(m.group(1)), int(m.group(2))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="folder for kernelbench.json and files")
    p.add_argument("--tasks", type=Path, default=DEFAULT_TASKS, help="KernelBench level-1 folder")
    p.add_argument("--budget", type=int, default=8, help="evaluations optimize may spend")
    p.add_argument("--time", type=float, default=60.0, help="optimize's wall-time cap, seconds")
    p.add_argument(
        "--only", default="", help="task numbers or file names, comma-separated (e.g. 50,94)"
    )
    p.add_argument("--shard", type=shard, default=(1, 1), help="i/n: this run's share of tasks")
    p.add_argument("--eval-timeout", type=float, default=600.0, help="seconds for optiml eval")
    p.add_argument(
        "--steps",
        default=",".join(STEPS),
        help=f"the GPU steps to run, comma-separated, of {', '.join(STEPS)}",
    )
    p.add_argument(
        "--seconds",
        type=float,
        default=None,
        help="start no task after this many seconds of the run (the others are left for "
        "another run; a task cut by a step's time limit is lost, one not started is not)",
    )
    p.add_argument(
        "--torch-from",
        default="",
        help="kernelbench tables (comma-separated) whose PyTorch times are reused where their "
        "GPU and torch are this run's",
    )
    args = p.parse_args(argv)
    args.steps = [x.strip() for x in args.steps.split(",") if x.strip()]
    unknown = [x for x in args.steps if x not in STEPS]
    if unknown:
        p.error(f"--steps: no step {', '.join(unknown)}; the steps are {', '.join(STEPS)}")
    if args.budget < 1 or args.time < 1:
        p.error("--budget and --time are at least 1")
    return args


def tasks(args: argparse.Namespace) -> list[Path]:
    """The task files of this run: `--only`'s (numbers or names), then this shard's share."""
    if not args.tasks.is_dir():
        raise SystemExit(f"--tasks {args.tasks}: no such folder")
    files = sorted(args.tasks.glob("*.py"), key=lambda p: (_number(p), p.name))
    if args.only:
        wanted = [w.strip() for w in args.only.split(",") if w.strip()]
        chosen = [
            f for f in files if any(w == str(_number(f)) or w in (f.name, f.stem) for w in wanted)
        ]
        missing = [
            w
            for w in wanted
            if not any(w == str(_number(f)) or w in (f.name, f.stem) for f in files)
        ]
        if missing:
            raise SystemExit(f"--only: no task {', '.join(missing)} in {args.tasks}")
        files = chosen
    i, n = args.shard
    return files[i - 1 :: n]


def _number(path: Path) -> int:
    m = re.match(r"(\d+)_", path.name)
    return int(m.group(1)) if m else 10**9


def translate_step(path: Path, work: Path) -> dict:
    """The formula, kernel and reference of a task, written under `work`; the row's start."""
    row: dict = {"task": path.name, "number": _number(path)}
    try:
        t = translate(path.read_text(errors="replace"), path.name)
        g = generate(t.formula, t.name)
    except OptimlError as e:  # FormulaError: not covered, with its reason
        row.update(translated=False, why=str(e))
        return row
    work.mkdir(parents=True, exist_ok=True)
    cu = work / f"{t.name}.cu"
    cu.write_text(g.kernel)
    (work / f"{t.name}_ref.py").write_text(g.reference)
    row.update(
        translated=True,
        kernel=t.name,
        file=str(cu),
        formula=t.formula,
        sizes=t.sizes,
        notes=t.notes,
    )
    return row


def _optiml(args: list[str], timeout: float) -> tuple[dict | None, str]:
    """`optiml ARGS --json` in a process of its own: its JSON, or None and the error line."""
    cmd = [sys.executable, "-c", "from optiml.cli import main; main()", *args, "--json"]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout:.0f} s"
    try:
        payload = json.loads(done.stdout)
    except json.JSONDecodeError:
        payload = None
    if done.returncode == 0 and isinstance(payload, dict):
        return payload, ""
    if isinstance(payload, dict) and "error" in payload:
        return None, f"exit {done.returncode}: {payload['error']}"
    lines = (done.stderr or done.stdout).strip().splitlines()
    return None, f"exit {done.returncode}: {lines[-1] if lines else 'no output'}"


def run_optimize(row: dict, cu: Path, options: list[str], timeout: float) -> None:
    """`optiml optimize --write` of `row`'s kernel in `cu` (its folder gets the run's files):
    wall time, whether a winner was written, the outcome; or the error."""
    started = time.monotonic()
    result, error = _optiml(
        ["optimize", str(cu), "--kernel", row["kernel"], *options]
        + ["--out", str(cu.parent / "optimize"), "--write"],
        timeout=timeout,
    )
    row["optimize_s"] = round(time.monotonic() - started, 1)
    if result is None:
        row["optimize_error"] = error
        return
    row["winner"] = result.get("winner") is not None
    # nvcc flags the winner was measured with beyond the defaults (an LLM's edit may add them):
    # the delivered file is timed with them too, and the row says so
    winner = next((n for n in result.get("nodes") or [] if n.get("id") == result.get("winner")), {})
    extra = [f for f in winner.get("flags") or [] if f not in DEFAULT_FLAGS]
    if row["winner"] and extra:
        row["delivered_flags"] = extra
    row["optimize_outcome"] = result.get("outcome")
    row["search"] = search_summary(result)


def search_summary(t: dict) -> dict:
    """What the search did, from its trajectory: why it stopped, how many evaluations it
    recorded, the baseline's and each evaluated node's time split (compile, run, profile), status,
    speedup and edit with its parameters, the winner's chain of edits (which schedule won), the
    judge's checks' seconds — enough to tell a search that found nothing from one that never got
    to evaluate."""

    def split(m: dict) -> dict:
        return {k: round(m.get(k) or 0.0, 2) for k in ("compile_s", "run_s", "profile_s")}

    nodes = []
    for n in t.get("nodes", []):
        m = n.get("measurement")
        if n.get("edit") is None or m is None:
            continue
        nodes.append(
            {
                "edit": n["edit"].get("transform"),
                "params": n["edit"].get("params") or {},
                "status": m.get("status"),
                "speedup": m.get("speedup"),
                **split(m),
            }
        )
    baseline = t.get("baseline") or {}
    by_id = {n["id"]: n for n in t.get("nodes", [])}
    chain, at = [], by_id.get(t.get("winner"))
    while at is not None and at.get("edit") is not None:
        chain.insert(
            0, {"edit": at["edit"].get("transform"), "params": at["edit"].get("params") or {}}
        )
        at = by_id.get(at.get("parent"))
    return {
        "stop": t.get("stop"),
        "winner_edits": chain,  # root first: the edits the delivered kernel is made of
        "evaluations": t.get("evaluations"),
        "wall_s": t.get("wall_s"),
        "phase_s": t.get("phase_s"),
        # the input's steps, and when its measurement began and ended (of the baseline phase)
        "baseline": {
            **split(baseline),
            **{k: baseline.get(k) for k in ("started_s", "ended_s") if baseline.get(k) is not None},
        },
        "nodes": nodes,
        "rejected_before_evaluation": len(t.get("rejected") or []),
        # each of the judge's checks' seconds (where its time went)
        "judge_s": {
            c["name"]: c.get("seconds") for c in ((t.get("judge") or {}).get("checks") or [])
        },
        # confirmed candidates the judge turned down first: why, and the seconds each took
        "judge_rejected": t.get("judge_rejected") or [],
    }


def optimize_step(row: dict, args: argparse.Namespace) -> None:
    run_optimize(
        row,
        Path(row["file"]),
        ["--budget", str(args.budget), "--time", str(args.time)],
        timeout=args.time * 3 + 600,  # the search's cap, then its confirmation and judge
    )


def delivered_ms(verdict: dict) -> float | None:
    """The kernel's median time at the first size (the task's) in an `optiml eval` verdict."""
    for case in verdict.get("cases") or []:
        timing = case.get("timing") or {}
        median = (timing.get("candidate") or {}).get("median_ms")
        if median is not None:
            return float(median)
    return None


def eval_step(row: dict, args: argparse.Namespace) -> None:
    """The delivered kernel through `optiml eval`, timed at the task's sizes: against the NumPy
    reference at the sizes within its reach (`numpy_sizes`, recorded in the row), against the
    kernel as generated (itself checked there) beyond them, as the harness does for any kernel."""
    _, _, spec = load(Path(row["file"]), row["kernel"])
    sizes = numpy_sizes(spec)
    if sizes is not None:
        row["numpy_checked_at"] = sizes
    flags = [f"--nvcc-flag={f}" for f in row.get("delivered_flags") or []]
    verdict, error = _optiml(
        ["eval", row["file"], "--kernel", row["kernel"], *flags], timeout=args.eval_timeout
    )
    if verdict is None:
        row["delivered_error"] = error
        return
    row["delivered_status"] = verdict.get("status")
    # where NumPy did check it, in the verdict's words: fewer sizes than `numpy_sizes` where the
    # reference ran out of memory at one (the harness moves that size to the kernel's)
    said = re.search(
        r"checked against `[^`]+` at (.+?) \(larger sizes", verdict.get("message") or ""
    )
    if said:
        row["numpy_checked"] = said.group(1)
    if verdict.get("status") != "ok":
        row["delivered_error"] = verdict.get("message", "")
        return
    row["delivered_ms"] = delivered_ms(verdict)
    floor = memory_floor_ms(spec, verdict)
    if floor and row["delivered_ms"]:
        row["floor_ms"] = floor
        row["over_floor"] = row["delivered_ms"] / floor


def memory_floor_ms(spec: Spec, verdict: dict) -> float | None:
    """The memory-bound floor of the timed case, as `benchmarks/schedules.py` takes it: what the
    operation moves (`optiml.harness.work.moved_bytes`: every output written once, every input
    read once as far as the outputs were seen to depend on it) over the device-to-device copy
    bandwidth measured on the GPU the verdict names. Not the verdict's own floor, which leaves
    out writes that fit the L2 (a bound no honest kernel is under, not one a fast one reaches)."""
    case = next((c for c in verdict.get("cases") or [] if c.get("timing")), None)
    if case is None or not verdict.get("device"):
        return None
    ceilings = device_ceilings(DeviceInfo.model_validate(verdict["device"]))
    sizes = {c.label: c for c in spec.cases()}
    if ceilings is None or case["label"] not in sizes:
        return None
    dependence = [Dependence.model_validate(d) for d in case.get("dependence") or []]
    return moved_bytes(spec, sizes[case["label"]], dependence) / (ceilings.copy_gbs * 1e6)


PRECISION = "fp32, TF32 off"  # what eager_ms and compile_ms are measured in


def torch_step(row: dict, path: Path) -> None:
    """The module on the GPU with get_inputs() at the task's sizes: eager, then torch.compile, in
    fp32 with TF32 off; then eager with PyTorch's defaults where they differ (a convolution)."""
    import torch

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from torch_baselines import timed

    spec = importlib.util.spec_from_file_location(f"kb_{_number(path)}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.manual_seed(0)
    model = module.Model(*module.get_init_inputs()).cuda().eval()
    inputs = [x.cuda() if isinstance(x, torch.Tensor) else x for x in module.get_inputs()]
    convolves = any(isinstance(m, torch.nn.modules.conv._ConvNd) for m in model.modules())
    flags = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    row["torch_precision"] = PRECISION
    try:
        with torch.no_grad():
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
            for label, fn in (("eager", model), ("compile", None)):
                try:
                    if fn is None:
                        fn = torch.compile(model)
                        fn(*inputs)  # compiles
                    row[f"{label}_ms"] = timed(lambda fn=fn, xs=inputs: fn(*xs))
                except Exception as e:  # a task torch cannot run here is a row with its error
                    row[f"{label}_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
            if convolves and "eager_ms" in row:
                torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = (
                    DEFAULT_TF32
                )
                row["eager_default_ms"] = timed(lambda m=model, xs=inputs: m(*xs))
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = flags
    del model, inputs
    torch.cuda.empty_cache()


# PyTorch's defaults (matmul's TF32 off since 1.12, cuDNN's on)
DEFAULT_TF32 = (False, True)


def normalize(row: dict) -> dict:
    """A row of a run before PyTorch was timed with TF32 off: its eager time is the defaults',
    which for a convolution (KernelBench names its convolution tasks so) is cuDNN with TF32, not
    the fp32 this table compares with; elsewhere the defaults are fp32. Rows of later runs as they
    are."""
    if "torch_precision" in row or not any(k in row for k in ("eager_ms", "compile_ms")):
        return row
    row = dict(row)
    if "conv" in row["task"].lower():
        if "eager_ms" in row:
            row["eager_default_ms"] = row.pop("eager_ms")
        row.pop("compile_ms", None)  # inductor's convolutions are cuDNN's, with its TF32
        row["torch_precision"] = "PyTorch's defaults (cuDNN TF32)"
    else:
        row["torch_precision"] = PRECISION + " (PyTorch's defaults: no cuDNN convolution)"
    for k in [k for k in row if k.startswith("speedup_vs_")]:
        del row[k]
    speedups(row)
    return row


def torch_times(tables: list[Path]) -> dict[tuple[str, str | None, str | None], dict]:
    """PyTorch's times in committed tables, by (task, GPU, torch version): the eager and
    torch.compile times (or errors) of each row that has them, and the table and date they are
    from."""
    out: dict[tuple[str, str | None, str | None], dict] = {}
    for path in tables:
        try:
            table = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise SystemExit(f"--torch-from {path}: {e}") from None
        for row in table.get("rows", []):
            row = normalize(row)
            times = {k: row[k] for k in TORCH_FIELDS if k in row}
            if times:
                key = (row["task"], _of_runs(table, "device"), _of_runs(table, "torch"))
                date = table.get("date") or max(
                    (r.get("date") or "" for r in table.get("runs") or []), default=None
                )
                out[key] = {**times, "torch_from": f"{path.name} ({date})"}
    return out


TORCH_FIELDS = (
    "eager_ms",
    "compile_ms",
    "eager_default_ms",
    "eager_error",
    "compile_error",
    "torch_precision",
)


def _of_runs(table: dict, key: str):
    """A run's `key` (device, torch), or a merged table's (`generated_table.py`) where all
    its runs agree on it; None where they do not."""
    if table.get(key) is not None:
        return table[key]
    values = {r.get(key) for r in table.get("runs") or []}
    return values.pop() if len(values) == 1 else None


def reuse_torch(row: dict, earlier: dict, table: dict) -> bool:
    """Whether `row` got its PyTorch times from `earlier` (`torch_times`): only from a table of
    the same GPU and torch as this run's."""
    found = earlier.get((row["task"], table.get("device"), table.get("torch")))
    if found is None or table.get("device") is None or "eager_ms" not in found:
        return False  # (a convolution timed only with the defaults is timed again)
    row.update(found)
    return True


def speedups(row: dict) -> None:
    d = row.get("delivered_ms")
    for base in ("eager", "compile", "eager_default"):
        b = row.get(f"{base}_ms")
        if d and b:
            row[f"speedup_vs_{base}"] = b / d


def geomean(values: list[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def summary(rows: list[dict]) -> dict:
    out = {"tasks": len(rows), "translated": sum(1 for r in rows if r.get("translated"))}
    for base in ("eager", "compile"):
        vals = [r[f"speedup_vs_{base}"] for r in rows if f"speedup_vs_{base}" in r]
        out[f"geomean_speedup_vs_{base}"] = geomean(vals)
        out[f"rows_vs_{base}"] = len(vals)
    # against eager as PyTorch runs by default: the defaults' time where it differs (a
    # convolution, cuDNN with TF32), else the fp32 one, which is the defaults' there
    vals = [
        r.get("speedup_vs_eager_default", r.get("speedup_vs_eager"))
        for r in rows
        if "speedup_vs_eager_default" in r or "speedup_vs_eager" in r
    ]
    out["geomean_speedup_vs_eager_defaults"] = geomean(vals)
    out["rows_vs_eager_defaults"] = len(vals)
    return out


def environment() -> dict:
    env = {"date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "optiml": __version__}
    env["commit"] = commit()
    env["python"] = platform.python_version()
    try:
        import torch

        env["torch"] = torch.__version__
        env["cuda"] = torch.version.cuda
        if torch.cuda.is_available():
            env["device"] = torch.cuda.get_device_name(0)
    except ImportError:
        env["torch"] = None
    try:
        nvcc = subprocess.run(["nvcc", "--version"], capture_output=True, text=True, timeout=30)
        env["nvcc"] = nvcc.stdout.strip().splitlines()[-1] if nvcc.stdout else None
    except (OSError, subprocess.TimeoutExpired):
        env["nvcc"] = None
    return env


def commit() -> str | None:
    """The commit the tree is at: OPTIML_COMMIT where the tree was copied without its history
    (a GPU machine), else git's."""
    if os.environ.get("OPTIML_COMMIT"):
        return os.environ["OPTIML_COMMIT"]
    try:
        out = subprocess.run(
            ["git", "-C", str(Path(__file__).parent), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


def run(args: argparse.Namespace, gpu: bool = True) -> dict:
    """Every task of this run; `gpu=False` stops after the translation (for checks without one)."""
    args.out.mkdir(parents=True, exist_ok=True)
    table = {
        **environment(),
        "args": {
            "budget": args.budget,
            "time": args.time,
            "only": args.only,
            "shard": "/".join(map(str, args.shard)),
            "tasks": str(args.tasks),
            "steps": list(args.steps),
        },
        "torch_precision": PRECISION,
        "rows": [],
    }
    name = (
        "kernelbench.json"
        if args.shard == (1, 1)
        else f"kernelbench-{args.shard[0]}-of-{args.shard[1]}.json"
    )
    target = args.out / name
    save(table, target, summary)
    earlier = torch_times([Path(f) for f in args.torch_from.split(",") if f.strip()])
    started = time.monotonic()
    for path in tasks(args):
        if args.seconds is not None and time.monotonic() - started >= args.seconds:
            table.setdefault("not_started", []).append(path.name)
            save(table, target, summary)
            continue
        row: dict = {"task": path.name, "number": _number(path), "steps": list(args.steps)}
        try:
            row.update(translate_step(path, args.out / "work" / path.stem))
            if row["translated"] and gpu:
                if "optimize" in args.steps:
                    optimize_step(row, args)
                    eval_step(row, args)
                if "torch" in args.steps and not reuse_torch(row, earlier, table):
                    torch_step(row, path)
                speedups(row)
        except Exception as e:  # never a crash: the row says what went wrong
            row["error"] = failure(e)
        table["rows"].append(row)
        save(table, target, summary)
    return table


def failure(e: Exception) -> str:
    """A step's exception as a row's `error`: its type and first line."""
    first = str(e).splitlines()[0][:300] if str(e) else ""
    return f"{type(e).__name__}: {first}"


def save(table: dict, target: Path, summarize) -> None:
    """The table with its summary of the rows so far, written (after every row: a run cut short
    keeps what it measured)."""
    table["summary"] = summarize(table["rows"])
    target.write_text(json.dumps(table, indent=2))


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    table = run(args)
    s = table["summary"]
    print(
        f"{s['translated']} of {s['tasks']} translated; geometric mean speedup "
        f"{s['geomean_speedup_vs_eager']} vs eager ({s['rows_vs_eager']} tasks), "
        f"{s['geomean_speedup_vs_compile']} vs torch.compile ({s['rows_vs_compile']} tasks)"
    )


if __name__ == "__main__":
    main()
