"""One evaluation of a candidate against its reference: compile both (in parallel, cached), write a
plan, run the runner in its own process under a wall-clock limit, and turn what comes back — or
the lack of it — into a `Verdict`.
"""

from __future__ import annotations

import datetime as dt
import importlib.util
import json
import os
import signal
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from optiml.cuda.source import Kernel, SourceFile
from optiml.cuda.types import DTYPES
from optiml.errors import ExitCode, OptimlError
from optiml.harness import inputs
from optiml.harness.build import DEFAULT_FLAGS, Build, build_kernel, runner_binary
from optiml.harness.gpu import default_arch
from optiml.harness.nvcc import CompilerMessage, find_toolkit
from optiml.harness.verdict import CaseResult, DeviceInfo, Verdict
from optiml.spec import Case, Spec, parse_spec

DEFAULT_SEEDS = (1, 2, 3, 4, 5, 6, 7, 8)


class ReferenceFailed(OptimlError):
    """The spec's NumPy reference could not produce the expected outputs."""

    exit_code = ExitCode.BAD_SPEC


@dataclass
class EvalOptions:
    arch: str | None = None  # None: the spec's `arch`, else the local GPU's, else sm_90
    flags: tuple[str, ...] = DEFAULT_FLAGS
    candidate_flags: tuple[str, ...] | None = None  # the candidate's own (e.g. -use_fast_math)
    timeout_s: float = 60.0
    time: bool = True  # time the kernels, not only check them
    time_all_sizes: bool = True  # False: time the first size only (the others are only checked)
    seeds: tuple[int, ...] | None = None  # None: the spec's count of DEFAULT_SEEDS
    sizes: list[dict[str, int]] | None = None  # None: the spec's sizes
    reps_min: int = 20
    reps_max: int = 200
    target_ms: float = 400.0
    warmup_max: int = 30
    flush_factor: float = 2.0
    max_mismatches: int = 10
    workdir: Path | None = None
    env: dict[str, str] = field(default_factory=dict)  # e.g. CUDA_VISIBLE_DEVICES for a worker


