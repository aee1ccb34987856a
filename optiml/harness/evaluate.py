"""One evaluation of a candidate against its reference: screen the candidate (only device code may
differ from the original), compile both (in parallel, cached) and, where the reference's code
allows, an oracle (the reference promoted to double), stream a plan to the runner, run it in its
own process group under a wall-clock limit, and turn what comes back — or the lack of it — into a
`Verdict` that names the check that decided it.

What the runner checks is in runner.cpp's header; what is decided here from its result: a candidate
that changed an `in` buffer (`modified_input`), wrote past a buffer (`runtime_error`, the guard
regions), gave a wrong output at a checked run or at a checked timed launch (`wrong_result`), or
took less time than the bytes its work must move allow on this device (`below_floor`).
"""

from __future__ import annotations

import datetime as dt
import functools
import importlib.util
import json
import os
import pickle
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from optiml.cuda.source import Kernel, SourceFile
from optiml.cuda.types import DTYPES, struct_layout
from optiml.errors import ExitCode, OptimlError, SpecError, SpecValueError, quote
from optiml.expr import ExprError, Number
from optiml.harness import inputs, procs
from optiml.harness.ahead import AHEAD, CANNOT_OPEN
from optiml.harness.build import DEFAULT_FLAGS, Build, build_kernel, runner_binary
from optiml.harness.ceilings import device_ceilings, floor_of
from optiml.harness.device import device_values
from optiml.harness.gpu import default_arch, require_gpu
from optiml.harness.inputs import Dist, Mode
from optiml.harness.nvcc import CompilerMessage, find_toolkit
from optiml.harness.promote import NotPromotable, Promoted, promote_to_double
from optiml.harness.screen import screen
from optiml.harness.verdict import CaseResult, DeviceInfo, Verdict
from optiml.harness.work import least_bytes
from optiml.spec import Case, Device, Spec, StructArg, evaluated_at_run_time, load, parse_spec


def fresh_seeds(count: int) -> tuple[int, ...]:
    """Seeds of one evaluation's checked runs, drawn from the OS: answers memorized for some
    inputs cannot be recomputed from the repository."""
    return tuple(secrets.randbits(31) | 1 for _ in range(count))


class ReferenceFailed(OptimlError):
    """The spec's NumPy reference could not produce the expected outputs."""

    exit_code = ExitCode.BAD_SPEC


class ReferenceTooLarge(ReferenceFailed):
    """The NumPy reference needs more memory at a case than its process may take
    (`REFERENCE_MEMORY`), or more time than it was given (`EvalOptions.reference_seconds`);
    `label` names the case."""

    def __init__(self, message: str, label: str):
        super().__init__(message)
        self.label = label


@dataclass(frozen=True)
class CasePlan:
    """One case beyond the spec's plain sizes: a judge's unseen size, other input values (`dists`
    per buffer: a mode over a range), other values of scalars, a tolerance scaled with the inputs'
    magnitude, elements the reference leaves non-finite not compared (`lenient`)."""

    sizes: dict[str, int]
    dists: dict[str, Dist] = field(default_factory=dict)
    scalars: dict[str, Number] = field(default_factory=dict)
    tol_scale: float = 1.0
    lenient: bool = False
    timed: bool | None = None  # None: as the options say
    note: str = ""  # said after the size in labels, e.g. "inputs: spikes"


# The most elements (all buffers together) of a size at which a NumPy reference is worth running
# where the kernel itself can stand in for it (`kernel_reference`): the function's inputs alone
# take ~1 s per 16 M elements to make at every seed (NumPy, one core), its outputs more;
# KernelBench's 4096 x 393216 maps would take minutes.
NUMPY_ELEMENTS = 1 << 25
# The share of the machine's memory a NumPy reference's process may take (its address space): a
# reference whose arrays grow with its iteration domain rather than its buffers (a transposed 3-D
# convolution's windows gathered at once: index arrays of 2.4 G elements per dimension,
# KernelBench's 58) fails there with NumPy's MemoryError instead of bringing the machine's OOM
# killer down on the optimizer.
REFERENCE_MEMORY = 0.5
# And the most seconds it may take for a step's sizes, all seeds, where a smaller size is left to
# fall back to (a reference whose work grows with its iteration domain, its buffers within
# NUMPY_ELEMENTS): past that, the largest of them joins the kernel's sizes as one that runs out
# of memory does (`EvalOptions.reference_seconds`, set by `evaluate`).
REFERENCE_SECONDS = 60.0