@dataclass
class Target:
    """A kernel to compile: which file, which kernel in it."""

    source: SourceFile
    kernel: Kernel


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def evaluate(
    source: SourceFile,
    kernel: Kernel,
    spec: Spec,
    candidate: SourceFile | None = None,
    options: EvalOptions | None = None,
) -> Verdict:
    """Check `candidate`'s version of `kernel` (the kernel itself when there is no candidate)
    against the spec's reference, at every size with every seed, and time both."""
    opts = options or EvalOptions()
    opts = replace(opts, arch=opts.arch or spec.arch or default_arch())
    start = time.perf_counter()
    tk = find_toolkit()
    cand_source = candidate or source
    cand_kernel = cand_source.kernel(kernel.name)
    ref = spec.reference
    if ref.kind == "self":
        reference: Target | None = Target(source, kernel)
        ref_label = f"{kernel.name} in {source.path}"
    elif ref.kind == "kernel":
        reference = Target(source, source.kernel(ref.kernel or ""))
        ref_label = f"{reference.kernel.name} in {source.path}"
    else:
        reference = None
        ref_label = f"{ref.function} in {ref.path}"

    base = dict(
        file=source.path,
        kernel=kernel.name,
        candidate_file=candidate.path if candidate else None,
        reference=ref_label,
        arch=opts.arch,
        nvcc_version=tk.version,
        date=_now(),
    )
    # Same types and pointer depths; `const` and `__restrict__` on a pointee may be added or dropped
    # (a call through the original signature stays valid).
    if [(p.type_text, p.pointer_depth) for p in cand_kernel.params] != [
        (p.type_text, p.pointer_depth) for p in kernel.params
    ]:
        sig = ", ".join(p.declared for p in kernel.params)
        return Verdict(
            status="compile_error",
            message=f"the candidate's `{kernel.name}` must keep the parameters ({sig})",
            wall_s=time.perf_counter() - start,
            **base,
        )

    cand_spec = candidate_spec(spec, cand_source, cand_kernel) if candidate is not None else spec
    same = reference is not None and reference.kernel is kernel and candidate is None
    with ThreadPoolExecutor(max_workers=3) as pool:
        runner_f = pool.submit(runner_binary)
        cand_f = pool.submit(
            _build, Target(cand_source, cand_kernel), cand_spec, opts, opts.candidate_flags
        )
        ref_f = pool.submit(_build, reference, spec, opts) if reference and not same else None
        cand_build = cand_f.result()
        ref_build = ref_f.result() if ref_f else (cand_build if same else None)
        runner = runner_f.result()
    compile_s = time.perf_counter() - start

    if ref_build is not None and not ref_build.ok and not same:
        return Verdict(
            status="compile_error",
            message=f"the reference does not compile: {_first_error(ref_build.messages)}",
            messages=ref_build.messages,
            compile_s=compile_s,
            wall_s=time.perf_counter() - start,
            **base,
        )
    if not cand_build.ok:
        return Verdict(
            status="compile_error",
            message=_first_error(cand_build.messages),
            messages=cand_build.messages,
            compile_s=compile_s,
            wall_s=time.perf_counter() - start,
            **base,
        )

    seeds = opts.seeds or DEFAULT_SEEDS[: spec.seeds]
    sizes = opts.sizes or spec.sizes
    cases = [spec.case(s) for s in sizes]
    cand_cases = [cand_spec.case(s) for s in sizes] if cand_spec is not spec else None
    with tempfile.TemporaryDirectory(prefix="optiml-eval-", dir=opts.workdir) as tmp:
        work = Path(tmp)
        expected = _numpy_expected(spec, cases, seeds, work) if reference is None else None
        plan = work / "plan.txt"
        plan.write_text(write_plan(spec, cases, seeds, opts, expected, cand_cases))
        result_path = work / "result.json"
        run_start = time.perf_counter()
        outcome = _run_isolated(
            [
                str(runner),
                str(plan),
                str(result_path),
                str(ref_build.path) if ref_build else "-",
                str(cand_build.path),
            ],
            opts,
            work,
        )
        run_s = time.perf_counter() - run_start
        tolerances = {b.name: spec.tolerance(DTYPES[b.dtype]) for b in spec.buffers}
        verdict = _verdict_of(outcome, result_path, cases, base, opts, tolerances)
    verdict.messages = cand_build.messages
    verdict.compile_s = compile_s
    verdict.run_s = run_s
    verdict.wall_s = time.perf_counter() - start
    return verdict


def _build(
    target: Target, spec: Spec, opts: EvalOptions, flags: tuple[str, ...] | None = None
) -> Build:
    return build_kernel(
        target.source,
        target.kernel,
        instantiation=spec.instantiation,
        arch=opts.arch,
        flags=flags if flags is not None else opts.flags,
    )


def candidate_spec(spec: Spec, candidate: SourceFile, kernel: Kernel) -> Spec:
    """The spec a candidate runs under: a candidate with a spec comment of its own brings its launch
    configuration and instantiation; the contract — arguments, sizes, tolerances, reference —
    stays the original's."""
    if kernel.spec_comment is None:
        return spec
    own = parse_spec(candidate, kernel)
    return spec.model_copy(
        update={
            "launch": own.launch,
            "template": own.template,
            "template_values": own.template_values,
        }
    )


def build_candidate(
    source: SourceFile, kernel: Kernel, spec: Spec, candidate: SourceFile, opts: EvalOptions
) -> Build:
    """Compile a candidate as `evaluate` will (its own spec's instantiation, its flags), so that a
    caller can compile on the CPU while a GPU is busy; `evaluate` then finds it in the cache."""
    cand_kernel = candidate.kernel(kernel.name)
    cand_spec = candidate_spec(spec, candidate, cand_kernel)
    arch = opts.arch or spec.arch or default_arch()
    return _build(
        Target(candidate, cand_kernel), cand_spec, replace(opts, arch=arch), opts.candidate_flags
    )


def _first_error(messages: list[CompilerMessage]) -> str:
    m = next((m for m in messages if m.severity == "error"), None)
    return str(m) if m else "nvcc failed"


# ---- the plan ----------------------------------------------------------------------------------


def _fmt(value: float | int) -> str:
    return str(value) if isinstance(value, int) else repr(float(value))


def write_plan(
    spec: Spec,
    cases: list[Case],
    seeds: tuple[int, ...],
    opts: EvalOptions,
    expected: dict[tuple[int, int, str], Path] | None = None,
    candidate_cases: list[Case] | None = None,
    *,
    profile_only: bool = False,
) -> str:
    """The runner's plan: buffers, how parameters map to them, and every case fully evaluated.
    `profile_only`: the runner launches the candidate once and checks nothing (for a profiler)."""
    lines = [
        "seeds " + " ".join(str(s) for s in seeds),
        f"timing {opts.reps_min} {opts.reps_max} {opts.target_ms} {opts.warmup_max} {opts.flush_factor}",
        f"max_mismatches {opts.max_mismatches}",
    ]
    if expected is not None:
        lines.append("numpy_reference")
    if profile_only:
        lines.append("profile_only")
    index = {b.name: i for i, b in enumerate(spec.buffers)}
    for b in spec.buffers:
        rtol, atol = spec.tolerance(DTYPES[b.dtype])
        lines.append(f"buffer {b.name} {b.role} {b.dtype} {rtol!r} {atol!r}")
    scalar_types = {s.name: s.dtype for s in spec.scalars}
    for name in spec.params:
        lines.append(
            f"param buffer {index[name]}" if name in index else f"param scalar {scalar_types[name]}"
        )
    for ci, c in enumerate(cases):
        lines.append(f"case {c.label}")
        g, b = c.grid, c.block
        timed = opts.time and (opts.time_all_sizes or ci == 0)
        lines.append(f"launch {g[0]} {g[1]} {g[2]} {b[0]} {b[1]} {b[2]} {c.smem} {int(timed)}")
        if candidate_cases is not None:
            cc = candidate_cases[ci]
            g, b = cc.grid, cc.block
            lines.append(f"candidate_launch {g[0]} {g[1]} {g[2]} {b[0]} {b[1]} {b[2]} {cc.smem}")
        for buf in spec.buffers:
            d = DTYPES[buf.dtype]
            lo, hi = c.ranges.get(buf.name, (d.low, d.high))
            lines.append(f"length {c.lengths[buf.name]} {_fmt(lo)} {_fmt(hi)}")
        for name in spec.params:
            if name in index:
                lines.append("scalar -")
            else:
                value = c.scalars[name]
                if DTYPES[scalar_types[name]].is_float:
                    value = float(value)
                elif not isinstance(value, int):
                    value = int(value)
                lines.append(f"scalar {_fmt(value)}")
        if expected is not None:
            for seed in seeds:
                for buf in spec.buffers:
                    path = expected.get((ci, seed, buf.name))
                    lines.append(f"expected {path if path else '-'}")
    return "\n".join(lines) + "\n"


def launch_once(
    spec: Spec, case: Case, arch: str, kernel: Path, work: Path, *, seed: int = 1
) -> list[str]:
    """The runner's command that launches `kernel` (a built shared object) once at `case` on
    `seed`'s inputs and checks nothing: what a profiler or a sanitizer watches. The plan is
    written into `work`, and the runner saves its result there."""
    plan = work / "plan.txt"
    plan.write_text(
        write_plan(spec, [case], (seed,), EvalOptions(arch=arch, time=False), profile_only=True)
    )
    return [str(runner_binary()), str(plan), str(work / "result.json"), str(kernel), str(kernel)]