@dataclass
class EvalOptions:
    arch: str | None = None  # None: the spec's `arch`, else the local GPU's, else sm_90
    flags: tuple[str, ...] = DEFAULT_FLAGS
    candidate_flags: tuple[str, ...] | None = None  # the candidate's own (e.g. -use_fast_math)
    timeout_s: float = 60.0
    time: bool = True  # time the kernels, not only check them
    time_all_sizes: bool = True  # False: time the first size only (the others are only checked)
    seeds: tuple[int, ...] | None = None  # None: the spec's count, drawn per evaluation
    sizes: list[dict[str, int]] | None = None  # None: the spec's sizes
    reps_min: int = 20
    reps_max: int = 200
    target_ms: float = 400.0
    warmup_max: int = 30
    # Where one launch of the kernels timed together takes at least this long, that launch is the
    # warm-up and the timed launches fill 10 target times (5 at least, reps_min at most) (None:
    # rounds of 5 until two agree, then at least reps_min): KernelBench's plain LogSoftmax, 259 ms
    # a launch on an H100, was launched 20 to 45 times to time each candidate beside it.
    slow_round_ms: float | None = 20.0
    # Where a candidate's first timed launch takes a slow round and this many times its
    # reference's, that round is its timing (`CaseTiming.coarse`; None: never). The search's
    # evaluations set it: timing a loser to 2 % tells it nothing more than that it lost.
    give_up: float | None = None
    # The reference kernel's time at the timed size, measured before (None: timed beside the
    # candidate): it is not launched for its time, and the timed launches' outputs are not compared
    # (their inputs and guards are; the seeds' runs compare outputs as always). The search sets it
    # for a slow input's candidates: each evaluation launched it 6 times for its time alone, and
    # as often again where the oracle judged a timed launch (KernelBench's LayerNorm, 800 ms).
    reference_ms: float | None = None
    flush_factor: float = 2.0
    max_mismatches: int = 10
    cases: list[CasePlan] | None = None  # None: the sizes (above) as the spec declares them
    timed_checks: float = (
        0.25  # share of timed launches checked, and the last of every round (0: none)
    )
    fresh_inputs: bool = True  # every timed launch on inputs of its own, from a per-run seed
    guard_bytes: int = 4096  # guard region before and after every buffer
    dependence: int = 4  # dependence probes per input at timed cases (the floor's read bytes)
    state_poison: bool = False  # noise into the candidate's __device__ variables between launches
    oracle: bool = True  # judge outputs outside the tolerance against the promoted reference
    # The kernel as written is the reference (on the GPU; the oracle is its promotion to double)
    # where the spec names a NumPy function: once the input has passed against that function,
    # candidates are checked against the input, as a kernel without a NumPy reference is. The
    # function's outputs, computed on the CPU at every size and seed of every evaluation, took
    # minutes a candidate at KernelBench's sizes (a 2048 x 1048576 matrix-vector product).
    kernel_reference: bool = False
    # Where kernel_reference is off: the most elements (all buffers together) of a size checked
    # against the NumPy function; larger sizes are checked against the kernel as written once it
    # has passed at the others (`evaluate`). None: the function at every size.
    numpy_elements: int | None = NUMPY_ELEMENTS
    # the NumPy reference's time limit, set by `evaluate` where a smaller size is left to fall
    # back to (`reference_limit_s`); None: none
    reference_seconds: float | None = None
    # ... and the limit it sets there: REFERENCE_SECONDS, or less where a caller's time is short
    # (`optimize` within its wall-time budget)
    reference_limit_s: float = REFERENCE_SECONDS
    # Run in a runner started ahead of the job, whose exit is not waited for (optiml.harness.ahead):
    # ~0.3 s of a ~0.9 s evaluation of a small kernel is a runner opening and closing the GPU.
    # Off by default until measured on a GPU (benchmarks/eval_phases.py runs both ways); a GPU in
    # an exclusive-process compute mode cannot have a second runner open it.
    ahead: bool = False
    floor: bool = True  # a time below the physical floor is a verdict
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
    against the spec's reference, at every size with every seed, and time both.

    Against a NumPy reference, the declared sizes beyond `numpy_elements` are checked against the
    kernel as written instead, once it has passed against the function at the others (the
    smallest at least; `numpy_sizes`): one verdict of both steps, whose message says so."""
    opts = options or EvalOptions()
    if opts.reference_ms is not None and opts.time_all_sizes:
        raise ValueError("reference_ms is the reference's time at the first size: time only it")
    # where the sizes are evaluate's to split: a size the NumPy reference cannot hold (or not in
    # its time) falls back to the kernel as written
    falls_back = spec.reference.kind == "numpy" and not (
        opts.kernel_reference or opts.sizes or opts.cases
    )
    small = numpy_sizes(spec, opts.numpy_elements) if falls_back else None
    if small is None:
        limit = opts.reference_limit_s if falls_back and len(spec.sizes) > 1 else None
        try:
            return _evaluate(
                source, kernel, spec, candidate, replace(opts, reference_seconds=limit)
            )
        except ReferenceTooLarge:
            if not falls_back:
                raise
            small = [min(spec.sizes, key=lambda z: sum(spec.case(z).lengths.values()))]
    opts = replace(opts, seeds=opts.seeds or fresh_seeds(spec.seeds))

    def timed(part: list[dict[str, int]]) -> bool:  # `time_all_sizes=False`: the first size only
        return opts.time and (opts.time_all_sizes or spec.sizes[0] in part)

    while True:
        try:
            limit = opts.reference_limit_s if len(small) > 1 else None
            checked = _evaluate(
                source,
                kernel,
                spec,
                candidate,
                replace(opts, sizes=small, time=timed(small), reference_seconds=limit),
            )
            break
        except ReferenceTooLarge as e:  # that size joins the kernel's, if a smaller one is left
            over = [s for s in small if spec.case(s).label == e.label]
            if not over or len(small) == 1:
                raise
            small = [s for s in small if s not in over]
    large = [s for s in spec.sizes if s not in small]
    at = "; ".join(spec.case(s).label for s in small)
    said = f"checked against `{spec.reference.function}` at {at} (larger sizes against "
    said += f"`{kernel.name}` as written: too costly for the CPU)"
    if not checked.ok:
        return checked.model_copy(update={"message": f"{checked.message} ({said})"})
    rest = _evaluate(
        source,
        kernel,
        spec,
        candidate,
        replace(opts, sizes=large, time=timed(large), kernel_reference=True),
    )
    order = {spec.case(s).label: i for i, s in enumerate(spec.sizes)}
    cases = sorted([*checked.cases, *rest.cases], key=lambda c: order.get(c.label, len(order)))
    return rest.model_copy(
        update={
            "message": f"{said}; {rest.message}",
            "reference": f"{checked.reference}, then {rest.reference}",
            "cases": cases,
            "compile_s": checked.compile_s + rest.compile_s,
            "run_s": checked.run_s + rest.run_s,
            "wall_s": checked.wall_s + rest.wall_s,
        }
    )


def _evaluate(
    source: SourceFile, kernel: Kernel, spec: Spec, candidate: SourceFile | None, opts: EvalOptions
) -> Verdict:
    """`evaluate` at the sizes `opts` names, against one reference."""
    opts = replace(opts, arch=opts.arch or spec.arch or default_arch())
    start = time.perf_counter()
    tk = find_toolkit()
    cand_source = candidate or source
    cand_kernel = cand_source.kernel(kernel.name)
    reference, ref_label = reference_of(source, kernel, spec, opts)

    base = dict(
        file=source.path,
        kernel=kernel.name,
        candidate_file=candidate.path if candidate else None,
        reference=ref_label,
        arch=opts.arch,
        nvcc_version=tk.version,
        date=_now(),
    )

    def refused(status: str, check: str, message: str, **more) -> Verdict:
        return Verdict(
            status=status,
            check=check,
            message=message,
            wall_s=time.perf_counter() - start,
            **base,
            **more,
        )

    # Same types and pointer depths; `const` and `__restrict__` on a pointee may be added or dropped
    # (a call through the original signature stays valid).
    if [(p.type_text, p.pointer_depth) for p in cand_kernel.params] != [
        (p.type_text, p.pointer_depth) for p in kernel.params
    ]:
        sig = ", ".join(p.declared for p in kernel.params)
        return refused(
            "compile_error",
            "signature",
            f"the candidate's `{kernel.name}` must keep the parameters ({sig})",
        )

    if candidate is not None:
        findings = screen(source, candidate, kernel.name)
        if findings:
            f = findings[0]
            more = f" (and {len(findings) - 1} more)" if len(findings) > 1 else ""
            return refused(
                "forbidden_code",
                "screen",
                f"{candidate.path}:{f.line}:{f.column}: {f.message}{more}",
            )
    try:
        cand_spec = (
            candidate_spec(spec, cand_source, cand_kernel) if candidate is not None else spec
        )
    except TemplateRefused as e:
        return refused("forbidden_code", "screen", f"{candidate.path}: {e.message}")
    except SpecError as e:
        return refused("compile_error", "spec", f"{candidate.path}:{e}")
    same = reference is not None and reference.kernel is kernel and candidate is None
    with ThreadPoolExecutor(max_workers=4) as pool:
        runner_f = pool.submit(runner_binary)
        cand_f = pool.submit(
            _build, Target(cand_source, cand_kernel), cand_spec, opts, opts.candidate_flags
        )
        ref_f = pool.submit(_build, reference, spec, opts) if reference and not same else None
        oracle_f = (
            pool.submit(_oracle, reference, spec, opts)
            if reference is not None and not same and opts.oracle
            else None
        )
        cand_build = cand_f.result()
        ref_build = ref_f.result() if ref_f else (cand_build if same else None)
        oracle = oracle_f.result() if oracle_f else None
        runner = runner_f.result()
    compile_s = time.perf_counter() - start

    # A reference that fails as the candidate does (the same code: the input checked against
    # itself) is the candidate's error, said once as such.
    ref_failed_alone = (
        ref_build is not None
        and not ref_build.ok
        and not same
        and (cand_build.ok or _first_error(cand_build.messages) != _first_error(ref_build.messages))
    )
    if ref_failed_alone:
        return refused(
            "compile_error",
            "compile",
            f"the reference does not compile: {_first_error(ref_build.messages)}",
            messages=ref_build.messages,
            compile_s=compile_s,
        )
    if not cand_build.ok:
        return refused(
            "compile_error",
            "compile",
            _first_error(cand_build.messages),
            messages=cand_build.messages,
            compile_s=compile_s,
        )

    seeds = opts.seeds or fresh_seeds(spec.seeds)
    plans = opts.cases or [CasePlan(sizes=s) for s in (opts.sizes or spec.sizes)]
    device = device_values(opts.env) if spec.uses_device or cand_spec.uses_device else None
    try:
        cases = [_case(spec, cp, device) for cp in plans]
    except ExprError as e:
        raise SpecValueError(f"{source.path}: `{kernel.name}`'s spec: {e}") from None
    try:
        cand_cases = (
            [_case(cand_spec, cp, device) for cp in plans] if cand_spec is not spec else None
        )
    except ExprError as e:
        return refused("compile_error", "spec", f"{cand_source.path}: the candidate's launch: {e}")
    nonce = secrets.token_hex(16)
    plan = write_plan(
        spec,
        cases,
        seeds,
        opts,
        candidate_cases=cand_cases,
        plans=plans,
        nonce=nonce,
        numpy_reference=reference is None,
        oracle=oracle[0] if oracle else None,
    )
    expected = (
        _numpy_expected(spec, cases, plans, seeds, opts.reference_seconds)
        if reference is None
        else []
    )
    with tempfile.TemporaryDirectory(prefix="optiml-eval-", dir=opts.workdir) as tmp:
        work = Path(tmp)
        run_start = time.perf_counter()
        outcome = _run_isolated(
            [
                str(runner),
                "-",
                "fd:{result}",
                str(ref_build.path) if ref_build else "-",
                str(cand_build.path),
                *([str(oracle[1].path)] if oracle else []),
            ],
            opts,
            work,
            [plan.encode(), *expected],
        )
        run_s = time.perf_counter() - run_start
    tolerances = {b.name: spec.tolerance(DTYPES[b.dtype]) for b in spec.buffers}
    verdict = _verdict_of(outcome, cases, base, opts, tolerances, nonce=nonce)
    if verdict.ok and opts.floor:
        verdict = _below_floor(verdict, spec, cases, opts) or verdict
    verdict.messages = cand_build.messages
    verdict.compile_s = compile_s
    verdict.run_s = run_s
    verdict.wall_s = time.perf_counter() - start
    return verdict


def reference_of(
    source: SourceFile, kernel: Kernel, spec: Spec, opts: EvalOptions
) -> tuple[Target | None, str]:
    """What a candidate is checked against, and how a verdict names it: a kernel of the file (the
    kernel as written, or the one the spec names), or None for the spec's NumPy function (unless
    `opts.kernel_reference` puts the kernel as written in its place)."""
    ref = spec.reference
    if ref.kind == "self" or (ref.kind == "numpy" and opts.kernel_reference):
        return Target(source, kernel), f"{kernel.name} in {source.path}"
    if ref.kind == "kernel":
        target = Target(source, source.kernel(ref.kernel or ""))
        return target, f"{target.kernel.name} in {source.path}"
    return None, f"{ref.function} in {ref.path}"


def numpy_sizes(spec: Spec, limit: int | None = NUMPY_ELEMENTS) -> list[dict[str, int]] | None:
    """The declared sizes at which a kernel is checked against its NumPy reference before it
    stands in for it: those of at most `limit` elements, the smallest size at least; None where
    that is all of them (or there is no limit)."""
    if limit is None:
        return None
    try:
        work = [(sum(spec.case(s).lengths.values()), i) for i, s in enumerate(spec.sizes)]
    except ExprError:  # a length only the GPU's values decide: every size, as declared
        return None
    fit = [spec.sizes[i] for n, i in work if n <= limit]
    if len(fit) == len(work):
        return None
    return fit or [spec.sizes[min(work)[1]]]


def _case(spec: Spec, plan: CasePlan, device: Device | None = None) -> Case:
    case = spec.case(plan.sizes, device)
    if plan.scalars:
        case = case.model_copy(update={"scalars": {**case.scalars, **plan.scalars}})
    return case


@functools.lru_cache(maxsize=32)
def _promoted(text: str, path: str, kernel: str, spec_json: str, arch: str) -> Promoted | None:
    source = SourceFile(text, path)
    try:
        return promote_to_double(source, kernel, Spec.model_validate_json(spec_json), arch=arch)
    except NotPromotable:
        return None


def _oracle(target: Target, spec: Spec, opts: EvalOptions) -> tuple[Promoted, Build] | None:
    """The reference with its floating-point types promoted to double, built; None where its code
    does not allow it or it does not compile (outputs outside the tolerance are then wrong)."""
    if not any(DTYPES[b.dtype].is_float for b in spec.buffers if b.role != "in"):
        return None
    if any(DTYPES[f.dtype].is_float for s in spec.structs for f in s.fields):
        return None  # the copy's struct would hold doubles: another layout than the bytes passed
    promoted = _promoted(
        target.source.text,
        target.source.path,
        target.kernel.name,
        spec.model_dump_json(),
        opts.arch,
    )
    if promoted is None:
        return None
    build = build_kernel(
        promoted.source,
        promoted.definition,
        instantiation=promoted.instantiation,
        arch=opts.arch,
        flags=opts.flags,
    )
    return (promoted, build) if build.ok else None


def _below_floor(
    verdict: Verdict, spec: Spec, cases: list[Case], opts: EvalOptions
) -> Verdict | None:
    """`below_floor` where a timed case's fastest launch took less than the bytes its work must
    move allow on this device; each timed case gets its floor recorded either way."""
    if verdict.device is None:
        return None
    ceilings = device_ceilings(verdict.device, opts.env)
    if ceilings is None:
        return None
    for case, result in zip(cases, verdict.cases, strict=False):
        if result.timing is None:
            continue
        least = least_bytes(spec, case, result.dependence, verdict.device.l2_bytes)
        result.floor = floor_of(least, ceilings)
        fastest = result.timing.candidate.min_ms
        if least and fastest < result.floor.ms:
            gbs = least / (fastest * 1e-3) / 1e9
            return verdict.model_copy(
                update={
                    "status": "below_floor",
                    "check": "physical floor",
                    "message": f"{fastest:.4g} ms at {result.label} is below the physical floor of "
                    f"{result.floor.ms:.4g} ms: its work reads and writes at least "
                    f"{least / 1e6:.4g} MB, which would take {gbs / 1e3:.3g} TB/s, past this "
                    f"device's {ceilings.best_gbs / 1e3:.3g} TB/s ceiling: work was skipped",
                }
            )
    return None


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


# A template argument a candidate's spec may give for a type parameter: a type's name (scoped,
# with template arguments of names and numbers, `const`/`unsigned`, pointers), nothing that could
# call or define anything in the launcher's host code, where the argument is pasted.
_TYPE_ARGUMENT = re.compile(
    r"(?:(?:const|volatile|unsigned|signed|long|short)\s+)*"
    r"[A-Za-z_]\w*(?:\s*::\s*[A-Za-z_]\w*)*(?:\s*<[\w\s,:<>]*>)?(?:\s*\*)*"
)


def candidate_spec(spec: Spec, candidate: SourceFile, kernel: Kernel) -> Spec:
    """The spec a candidate runs under: a candidate with a spec comment of its own brings its launch
    configuration and instantiation; the contract — arguments, sizes, tolerances, reference —
    stays the original's. `SpecError` for a candidate spec that does not parse; `TemplateRefused`
    for a template argument that is not a plain type or a number."""
    if kernel.spec_comment is None:
        return spec
    own = parse_spec(candidate, kernel)
    template = dict(own.template)
    for p in kernel.template_params:
        value = template.get(p.name)
        if value is None:
            continue
        if p.kind == "value" and p.name in own.template_values:
            template[p.name] = str(own.template_values[p.name])  # the number, not its text
        elif p.kind == "value" or not _TYPE_ARGUMENT.fullmatch(value.strip()):
            raise TemplateRefused(
                f"`template: {p.name} = {quote(value, 40)}` is not a plain type or a number"
            )
    return spec.model_copy(
        update={"launch": own.launch, "template": template, "template_values": own.template_values}
    )


class TemplateRefused(OptimlError):
    """A candidate's template argument that could put code in the launcher's host code."""


def build_candidate(
    source: SourceFile, kernel: Kernel, spec: Spec, candidate: SourceFile, opts: EvalOptions
) -> Build | None:
    """Compile a candidate as `evaluate` will (its own spec's instantiation, its flags), so that a
    caller can compile on the CPU while a GPU is busy; `evaluate` then finds it in the cache. None
    for a candidate `evaluate` refuses before compiling (screened out, a spec of its own that is
    refused): nothing of it is compiled."""
    if screen(source, candidate, kernel.name):
        return None
    cand_kernel = candidate.kernel(kernel.name)
    try:
        cand_spec = candidate_spec(spec, candidate, cand_kernel)
    except (TemplateRefused, SpecError):
        return None
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


def default_dist(spec: Spec, case: Case, buffer: str) -> Dist:
    """A buffer's inputs as the spec declares them: uniform over its range, or structured."""
    d = DTYPES[spec.buffer(buffer).dtype]
    lo, hi = case.ranges.get(buffer, (d.low, d.high))
    if buffer in case.structures:
        kind, extra = case.structures[buffer]
        return Dist(lo, hi, inputs.STRUCTURED[kind], extra)
    return Dist(lo, hi)


def struct_dtype(struct: StructArg) -> np.dtype:
    """A struct's layout as C lays it out. The launcher asserts the same layout at compile time
    (build.py), so the bytes passed are the struct the kernel reads."""
    return struct_layout([(f.name, f.dtype) for f in struct.fields])


def struct_bytes(struct: StructArg, values: dict[str, Number]) -> bytes:
    record = np.zeros((), dtype=struct_dtype(struct))
    for f in struct.fields:
        record[f.name] = values[f.name]
    return record.tobytes()


def probe_values(spec: Spec, case: Case, buffer: str) -> tuple[float, float]:
    """What a dependence probe writes into one element: the ends of a declared range, else far
    outside the inputs' usual magnitude on both sides (an element that matters changes the
    outputs with at least one of them: a max with the high one, a min with the low one)."""
    d = DTYPES[spec.buffer(buffer).dtype]
    if buffer in case.ranges or not d.is_float:
        lo, hi = case.ranges.get(buffer, (d.low, d.high))
        if d.is_float:
            return float(lo), float(hi - (hi - lo) / 1024)
        return float(lo), float(hi - 1)
    return 64.0, -64.0


def write_plan(
    spec: Spec,
    cases: list[Case],
    seeds: tuple[int, ...],
    opts: EvalOptions,
    candidate_cases: list[Case] | None = None,
    *,
    plans: list[CasePlan] | None = None,
    nonce: str = "",
    numpy_reference: bool = False,
    oracle: Promoted | None = None,
    profile_only: bool = False,
    launches: int = 1,
    poison_outputs: bool = True,
) -> str:
    """The runner's plan: buffers, how parameters map to them, and every case fully evaluated.
    `profile_only`: the runner launches the candidate (`launches` times) and checks nothing (for
    a profiler or a sanitizer); without `poison_outputs` it leaves `out` buffers unwritten."""
    key = secrets.randbits(64)
    lines = [
        f"nonce {nonce}",
        "seeds " + " ".join(str(s) for s in seeds),
        f"timing {opts.reps_min} {opts.reps_max} {opts.target_ms} {opts.warmup_max} {opts.flush_factor}",
        f"timed_checks {opts.timed_checks!r} {secrets.randbits(63) | 1 if opts.fresh_inputs else 0}",
        f"slow_round {opts.slow_round_ms or 0!r}",
        f"give_up {opts.give_up or 0!r}",
        f"reference_ms {opts.reference_ms or 0!r}",
        f"key {key}",
        f"guard {0 if profile_only else opts.guard_bytes}",
        f"dependence {opts.dependence}",
        f"max_mismatches {opts.max_mismatches}",
    ]
    if numpy_reference:
        lines.append("numpy_reference")
    if profile_only:
        lines += ["profile_only", f"launches {launches}"]
        if not poison_outputs:
            lines.append("no_poison")
    if opts.state_poison:
        lines.append("state_poison")
    if oracle is not None:
        lines.append(f"oracle_smem_scale {oracle.smem_scale}")
    index = {b.name: i for i, b in enumerate(spec.buffers)}
    for b in spec.buffers:
        rtol, atol = spec.tolerance(DTYPES[b.dtype])
        promoted = f" {oracle.buffers.get(b.name, b.dtype)}" if oracle is not None else ""
        lines.append(f"buffer {b.name} {b.role} {b.dtype} {rtol!r} {atol!r}{promoted}")
    scalar_types = {s.name: s.dtype for s in spec.scalars}
    structs = {s.name: s for s in spec.structs}
    for name in spec.params:
        if name in index:
            lines.append(f"param buffer {index[name]}")
        elif name in structs:
            lines.append(f"param bytes {struct_dtype(structs[name]).itemsize}")
        else:
            promoted = f" {oracle.scalars.get(name, scalar_types[name])}" if oracle else ""
            lines.append(f"param scalar {scalar_types[name]}{promoted}")
    for ci, c in enumerate(cases):
        cp = plans[ci] if plans else CasePlan(sizes=c.sizes)
        lines.append(f"case {c.label}{f' ({cp.note})' if cp.note else ''}")
        g, b = c.grid, c.block
        timed = opts.time and (opts.time_all_sizes or ci == 0) if cp.timed is None else cp.timed
        lines.append(f"launch {g[0]} {g[1]} {g[2]} {b[0]} {b[1]} {b[2]} {c.smem} {int(timed)}")
        if candidate_cases is not None:
            cc = candidate_cases[ci]
            g, b = cc.grid, cc.block
            lines.append(f"candidate_launch {g[0]} {g[1]} {g[2]} {b[0]} {b[1]} {b[2]} {cc.smem}")
        if cp.tol_scale != 1.0:
            lines.append(f"tol_scale {cp.tol_scale!r}")
        if cp.lenient:
            lines.append("lenient_nonfinite")
        for buf in spec.buffers:
            dist = cp.dists.get(buf.name) or default_dist(spec, c, buf.name)
            a, b2 = probe_values(spec, c, buf.name)
            lines.append(
                f"length {c.lengths[buf.name]} {_fmt(dist.lo)} {_fmt(dist.hi)} {int(dist.mode)} "
                f"{_fmt(float(dist.extra))} {_fmt(a)} {_fmt(b2)}"
            )
        for name in spec.params:
            if name in index:
                lines.append("scalar -")
            elif name in structs:
                lines.append(f"scalar x{struct_bytes(structs[name], c.structs[name]).hex()}")
            else:
                value = c.scalars[name]
                if DTYPES[scalar_types[name]].is_float:
                    value = float(value)
                elif not isinstance(value, int):
                    value = int(value)
                lines.append(f"scalar {_fmt(value)}")
    return "\n".join(lines) + "\nend\n"


def launch_once(
    spec: Spec,
    case: Case,
    arch: str,
    kernel: Path,
    work: Path,
    *,
    seed: int = 1,
    launches: int = 1,
    poison_outputs: bool = True,
) -> list[str]:
    """The runner's command that launches `kernel` (a built shared object) at `case` on `seed`'s
    inputs (`launches` times, the inputs made anew before each) and checks nothing: what a
    profiler or a sanitizer watches. The plan is written into `work`, the result goes there."""
    plan = work / "plan.txt"
    plan.write_text(
        write_plan(
            spec,
            [case],
            (seed,),
            EvalOptions(arch=arch, time=False),
            profile_only=True,
            launches=launches,
            poison_outputs=poison_outputs,
        )
    )
    return [str(runner_binary()), str(plan), str(work / "result.json"), str(kernel), str(kernel)]


# `_numpy_outputs` in a process of its own, its address space limited (argv: the limit in bytes,
# 0 for none; the job's pickle; where its answer's pickle goes).
_REFERENCE_PROCESS = """
import pickle, resource, sys
limit, job, answer = int(sys.argv[1]), sys.argv[2], sys.argv[3]
sys.path.insert(0, sys.argv[4])
if limit > 0:
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
from optiml.harness import evaluate
with open(job, "rb") as f:
    spec, cases, plans, seeds = pickle.load(f)
try:
    result = ("ok", evaluate._numpy_outputs(spec, cases, plans, seeds))
except evaluate.ReferenceTooLarge as e:
    result = ("too_large", str(e), e.label)
except evaluate.ReferenceFailed as e:
    result = ("failed", str(e))
with open(answer, "wb") as f:
    pickle.dump(result, f, protocol=pickle.HIGHEST_PROTOCOL)
"""


def _numpy_expected(
    spec: Spec,
    cases: list[Case],
    plans: list[CasePlan],
    seeds: tuple[int, ...],
    seconds: float | None = None,
) -> list[bytes]:
    """`_numpy_outputs` in a process of its own whose address space is at most
    `REFERENCE_MEMORY` of the machine's memory: a reference that needs more fails there with
    `ReferenceTooLarge` (NumPy's MemoryError), and this process is not the OOM killer's; so does
    one that takes more than `seconds` (None: no limit)."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    limit = int(total * REFERENCE_MEMORY)
    root = Path(__file__).resolve().parent.parent.parent
    with tempfile.TemporaryDirectory(prefix="optiml-reference-") as tmp:
        job, answer = Path(tmp) / "job.pickle", Path(tmp) / "answer.pickle"
        with open(job, "wb") as f:
            pickle.dump((spec, cases, plans, seeds), f, protocol=pickle.HIGHEST_PROTOCOL)
        largest = max(cases, key=lambda c: sum(c.lengths.values()))
        try:
            done = subprocess.run(
                [
                    sys.executable,
                    "-c",
                    _REFERENCE_PROCESS,
                    str(limit),
                    str(job),
                    str(answer),
                    str(root),
                ],
                capture_output=True,
                text=True,
                timeout=seconds,
            )
        except subprocess.TimeoutExpired:
            raise ReferenceTooLarge(
                f"the NumPy reference `{spec.reference.function}` did not finish within "
                f"{seconds:.0f} s at {', '.join(c.label for c in cases)}",
                largest.label,
            ) from None
        if not answer.is_file():
            last = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
            if done.returncode < 0 or "MemoryError" in done.stderr:  # killed: the largest case's
                raise ReferenceTooLarge(
                    f"the NumPy reference `{spec.reference.function}` ended without its outputs "
                    f"({last[:200]}) within {limit / 2**30:.0f} GiB",
                    largest.label,
                )
            raise ReferenceFailed(
                f"the NumPy reference `{spec.reference.function}` ended without its outputs: "
                f"{last[:300]}"
            )
        with open(answer, "rb") as f:
            result = pickle.load(f)
    if result[0] == "too_large":
        raise ReferenceTooLarge(result[1], result[2])
    if result[0] == "failed":
        raise ReferenceFailed(result[1])
    return result[1]


def _numpy_outputs(
    spec: Spec, cases: list[Case], plans: list[CasePlan], seeds: tuple[int, ...]
) -> list[bytes]:
    """Run the spec's NumPy reference on the runner's own inputs: its outputs, case by case, seed
    by seed, buffer by buffer, as the bytes that follow the plan on the runner's input."""
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
    out: list[bytes] = []
    for c, cp in zip(cases, plans, strict=True):
        try:
            out += _numpy_case(spec, fn, c, cp, seeds)
        except MemoryError as e:
            raise ReferenceTooLarge(
                f"the NumPy reference `{ref.function}` needs more memory than it may take at "
                f"{c.label} ({e})",
                c.label,
            ) from None
    return out


def _numpy_case(spec: Spec, fn, c: Case, cp: CasePlan, seeds: tuple[int, ...]) -> list[bytes]:
    """`_numpy_outputs` at one case."""
    ref = spec.reference
    out: list[bytes] = []
    for seed in seeds:
        arrays: dict[str, np.ndarray] = {}
        for bi, b in enumerate(spec.buffers):
            d = DTYPES[b.dtype]
            n = c.lengths[b.name]
            if b.role == "out":
                arr = np.zeros(n, dtype=np.float32 if b.dtype == "bf16" else d.np_dtype())
            else:
                dist = cp.dists.get(b.name) or default_dist(spec, c, b.name)
                arr = inputs.generate(
                    b.dtype, bi, n, seed, dist.lo, dist.hi, Mode(dist.mode), dist.extra
                )
                if b.dtype == "bf16":
                    arr = (arr.astype(np.uint32) << 16).view(np.float32)
            # a vector type's buffer: one row of components per vector
            arrays[b.name] = arr.reshape(-1, b.lanes) if b.lanes > 1 else arr
        args = [
            arrays[p]
            if p in arrays
            else SimpleNamespace(**c.structs[p])
            if p in c.structs
            else c.scalars[p]
            for p in spec.params
        ]
        try:
            returned = fn(*args)
        except MemoryError:
            raise
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
            if arr.size != c.lengths[b.name]:
                raise ReferenceFailed(
                    f"the NumPy reference `{ref.function}` gave {arr.size} values for `{b.name}` "
                    f"at {c.label}; it has {c.lengths[b.name]}"
                )
            data = (
                inputs._float_to_bf16_bits(arr) if b.dtype == "bf16" else arr.astype(d.np_dtype())
            )
            out.append(data.tobytes())
    return out


# ---- running in isolation ----------------------------------------------------------------------


@dataclass
class _Outcome:
    returncode: int | None  # None: killed at the time limit
    stderr: str
    stdout: str
    seconds: float
    result: str = ""  # what the runner wrote on its result descriptor


def _run_isolated(cmd: list[str], opts: EvalOptions, work: Path, stdin: list[bytes]) -> _Outcome:
    """Run in a new process group so that a hung kernel's process (and anything it started) can
    be killed whole at the limit. The plan (and a NumPy reference's outputs) go in on standard
    input; the result comes back on a pipe (`fd:{result}` in `cmd`), never through a file a
    candidate could read or forge; output goes to files so a chatty kernel cannot block us.
    `opts.ahead`: in a runner started ahead (optiml.harness.ahead), `work` unused."""
    if opts.ahead and AHEAD.usable(Path(cmd[0]), opts.env, opts.workdir):
        outcome = _run_ahead(cmd, opts, stdin)
        if outcome.returncode != CANNOT_OPEN or outcome.result:
            return outcome
        # it could not open the GPU while another runner held it: one runner at a time there
        AHEAD.refuse(Path(cmd[0]), opts.env, opts.workdir)
    out_path, err_path = work / "stdout.txt", work / "stderr.txt"
    env = {**os.environ, **opts.env}
    start = time.perf_counter()
    read_end, write_end = os.pipe()
    chunks: list[bytes] = []
    cmd = [part.replace("{result}", str(write_end)) for part in cmd]
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        try:
            with procs.spawned(
                cmd,
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=err,
                env=env,
                cwd=work,
                pass_fds=(write_end,),
            ) as proc:
                os.close(write_end)
                write_end = -1
                reader = threading.Thread(target=_drain, args=(read_end, chunks), daemon=True)
                feeder = threading.Thread(target=_feed, args=(proc.stdin, stdin), daemon=True)
                reader.start()
                feeder.start()
                try:
                    rc: int | None = proc.wait(timeout=opts.timeout_s)
                except subprocess.TimeoutExpired:
                    procs.kill_group(proc.pid)
                    proc.wait()
                    rc = None
                feeder.join(timeout=5)
                reader.join(timeout=5)
        finally:
            if write_end >= 0:
                os.close(write_end)
            os.close(read_end)
    return _Outcome(
        rc,
        _tail(err_path),
        _tail(out_path),
        time.perf_counter() - start,
        b"".join(chunks).decode("utf-8", errors="replace"),
    )


def _run_ahead(cmd: list[str], opts: EvalOptions, stdin: list[bytes]) -> _Outcome:
    """`_run_isolated` in a runner that opened the GPU while the job before it ran: done when the
    result pipe closes (the runner closes it once the result is written), the process's exit
    waited for on a thread."""
    job = AHEAD.take(Path(cmd[0]), opts.env, opts.workdir)
    start = time.perf_counter()
    args = "\t".join(part.replace("{result}", str(job.fd)) for part in cmd[1:])
    chunks: list[bytes] = []
    reader = threading.Thread(target=_drain, args=(job.read_end, chunks), daemon=True)
    feeder = threading.Thread(
        target=_feed, args=(job.proc.stdin, [args.encode() + b"\n", *stdin]), daemon=True
    )
    reader.start()
    feeder.start()
    reader.join(timeout=opts.timeout_s)
    rc: int | None
    if reader.is_alive():  # the time limit
        procs.kill_group(job.proc.pid)
        job.proc.wait()
        reader.join(timeout=5)
        rc = None
    elif chunks:  # the result is in; the process may still be closing the GPU
        rc = job.proc.poll() or 0
    else:  # it ended without a result: its exit status says how
        try:
            rc = job.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            procs.kill_group(job.proc.pid)
            rc = job.proc.wait()
    feeder.join(timeout=5)
    outcome = _Outcome(
        rc,
        _tail(job.work / "stderr.txt"),
        _tail(job.work / "stdout.txt"),
        time.perf_counter() - start,
        b"".join(chunks).decode("utf-8", errors="replace"),
    )
    threading.Thread(target=job.discard, kwargs={"wait": 30}, daemon=True).start()
    return outcome


def _drain(fd: int, chunks: list[bytes]) -> None:
    while data := os.read(fd, 1 << 16):
        chunks.append(data)


def _feed(pipe, data: list[bytes]) -> None:
    try:
        for chunk in data:
            pipe.write(chunk)
        pipe.close()
    except (
        BrokenPipeError,
        OSError,
        ValueError,
    ):  # the runner died or was killed: its verdict says
        pass


def _tail(path: Path, limit: int = 4000) -> str:
    data = path.read_bytes()
    return data[-limit:].decode("utf-8", errors="replace")


def _verdict_of(
    outcome: _Outcome,
    cases: list[Case],
    base: dict,
    opts: EvalOptions,
    tolerances: dict[str, tuple[float, float]] | None = None,
    *,
    nonce: str = "",
) -> Verdict:
    phases = [line[6:] for line in outcome.stderr.splitlines() if line.startswith("phase ")]
    where = _describe_phase(phases[-1], cases) if phases else "before the first kernel ran"
    log_tail = "\n".join(
        line
        for line in (outcome.stdout + outcome.stderr).splitlines()
        if not line.startswith("phase ")
    )[-2000:]

    def verdict(status: str, check: str, message: str, **more) -> Verdict:
        return Verdict(
            status=status, check=check, message=message, log_tail=log_tail, **base, **more
        )

    if outcome.returncode is None:
        return verdict(
            "timeout", "time limit", f"did not finish within {opts.timeout_s:g} s, {where}"
        )
    try:
        data = json.loads(outcome.result)
    except json.JSONDecodeError:
        rc = outcome.returncode
        why = (
            f"killed by signal {-rc} ({signal.Signals(-rc).name})"
            if rc < 0
            else f"exited with code {rc}"
        )
        return verdict("runtime_error", "runner", f"the runner {why} {where}")
    if data.get("nonce") != nonce:
        return verdict(
            "runtime_error", "runner", "the result did not come from the runner (its nonce differs)"
        )
    device = DeviceInfo(**data["device"]) if data.get("device") else None
    results = [CaseResult(**c) for c in data.get("cases", [])]
    status = data["status"]
    if status == "runtime_error":
        who = data.get("failed", "")
        prefix = {"reference": "the reference failed: ", "oracle": "the oracle failed: "}.get(
            who, ""
        )
        return verdict(
            "runtime_error",
            "runner",
            f"{prefix}{data['message']} ({where})",
            cases=results,
            device=device,
        )
    if status != "done":
        # e.g. a shared object that does not load (an undefined symbol). A candidate runs in the
        # runner's process, so whatever stopped the runner is a verdict on it, never a crash.
        who = data.get("failed") or "the harness"
        return verdict(
            "runtime_error", "runner", f"{who}: {data.get('message', status)}", device=device
        )
    checked = sum(len(c.seeds) for c in results)
    if len(results) != len(cases) or checked == 0:
        return verdict(
            "runtime_error",
            "checked cases",
            f"the runner checked {checked} case(s) of {len(cases)} size(s): nothing is proven",
            cases=results,
            device=device,
        )
    for c in results:
        for g in c.guard_violations:
            return verdict(
                "runtime_error",
                "guard regions",
                f"wrote outside `{g.buffer}` at {c.label}, {g.when}: {g.bytes} byte(s) of the "
                "guard regions around it changed",
                cases=results,
                device=device,
            )
    for c in results:
        for change in c.input_changes:
            return verdict(
                "modified_input",
                "input checksums",
                f"changed `{change.buffer}`, which the spec declares `in`, at {c.label}, {change.when}",
                cases=results,
                device=device,
            )
    bad = [(c, s, b) for c in results for s in c.seeds for b in s.buffers if b.mismatches]
    if bad:
        c, s, b = bad[0]
        return verdict(
            "wrong_result",
            "outputs",
            _mismatch_message(c, s, b, (tolerances or {}).get(b.name, (0.0, 0.0))),
            cases=results,
            device=device,
        )
    for c in results:
        t = c.timing
        if t is not None and t.mismatches:
            fb = t.first_bad
            at = f": first `{fb.buffer}`[{fb.index}] at timed launch {fb.launch}" if fb else ""
            how = (
                " (its inputs were the previous launch's with one element changed: an output "
                "kept from an earlier launch?)"
                if fb and fb.near_repeat
                else ""
            )
            unwritten = f" ({t.unwritten} unwritten)" if t.unwritten else ""
            return verdict(
                "wrong_result",
                "timed launches' outputs",
                f"correct when checked, but {t.mismatches} output element(s){unwritten} of "
                f"{t.checked_launches} checked timed launches at {c.label} were wrong{at}{how}; "
                "each timed launch had fresh inputs",
                cases=results,
                device=device,
            )
    timed = [c for c in results if c.timing]
    seeds_n = len(results[0].seeds)
    if timed and timed[0].timing.reference:
        t = timed[0].timing
        msg = f"correct at {len(results)} size(s) × {seeds_n} seeds; {t.candidate.median_ms:.4g} ms vs {t.reference.median_ms:.4g} ms ({t.speedup:.2f}×) at {timed[0].label}"
        if t.coarse:
            msg += " (timed by one launch: far slower than its reference)"
        if t.reference_before:
            msg += " (the reference's time measured before)"
    elif timed:
        msg = f"correct at {len(results)} size(s) × {seeds_n} seeds; {timed[0].timing.candidate.median_ms:.4g} ms at {timed[0].label}"
    else:
        msg = f"correct at {len(results)} size(s) × {seeds_n} seeds"
    checks = ["outputs", "guard regions", "input checksums"]
    if any(c.timing and c.timing.compared for c in results):
        checks.append("timed launches' outputs")
    return verdict("ok", ", ".join(checks), msg, cases=results, device=device)


def _mismatch_message(c: CaseResult, s, b, tolerance: tuple[float, float]) -> str:
    m = b.first[0]
    what = "was not written" if m.unwritten else f"is {m.got}, expected {m.expected}"
    unwritten = f" ({b.unwritten} unwritten)" if b.unwritten else ""
    message = f"{b.name}[{m.index}] {what} at {c.label}, seed {s.seed}: {b.mismatches} of the elements differ{unwritten}"
    rtol, atol = tolerance
    if isinstance(b.max_abs_error, float) and b.mismatches > b.unwritten and (rtol or atol):
        # How far off, against what was allowed: rounding (a reordered sum) or a bug.
        message += f"; the largest difference is {b.max_abs_error:.3g}, allowed {atol:g} + {rtol:g}·|expected|"
        if b.oracle is not None:
            message += (
                f"; against the exact result (the reference in double) it is off by "
                f"{_tolerances(b.oracle.candidate)} tolerances, the reference by "
                f"{_tolerances(b.oracle.reference)}"
            )
            if b.oracle.conditioned is not None:
                message += (
                    f", and by {_tolerances(b.oracle.conditioned)} where the exact result's own "
                    "movement under rounding of the inputs is allowed"
                )
        elif isinstance(b.need_atol, float) and isinstance(b.need_rtol, float):
            message += (
                f"; it would pass with atol = {b.need_atol:.2g} (rtol {rtol:g}) or rtol = "
                f"{b.need_rtol:.2g} (atol {atol:g}) — no exact oracle was available to say which "
                "of the two is closer to the truth"
            )
    return message


def _tolerances(x: float | str) -> str:
    return f"{x:.3g}" if isinstance(x, float) else str(x)


# The runner's phases outside its cases, as a verdict says where it stopped.
_STEPS = {
    "starting ahead": "while opening the GPU, started ahead of its job",
    "plan read": "while opening the GPU",
    "device ready": "while loading the kernels",
    "kernels loaded": "before the first kernel ran",
    "done": "after every case had run (at exit)",
}


def _describe_phase(phase: str, cases: list[Case]) -> str:
    if phase in _STEPS:
        return _STEPS[phase]
    fields = dict(part.split("=", 1) for part in phase.split() if "=" in part)
    try:
        label = cases[int(fields["case"])].label
    except (KeyError, ValueError, IndexError):
        return f"at {phase}"
    who_of = {
        "kernel": "the kernel",
        "reference": "the reference",
        "candidate": "the candidate",
        "oracle": "the oracle (the reference in double)",
    }
    if "kernel" in fields:
        who = who_of.get(fields["kernel"], fields["kernel"])
        if "dependence" in phase:
            return f"while probing which inputs {who}'s outputs depend on at {label}"
        return f"while running {who} at {label}, seed {fields.get('seed')}"
    if "waiting" in fields:
        who = who_of.get(fields["waiting"], fields["waiting"])
        return f"while timing at {label}: waiting for a launch of {who}"
    if "warmup" in phase:
        return f"while warming up at {label}"
    return f"while timing at {label}"


# ---- a file's kernel, from its path or its text -------------------------------------------------


def evaluate_file(
    path: str | Path,
    kernel: str,
    candidate: str | Path | None = None,
    options: EvalOptions | None = None,
) -> Verdict:
    """`optiml eval`: the kernel (or a candidate file's version of it) checked and timed on the GPU."""
    source, _, _ = load(path, kernel)  # the kernel and its spec before the candidate is read
    cand = SourceFile.read(candidate) if candidate else None
    return evaluate_source(source, kernel, cand, options)


def evaluate_source(
    source: SourceFile,
    kernel: str,
    candidate: SourceFile | None = None,
    options: EvalOptions | None = None,
) -> Verdict:
    """`evaluate_file` for text that need not be on disk (a worker's job)."""
    k = source.kernel(kernel)
    spec = parse_spec(source, k)
    if candidate is not None:
        candidate.kernel(k.name)
    find_toolkit()
    require_gpu("eval")
    with evaluated_at_run_time(source, k):  # a candidate's launch at the original's sizes
        return evaluate(source, k, spec, candidate, options or EvalOptions())