def _numpy_expected(
    spec: Spec, cases: list[Case], seeds: tuple[int, ...], work: Path
) -> dict[tuple[int, int, str], Path]:
    """Run the spec's NumPy reference on the runner's own inputs; write its outputs for the runner."""
    ref = spec.reference
    module_spec = importlib.util.spec_from_file_location("optiml_reference", ref.path)
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except Exception as e:  # the user's reference: say where it broke, as one line
        raise ReferenceFailed(
            f"the NumPy reference {ref.path} does not load: {type(e).__name__}: {e}"
        ) from None
    fn = getattr(module, ref.function, None)
    if fn is None:
        raise ReferenceFailed(f"{ref.path} has no function `{ref.function}`")
    out: dict[tuple[int, int, str], Path] = {}
    for ci, c in enumerate(cases):
        for seed in seeds:
            arrays: dict[str, np.ndarray] = {}
            for bi, b in enumerate(spec.buffers):
                d = DTYPES[b.dtype]
                n = c.lengths[b.name]
                if b.role == "out":
                    arr = np.zeros(n, dtype=np.float32 if b.dtype == "bf16" else d.np_dtype())
                else:
                    lo, hi = c.ranges.get(b.name, (d.low, d.high))
                    arr = inputs.generate(b.dtype, bi, n, seed, lo, hi)
                    if b.dtype == "bf16":
                        arr = (arr.astype(np.uint32) << 16).view(np.float32)
                arrays[b.name] = arr
            args = [arrays[p] if p in arrays else c.scalars[p] for p in spec.params]
            try:
                returned = fn(*args)
            except Exception as e:
                raise ReferenceFailed(
                    f"the NumPy reference `{ref.function}` failed at {c.label}, seed {seed}: {type(e).__name__}: {e}"
                ) from None
            outputs = [b for b in spec.buffers if b.role != "in"]
            if returned is not None:
                values = returned if isinstance(returned, tuple) else (returned,)
                for b, v in zip(outputs, values, strict=False):
                    arrays[b.name] = np.asarray(v).reshape(-1)
            for b in outputs:
                d = DTYPES[b.dtype]
                arr = np.asarray(arrays[b.name]).reshape(-1)
                data = (
                    inputs._float_to_bf16_bits(arr)
                    if b.dtype == "bf16"
                    else arr.astype(d.np_dtype())
                )
                path = work / f"expected-{ci}-{seed}-{b.name}.bin"
                data.tofile(path)
                out[(ci, seed, b.name)] = path
    return out


# ---- running in isolation ----------------------------------------------------------------------


@dataclass
class _Outcome:
    returncode: int | None  # None: killed at the time limit
    stderr: str
    stdout: str
    seconds: float


def _run_isolated(cmd: list[str], opts: EvalOptions, work: Path) -> _Outcome:
    """Run in a new session so that a hung kernel's process (and anything it started) can be
    killed as a group at the limit; output goes to files so a chatty kernel cannot block us."""
    out_path, err_path = work / "stdout.txt", work / "stderr.txt"
    env = {**os.environ, **opts.env}
    start = time.perf_counter()
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=err, start_new_session=True, env=env, cwd=work
        )
        try:
            rc: int | None = proc.wait(timeout=opts.timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = None
    return _Outcome(rc, _tail(err_path), _tail(out_path), time.perf_counter() - start)


def _tail(path: Path, limit: int = 4000) -> str:
    data = path.read_bytes()
    return data[-limit:].decode("utf-8", errors="replace")


def _verdict_of(
    outcome: _Outcome,
    result_path: Path,
    cases: list[Case],
    base: dict,
    opts: EvalOptions,
    tolerances: dict[str, tuple[float, float]] | None = None,
) -> Verdict:
    phases = [line[6:] for line in outcome.stderr.splitlines() if line.startswith("phase ")]
    where = _describe_phase(phases[-1], cases) if phases else "before the first kernel ran"
    log_tail = "\n".join(
        line
        for line in (outcome.stdout + outcome.stderr).splitlines()
        if not line.startswith("phase ")
    )[-2000:]
    if outcome.returncode is None:
        return Verdict(
            status="timeout",
            message=f"did not finish within {opts.timeout_s:g} s, {where}",
            log_tail=log_tail,
            **base,
        )
    try:
        data = json.loads(result_path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        rc = outcome.returncode
        why = (
            f"killed by signal {-rc} ({signal.Signals(-rc).name})"
            if rc < 0
            else f"exited with code {rc}"
        )
        return Verdict(
            status="runtime_error", message=f"the runner {why} {where}", log_tail=log_tail, **base
        )
    device = DeviceInfo(**data["device"]) if data.get("device") else None
    results = [CaseResult(**c) for c in data.get("cases", [])]
    status = data["status"]
    if status == "runtime_error":
        who = data.get("failed", "")
        prefix = "the reference failed: " if who == "reference" else ""
        return Verdict(
            status="runtime_error",
            message=f"{prefix}{data['message']} ({where})",
            cases=results,
            device=device,
            log_tail=log_tail,
            **base,
        )
    if status == "harness_error" and data.get("failed") in ("candidate", "reference", "kernel"):
        # e.g. a shared object that does not load (an undefined symbol): the kernel's fault
        return Verdict(
            status="runtime_error",
            message=f"{data['failed']}: {data['message']}",
            device=device,
            log_tail=log_tail,
            **base,
        )
    if status != "done":
        raise RuntimeError(f"runner: {data.get('message')}")  # a plan OptiML wrote wrong: a bug
    bad = [(c, s, b) for c in results for s in c.seeds for b in s.buffers if b.mismatches]
    if bad:
        c, s, b = bad[0]
        m = b.first[0]
        what = "was not written" if m.unwritten else f"is {m.got}, expected {m.expected}"
        unwritten = f" ({b.unwritten} unwritten)" if b.unwritten else ""
        message = f"{b.name}[{m.index}] {what} at {c.label}, seed {s.seed}: {b.mismatches} of the elements differ{unwritten}"
        rtol, atol = (tolerances or {}).get(b.name, (0.0, 0.0))
        if isinstance(b.max_abs_error, float) and b.mismatches > b.unwritten and (rtol or atol):
            # How far off, against what was allowed: rounding (a reordered sum) or a bug.
            message += f"; the largest difference is {b.max_abs_error:.3g}, allowed {atol:g} + {rtol:g}·|expected|"
        return Verdict(
            status="wrong_result",
            message=message,
            cases=results,
            device=device,
            log_tail=log_tail,
            **base,
        )
    timed = [c for c in results if c.timing]
    if timed and timed[0].timing.reference:
        t = timed[0].timing
        msg = f"correct at {len(results)} size(s) × {len(results[0].seeds)} seeds; {t.candidate.median_ms:.4g} ms vs {t.reference.median_ms:.4g} ms ({t.speedup:.2f}×) at {timed[0].label}"
    elif timed:
        msg = f"correct at {len(results)} size(s) × {len(results[0].seeds)} seeds; {timed[0].timing.candidate.median_ms:.4g} ms at {timed[0].label}"
    else:
        msg = f"correct at {len(results)} size(s) × {len(results[0].seeds) if results else 0} seeds"
    return Verdict(
        status="ok", message=msg, cases=results, device=device, log_tail=log_tail, **base
    )


def _describe_phase(phase: str, cases: list[Case]) -> str:
    fields = dict(part.split("=", 1) for part in phase.split() if "=" in part)
    try:
        label = cases[int(fields["case"])].label
    except (KeyError, ValueError, IndexError):
        return f"at {phase}"
    if "kernel" in fields:
        who = {
            "kernel": "the kernel",
            "reference": "the reference",
            "candidate": "the candidate",
        }.get(fields["kernel"], fields["kernel"])
        return f"while running {who} at {label}, seed {fields.get('seed')}"
    if "warmup" in phase:
        return f"while warming up at {label}"
    return f"while timing at {label}"
