"""The judge: before a variant is offered as faster, checks on what no one could have known in
advance. Every draw comes from the operating system's entropy, so neither a candidate nor anyone
reading this repository can know the sizes, seeds or values.

- unseen sizes and seeds: three sizes none of the spec's is — below the smallest declared, in
  between, and above the largest where the device's memory allows — spanning at least 8x in work,
  each dimension that the spec varies made odd with a random remainder modulo 64 (tails of every
  vector width and unroll factor), checked on fresh seeds and timed, with the dependence probes
  that give each size's physical floor (an evaluation below it is `below_floor`);
- work scaling: from the smallest to the largest of those sizes the candidate's time must grow
  at least as fast as the bytes its work must move allow at twice the device's bandwidth ceiling,
  less what the smallest spends beyond its own bytes (arithmetic the added bytes overlap with):
  a time that does not grow with the work means work skipped at some sizes (the *input's* times
  play no part: a naive kernel's time need not be proportional to its work);
- speedup at unseen sizes: the speedup claimed at the spec's first size must hold within
  `CLAIM_FACTOR` at the unseen size of most similar work (a kernel fast only at the declared sizes
  fails); the smaller unseen sizes are reported, not judged;
- inputs beyond the declared: the same candidate on other values than the spec's uniform ones —
  spikes at the ends and at random places (a dropped tail or a skipped element shows), a shifted
  and a wide range, negatives only, zeros, all equal, tiny (denormal) values, skewed integer keys —
  within any range the spec declares, with absolute tolerances scaled to the values' magnitude,
  and free float scalars at other values (`_scalar_variations`), at the smallest unseen size or
  one of `VARIATION_BYTES` where that is larger;
- device state: unless the spec says `state: kept`, function-local `static` variables the
  candidate adds to device code (which no harness can reset) are reported, and its added writable
  `__device__` variables are filled with noise before every launch (state one launch leaves for
  the next then gives wrong results);
- no hard-coded sizes (literals in the kernel's definition); compute-sanitizer's memcheck,
  initcheck and synccheck, two launches each at the spec's smallest size and the smallest unseen
  one (or an unseen size of `SANITIZE_BYTES` where that one is larger), and racecheck at one
  unseen size of about `RACECHECK_BYTES` (its cost grows with a tiled kernel's arithmetic);
- an LLM's review where a provider is configured.
"""

from __future__ import annotations

import logging
import math
import random
import re
import secrets
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from optiml.cuda.kernel_ast import KernelAST, walk
from optiml.cuda.source import SourceFile
from optiml.cuda.types import DTYPES
from optiml.errors import OptimlError
from optiml.executors.base import Executor, Job
from optiml.expr import ExprError
from optiml.harness.build import device_ptx
from optiml.harness.evaluate import CasePlan, EvalOptions
from optiml.harness.gpu import default_arch
from optiml.harness.inputs import Dist, Mode
from optiml.harness.nvcc import demangle
from optiml.harness.sanitize import TOOLS
from optiml.harness.verdict import Verdict
from optiml.search.trajectory import Check, JudgeVerdict, Measurement
from optiml.spec import Case, Launch, Spec

logger = logging.getLogger(__name__)

SPAN = 8.0  # the unseen sizes' work spans at least this factor
DRAWS = 16  # draws of an unseen size's remainders, the one of work nearest the target kept
SCALING_ALLOWANCE = 2.0  # added time for added work may beat the bandwidth ceiling by no more
# the least speed relative to the original a candidate keeps at every unseen size (measurement
# noise and a latency-bound corner; a kernel specialised to the declared sizes falls far below)
UNSEEN_SLOWDOWN = 0.8
# how far the speedup at the unseen size nearest the declared one may fall short of the claim
# (odd sizes that defeat vector paths cost up to ~2x in the controls; a special case, 10x and more)
CLAIM_FACTOR = 4.0
MEMORY_SHARE = 0.25  # of the device's memory, for one case's buffers (the harness keeps copies)
# The most bytes (all buffers) of the unseen size the sanitizers run at: a smaller unseen size of
# odd remainders where the smallest judged one is larger. Their cost grows with the work (racecheck
# on KernelBench's 2048 x 8192 x 4096 GEMM at its smallest unseen size took 52 s on an H100), and
# what they look for — an access out of bounds, a race, a barrier not reached by all — shows at
# the edge tiles and between blocks, which a size of a few MB has.
SANITIZE_BYTES = 16 << 20
# racecheck, which instruments every shared-memory access (its cost grows with a tiled kernel's
# arithmetic, not with its bytes: 24 s of a GEMM's 31 s judge at the sizes above), runs once, at
# an unseen size of about this many bytes with odd remainders: a race is between the threads of a
# block, in the inner tiles and the edge ones, which such a size has.
RACECHECK_BYTES = 1 << 20
# Inputs beyond the declared run at the smallest unseen size, or at an unseen size of about this
# many bytes with odd remainders where that one is larger: what they look for (a dropped tail, a
# skipped element, a spike, a range that cancels, a denormal flushed) is in the values and the
# tails, which such a size has; at the sizes themselves the three unseen sizes check the
# uniform draw. KernelBench's InstanceNorm's (1 GB at its smallest unseen size) took 17.8 s of
# its 31 s judge on an H100, and made its run 114 s of the 90 wanted (kb-33-34-h100.json).
VARIATION_BYTES = 64 << 20


def _work(spec: Spec, sizes: dict[str, int]) -> int:
    case = spec.case(sizes)
    return sum(case.lengths[b.name] * DTYPES[b.dtype].size for b in spec.buffers)


def _free_vars(spec: Spec) -> list[str]:
    """The size variables the spec itself varies (a variable with one declared value may be
    fixed by the kernel's code, e.g. a head dimension); all of them for a spec of one size."""
    varying = [v for v in spec.size_vars if len({s[v] for s in spec.sizes}) > 1]
    return varying or list(spec.size_vars)


def _sized(spec: Spec, base: dict[str, int], free: list[str], t: float, rng: random.Random):
    """`base` with the free variables scaled by `t`, each then given a random odd remainder
    modulo 64; None where the spec cannot be evaluated there."""
    sizes = dict(base)
    for v in free:
        x = max(1, round(base[v] * t))
        sizes[v] = x - x % 64 + rng.randrange(1, 64, 2) if x > 64 else rng.randrange(1, 64, 2)
    try:
        case = spec.case(sizes)
    except (ExprError, ValueError, ZeroDivisionError, OverflowError):
        return None
    if case.grid[1] > 65535 or case.grid[2] > 65535 or case.grid[0] > 2**31 - 1:
        return None
    return sizes


def _at_work(spec, base, free, target: float, rng) -> dict[str, int] | None:
    """A size whose work is close to `target` (bisection on one scale of the free variables)."""
    lo, hi = 1e-4, 1e4
    best = None
    base_work = _work(spec, base)
    for _ in range(40):
        t = math.sqrt(lo * hi)
        sizes = _sized(spec, base, free, t, random.Random(0))
        if sizes is None:
            hi = t
            continue
        w = _work(spec, sizes)
        best = t
        if w < target:
            lo = t
        else:
            hi = t
        if abs(w - target) < 0.02 * target:
            break
    if best is None or base_work == 0:
        return None
    # The remainders are drawn at that scale until a size's work lies near the target: a size
    # under 128 can double (or, under 64, grow tenfold) with its remainder, and five of them made
    # a size 18x the work wanted.
    drawn = [s for s in (_sized(spec, base, free, best, rng) for _ in range(DRAWS)) if s]
    return min(drawn, key=lambda s: abs(math.log(max(_work(spec, s), 1) / target)), default=None)


def unseen_sizes(
    spec: Spec, rng: random.Random, memory_bytes: int | None = None
) -> list[dict[str, int]]:
    """Three sizes none of the spec's is, spanning at least `SPAN`x in work: below the smallest
    declared, in between, above the largest (as far as the device's memory allows)."""
    works = {i: _work(spec, s) for i, s in enumerate(spec.sizes)}
    largest = spec.sizes[max(works, key=works.get)]
    w_max = max(works.values())
    limit = (memory_bytes or 16 << 30) * MEMORY_SHARE
    free = _free_vars(spec)
    big = min(w_max * rng.uniform(1.15, 1.5), limit)
    small = big / rng.uniform(SPAN * 1.1, SPAN * 1.6)
    mid = math.sqrt(small * big) * rng.uniform(0.8, 1.25)
    out: list[dict[str, int]] = []
    for target in (small, mid, big):
        sizes = _at_work(spec, largest, free, target, rng)
        if sizes is not None and sizes not in spec.sizes and sizes not in out:
            out.append(sizes)
    return out


def sanitizer_sizes(
    spec: Spec, unseen: list[dict[str, int]], rng: random.Random
) -> list[dict[str, int]]:
    """Where the sanitizers run: the spec's smallest size and the smallest unseen one, or, where
    that holds more than `SANITIZE_BYTES`, an unseen size of that many (odd remainders too)."""
    smallest = min(spec.sizes, key=lambda s: _work(spec, s))
    if not unseen:
        return [smallest]
    return [smallest, capped_unseen(spec, unseen[0], SANITIZE_BYTES, rng)]


def capped_unseen(
    spec: Spec, small: dict[str, int], cap: int, rng: random.Random
) -> dict[str, int]:
    """`small` (the smallest unseen size), or where it holds more than `cap` bytes an unseen size
    of about that many with odd remainders; `small` where none smaller can be made."""
    if _work(spec, small) <= cap:
        return small
    largest = max(spec.sizes, key=lambda s: _work(spec, s))
    sized = _at_work(spec, largest, _free_vars(spec), cap, rng)
    if sized is None or sized in spec.sizes or _work(spec, sized) > _work(spec, small):
        return small
    return sized


def racecheck_sizes(
    spec: Spec, where: list[dict[str, int]], rng: random.Random
) -> list[dict[str, int]]:
    """Where racecheck runs: an unseen size of about `RACECHECK_BYTES` (odd remainders), or the
    least of the other sanitizers' sizes where that is smaller or none can be made."""
    least = min(where, key=lambda s: _work(spec, s))
    largest = max(spec.sizes, key=lambda s: _work(spec, s))
    small = _at_work(spec, largest, _free_vars(spec), RACECHECK_BYTES, rng)
    if small is None or small in spec.sizes or _work(spec, small) >= _work(spec, least):
        return [least]
    return [small]


def _float_inputs(spec: Spec) -> list[str]:
    return [b.name for b in spec.buffers if b.role != "out" and DTYPES[b.dtype].is_float]


def value_variations(spec: Spec, case: Case, rng: random.Random) -> list[CasePlan]:
    """Input values other than the spec's uniform draw, within any range it declares."""
    plans: list[CasePlan] = []

    def each(make) -> dict[str, Dist]:
        out = {}
        for b in spec.buffers:
            if b.role == "out" or b.structure is not None:
                continue  # a structured input keeps its structure (offsets stay offsets)
            d = DTYPES[b.dtype]
            lo, hi = case.ranges.get(b.name, (d.low, d.high))
            dist = make(b, d, lo, hi, b.name in case.ranges)
            if dist is not None:
                out[b.name] = dist
        return out

    def spikes(b, d, lo, hi, declared):
        if d.is_float and not declared:
            return Dist(lo, hi, Mode.SPIKES, 64.0 * max(abs(lo), abs(hi), 1.0))
        if d.is_float:
            return Dist(lo, hi, Mode.SPIKES, hi - (hi - lo) / 1024)
        return Dist(lo, hi, Mode.SPIKES)

    def scaled(offset: float, scale: float):
        def make(b, d, lo, hi, declared):
            if not d.is_float or declared:
                return None
            return Dist(lo * scale + offset, hi * scale + offset)

        return make

    def constant(b, d, lo, hi, declared):
        if d.is_float:
            return Dist(lo + (hi - lo) * rng.uniform(0.55, 0.9), 0, Mode.CONSTANT)
        return Dist(int(lo) + rng.randrange(max(1, int(hi) - int(lo))), 0, Mode.CONSTANT)

    def zeros(b, d, lo, hi, declared):
        if not declared or lo <= 0 < hi:
            return Dist(0, 0, Mode.CONSTANT)
        return None

    def skewed(b, d, lo, hi, declared):
        if d.is_float:
            return None
        return Dist(lo, hi, Mode.SKEWED, int(lo) + rng.randrange(max(1, int(hi) - int(lo))))

    def narrow_top(b, d, lo, hi, declared):
        if not d.is_float or not declared:
            return None
        return Dist(hi - (hi - lo) / 16, hi)

    shift = rng.uniform(3, 6)
    wide = rng.choice((100.0, 1000.0))
    for note, make, tol_scale in (
        ("inputs: spikes", spikes, 1.0),
        ("inputs: shifted", scaled(shift, 1.0), 1.0 + shift),
        ("inputs: wide", scaled(0.0, wide), wide),
        ("inputs: negative", scaled(-0.5, 0.5), 1.0),
        ("inputs: tiny", scaled(0.0, 1e-40), 1.0),
        ("inputs: zeros", zeros, 1.0),
        ("inputs: all equal", constant, 1.0),
        ("inputs: skewed keys", skewed, 1.0),
        ("inputs: top of the range", narrow_top, 1.0),
    ):
        dists = each(make)
        if dists:
            plans.append(
                CasePlan(
                    sizes=case.sizes,
                    dists=dists,
                    tol_scale=tol_scale,
                    lenient=True,
                    timed=False,
                    note=note,
                )
            )
    scalars = _scalar_variations(spec, rng)
    if scalars:
        label = ", ".join(f"{k}={v:.4g}" for k, v in scalars.items())
        plans.append(
            CasePlan(sizes=case.sizes, scalars=scalars, timed=False, note=f"scalars: {label}")
        )
    return plans


def _scalar_variations(spec: Spec, rng: random.Random) -> dict[str, float]:
    """Float scalars whose value is a literal that no other expression of the spec uses, at
    another value of the same sign and a similar magnitude (a candidate that wires in the spec's
    value fails; one that reads the scalar cannot)."""
    from optiml.expr import Expr

    used: set[str] = set()
    for b in spec.buffers:
        used |= Expr.parse(b.length).names()
        if b.value_range:
            used |= Expr.parse(b.value_range[0]).names() | Expr.parse(b.value_range[1]).names()
    for text in [*spec.launch.grid, *spec.launch.block, spec.launch.smem]:
        used |= Expr.parse(text).names()
    out = {}
    for s in spec.scalars:
        if not DTYPES[s.dtype].is_float or s.name in used:
            continue
        expr = Expr.parse(s.value)
        if expr.names():
            continue
        value = float(expr.evaluate({}))
        out[s.name] = value * rng.uniform(1.3, 2.0) if value else rng.uniform(0.25, 1.0)
    return out


def hardcoded_constants(
    original: SourceFile,
    candidate: SourceFile,
    kernel: str,
    spec: Spec,
    launch: Launch | None = None,
) -> list[int]:
    """Integer literals of the candidate's kernel equal to a problem-size value of the spec (over
    255) that the input's kernel does not have: a variant that wires in the size it was tested at.
    `__launch_bounds__`'s arguments are not read: they bound the block's resources (a block of 256
    threads where a dimension is 256 is no wired-in size), and a kernel cannot compute with them.
    Nor are the numbers of the candidate's own `launch` (its spec's) and their products: a kernel
    launched with blocks of 512 strides by 512, and a cluster of 8 such blocks by 4,096, whatever
    the problem's sizes (KernelBench's InstanceNorm: planes of 512 x 512, whose cluster per row
    the judge turned down for its block's 512)."""
    values = {v for s in spec.sizes for v in s.values() if v > 255}
    for s in spec.sizes:
        case = spec.case(s)
        values |= {v for v in case.lengths.values() if v > 255}
    if launch is not None:
        texts = [*launch.grid, *launch.block, launch.smem]
        own = {int(n) for t in texts for n in re.findall(r"\b\d+\b", t)}
        values -= own | {a * b for a in own for b in own}

    def literals(src: SourceFile) -> set[int]:
        ast = KernelAST(src, src.kernel(kernel))
        bounds = [n for n in walk(ast.outer) if n.type == "launch_bounds"]
        every = Counter(ast.int_literals())
        every.subtract(v for n in bounds for v in ast.int_literals(n))
        return {v for v, count in every.items() if count > 0}

    return sorted((literals(candidate) - literals(original)) & values)


def local_statics(source: SourceFile) -> list[str]:
    """Function-local `static` variables of device code that are not constants: state that lives
    from one launch to the next and that no harness can reach to reset."""
    return [text for text, _ in _local_statics(source)]


def _local_statics(source: SourceFile) -> list[tuple[str, str]]:
    """`local_statics` with each one's variable name."""
    found = []

    def walk(node, in_device: bool):
        if node.type == "function_definition":
            in_device = in_device or any(
                c.type in ("__device__", "__global__") for c in node.children
            )
        if in_device and node.type == "declaration" and node.parent.type != "translation_unit":
            words = {
                source.node_text(c)
                for c in node.children
                if c.type in ("storage_class_specifier", "type_qualifier")
            }
            # `static __shared__` lives for a block, not from one launch to the next
            if "static" in words and not words & {
                "const",
                "constexpr",
                "__constant__",
                "__shared__",
            }:
                line = node.start_point[0] + 1
                text = f"line {line}: {source.node_text(node).strip()[:60]}"
                for d in node.children_by_field_name("declarator"):
                    while d is not None and d.type != "identifier":
                        d = d.child_by_field_name("declarator")
                    found.append((text, source.node_text(d) if d is not None else ""))
        for child in node.children:
            walk(child, in_device)

    walk(source.tree.root_node, False)
    return found


# Device memory as PTX declares it at module scope: `.global .align 16 .b8 NAME[...]`, `.visible
# .global .align 4 .u32 NAME;` (a function-local static's NAME is `_ZZ...E<len><name>`, with a
# discriminator `_N` where a function has several of that name).
_PTX_GLOBAL = re.compile(r"^\s*(?:\.(?:visible|weak|extern)\s+)*\.global\s([^;=]*)", re.M)
_DISCRIMINATOR = re.compile(r"_\d*_?$")


def ptx_globals(ptx: str) -> set[str]:
    """The names of the variables in global memory that PTX declares."""
    out = set()
    for decl in _PTX_GLOBAL.findall(ptx):
        words = re.sub(r"\[[^\]]*\]", "", decl).split()
        if words:
            out.add(words[-1])
    return out


def _local_name(mangled: str) -> str | None:
    """The variable's own name at the end of a local entity's mangled name: `...E<len><name>`,
    with `_<n>` (or `__<n>_`) after it where the function has several of that name."""
    for m in reversed(list(re.finditer(r"E(\d+)", mangled))):
        n, rest = int(m.group(1)), mangled[m.end() :]
        if len(rest) == n or (len(rest) > n and _DISCRIMINATOR.fullmatch(rest[n:])):
            return rest[:n]
    return None


def _mangled_variable(qualified: str) -> str:
    """How PTX names a namespace-scope `__device__` variable: `hits`, or `_ZN2ns4hitsE` for
    `ns::hits`."""
    parts = qualified.split("::")
    if len(parts) == 1:
        return qualified
    return "_ZN" + "".join(f"{len(p)}{p}" for p in parts) + "E"


def compiled_globals(source: SourceFile, kernel, spec: Spec, arch: str | None) -> set[str] | None:
    """The variables in global memory that the compiled device code of `source` holds (a
    template's static or variable exists only where it is instantiated and used), or None where
    the PTX cannot be had (no nvcc, a compile error). `arch`: as the evaluation's (None: the
    spec's, else the local GPU's, as a build resolves it; which statics a kernel instantiates does
    not depend on it)."""
    arch = arch or spec.arch or default_arch()
    instantiations = {kernel.name: spec.instantiation} if spec.instantiation else {}
    try:
        ptx = device_ptx(source, instantiations, arch=arch)
    except OptimlError:
        return None
    return None if ptx is None else ptx_globals(ptx)


def reachable_statics(source: SourceFile, kernel, spec: Spec, arch: str | None) -> set[str] | None:
    """The names of the function-local statics that the compiled device code of `source` holds,
    or None where the PTX cannot be had."""
    found = compiled_globals(source, kernel, spec, arch)
    if found is None:
        return None
    return {n for g in found if g.startswith("_ZZ") and (n := _local_name(g))}


def hidden_state(
    candidate: SourceFile, original: SourceFile, kernel, spec: Spec, arch: str | None
) -> list[str]:
    """Device memory the candidate's compiled code holds that the original's does not, which is
    neither a function-local static (reported with its line) nor a `__device__` variable of the
    file (filled with noise between launches): a variable template, say. [] where the PTX
    cannot be had."""
    cand = compiled_globals(candidate, kernel, spec, arch)
    orig = compiled_globals(original, kernel, spec, arch) if cand else None
    if not cand or orig is None:
        return []
    poisoned = {_mangled_variable(v) for v in candidate.device_variables}
    hidden = sorted(g for g in cand - orig if not g.startswith("_ZZ") and g not in poisoned)
    names = demangle(hidden)
    return [f"device memory `{names.get(g, g)}` that no launch resets" for g in hidden]


def _failed_case(v: Verdict) -> str:
    return f"{v.status} ({v.check}): {v.message}"


async def judge(
    executor: Executor,
    job: Job,
    options: EvalOptions,
    at_first_size: Measurement,
    *,
    sanitize: bool = True,
    llm_review: Any | None = None,
    until_rejected: bool = False,
) -> JudgeVerdict:
    """Judge `job`'s candidate. `at_first_size` is its confirmed measurement at the first size;
    `llm_review`, if given, is an async callable returning a dict verdict. `until_rejected`: stop
    at the first stage with a failed check (the search has other candidates to judge: the rest
    would cost their time for a verdict already given; an accepted one runs every check)."""
    rng = random.Random(secrets.randbits(64))
    checks = _Timed()
    spec = job.spec
    candidate = job.candidate or job.source

    def rejected() -> JudgeVerdict | None:
        if until_rejected and not all(c.ok for c in checks):
            return JudgeVerdict(accepted=False, checks=list(checks))
        return None

    def os_seeds(k: int = 2) -> tuple[int, ...]:
        return tuple(secrets.randbits(62) | 1 for _ in range(k))

    # Unseen sizes and seeds, timed, each with its physical floor.
    sizes = unseen_sizes(spec, rng, at_first_size.memory_bytes)
    label = "; ".join(", ".join(f"{k}={v}" for k, v in s.items()) for s in sizes)
    sized = await executor.evaluate(
        job,
        replace(
            options,
            cases=[CasePlan(sizes=s, timed=True) for s in sizes],
            seeds=os_seeds(),
            dependence=16,
            time_all_sizes=True,
            reps_min=10,
            target_ms=200.0,
        ),
    )
    checks.append(
        Check(
            name="unseen sizes and seeds",
            ok=sized.status == "ok",
            detail=f"ok at {label}" if sized.ok else _failed_case(sized),
        )
    )
    if sized.ok:
        checks.append(_scaling(sized))
        checks.append(_unseen_speed(sized, spec, sizes, at_first_size.speedup))
    if early := rejected():
        return early

    # Inputs and scalars beyond the spec's uniform draw, at the smallest unseen size (or one of
    # `VARIATION_BYTES` where that is larger).
    if sizes:
        small = spec.case(capped_unseen(spec, sizes[0], VARIATION_BYTES, rng))
        plans = value_variations(spec, small, rng)
        if plans:
            varied = await executor.evaluate(
                job, replace(options, cases=plans, seeds=os_seeds(), time=False)
            )
            names = ", ".join(p.note.split(": ", 1)[1] for p in plans)
            checks.append(
                Check(
                    name="inputs beyond the declared",
                    ok=varied.ok,
                    detail=f"ok at {small.label} with {names}"
                    if varied.ok
                    else _failed_case(varied),
                )
            )

    if early := rejected():
        return early

    # Device state (unless the spec says the kernel keeps some on purpose: `state: kept`).
    if spec.state_kept:
        checks.append(
            Check(name="no state across launches", ok=True, detail="kept (the spec allows it)")
        )
    else:
        checks.append(await _state_check(executor, job, options, candidate, sizes, os_seeds))

    launch = job.target[2].launch  # the candidate's own (the input's where it is judged)
    constants = hardcoded_constants(job.source, candidate, job.kernel.name, spec, launch)
    checks.append(
        Check(
            name="no hard-coded sizes",
            ok=not constants,
            detail="none"
            if not constants
            else f"the kernel now contains {', '.join(map(str, constants))}, a problem size",
        )
    )
    if early := rejected():
        return early
    if sanitize:
        where = sanitizer_sizes(spec, sizes, rng)
        for tool in TOOLS:
            at = racecheck_sizes(spec, where, rng) if tool == "racecheck" else where
            try:
                report = await executor.sanitize(job, tool, at)
            except OptimlError as e:
                checks.append(Check(name=tool, ok=False, detail=f"could not run: {e}"))
                continue
            detail = (
                f"0 errors, 2 launches at {report.size}"
                if report.ok
                else f"{report.errors} error(s) at {report.size}: {'; '.join(report.messages[:2])}"
            )
            checks.append(Check(name=tool, ok=report.ok, detail=detail))
            if early := rejected():
                return early
    llm = None
    if llm_review is not None:
        try:
            llm = await llm_review()
        except Exception as e:  # the LLM's opinion is advisory; its failure is recorded
            logger.warning("LLM judge failed: %s", e)
            llm = {"error": str(e)}
        # Only a verdict is a check: "uncertain" (accept None) is recorded in `llm` and rejects
        # nothing.
        if llm and isinstance(llm.get("accept"), bool):
            checks.append(
                Check(name="LLM review", ok=llm["accept"], detail=str(llm.get("reason", "")))
            )
    return JudgeVerdict(accepted=all(c.ok for c in checks), checks=checks, llm=llm)


class _Timed(list):
    """The judge's checks, each stamped with the wall seconds since the one before it: what its
    verdict took (one decided from another's run takes about none)."""

    def __init__(self) -> None:
        super().__init__()
        self._last = time.perf_counter()

    def append(self, check: Check) -> None:
        now = time.perf_counter()
        check.seconds = round(now - self._last, 2)
        self._last = now
        super().append(check)


async def _state_check(
    executor: Executor,
    job: Job,
    options: EvalOptions,
    candidate: SourceFile,
    sizes: list[dict[str, int]],
    os_seeds: Callable[[], tuple[int, ...]],
) -> Check:
    """Function-local statics the candidate added, and its added `__device__` variables filled
    with noise between launches: results that change mean state one launch leaves for the next."""
    found = _local_statics(candidate) if job.candidate is not None else []
    original_state = set(local_statics(job.source))
    found = [(text, name) for text, name in found if text not in original_state]
    if found:
        # only those the compiled kernel holds: a template's static that this instantiation never
        # uses does not exist (where the PTX cannot be had, every one found counts)
        _, kernel, spec = job.target
        reachable = reachable_statics(candidate, kernel, spec, options.arch)
        if reachable is not None:
            found = [(text, name) for text, name in found if name in reachable]
    state = list(dict.fromkeys(text for text, _ in found))
    if job.candidate is not None:
        _, kernel, spec = job.target
        state += hidden_state(candidate, job.source, kernel, spec, options.arch)
    variables = [v for v in candidate.device_variables if v not in set(job.source.device_variables)]
    if variables and sizes:
        poisoned = await executor.evaluate(
            job,
            replace(
                options,
                cases=[CasePlan(sizes=sizes[0], timed=False)],
                seeds=os_seeds(),
                time=False,
                state_poison=True,
            ),
        )
        if not poisoned.ok:
            state.append(
                f"results change when {', '.join(variables)} are reset between launches: "
                + _failed_case(poisoned)
            )
    return Check(
        name="no state across launches",
        ok=not state,
        detail="none"
        if not state
        else "; ".join(state) + " (a kernel that keeps state between launches is not reentrant)",
    )


def _unseen_speed(
    v: Verdict, spec: Spec, sizes: list[dict[str, int]], claimed: float | None
) -> Check:
    """The speedup claimed at the spec's first size must hold, within `CLAIM_FACTOR`, at the unseen
    size of most similar work, and the candidate may not be slower there than `UNSEEN_SLOWDOWN`
    times the original: a win at the declared sizes that shrinks or turns into a loss at others is
    a kernel specialised to what the spec happens to declare. Smaller unseen sizes are reported,
    not judged: a kernel tiled for large problems may honestly lose at a latency-bound one."""
    timed = [(s, c) for s, c in zip(sizes, v.cases, strict=False) if c.timing and c.timing.speedup]
    if not timed:
        return Check(name="speedup at unseen sizes", ok=True, detail="not timed (no reference)")
    shown = ", ".join(f"{c.timing.speedup:.2f}× at {c.label}" for _, c in timed)
    target = _work(spec, spec.sizes[0])
    _, near = min(timed, key=lambda t: abs(math.log(max(_work(spec, t[0]), 1) / max(target, 1))))
    need = max(UNSEEN_SLOWDOWN, (claimed or 0.0) / CLAIM_FACTOR)
    got = near.timing.speedup
    claim = f"the claim is {claimed:.2f}× at {spec.case(spec.sizes[0]).label}" if claimed else ""
    return Check(
        name="speedup at unseen sizes",
        ok=got >= need,
        detail=f"{got:.2f}× at {near.label}, the unseen size nearest the declared one "
        f"({claim + '; ' if claim else ''}at least {need:.2f}× needed); at every unseen size: {shown}",
    )


def _scaling(v: Verdict) -> Check:
    """From the smallest to the largest timed size, the candidate's added time must be at least
    what the added bytes of its work take at `SCALING_ALLOWANCE` times the device's ceiling, less
    the time the smallest spends beyond moving its own bytes at the ceiling (where the added bytes
    can overlap with its arithmetic or latency).
    Only sizes whose reads were probed count: an unprobed one's floor counts no reads (KernelBench's
    large-K GEMM: its largest unseen size, unprobed, came out 0 bytes and "smallest")."""
    floored = [c for c in v.cases if c.timing and c.floor]
    timed = [c for c in floored if c.reads_probed]
    if len(timed) < 2:
        why = "no floor on this device" if len(floored) < 2 else "too few sizes with probed reads"
        return Check(name="work scaling", ok=True, detail=f"not measured ({why})")
    timed.sort(key=lambda c: c.floor.bytes)
    lo, hi = timed[0], timed[-1]
    added_bytes = hi.floor.bytes - lo.floor.bytes
    lo_ms = lo.timing.candidate.min_ms
    added_ms = hi.timing.candidate.min_ms - lo_ms
    # What the smaller size spends beyond moving its own bytes at the ceiling (arithmetic, latency)
    # is time the added bytes can overlap with: a compute-bound kernel's time follows its
    # arithmetic, not its bytes (KernelBench's 5 x 9 convolution: its larger unseen size read
    # 3.4x the bytes for 1.15x the arithmetic and ran 3 us faster than the smaller one).
    hidden_ms = max(0.0, lo_ms - lo.floor.bytes / (lo.floor.ceiling_gbs * 1e9) * 1e3)
    need_ms = added_bytes / (hi.floor.ceiling_gbs * SCALING_ALLOWANCE * 1e9) * 1e3 - hidden_ms
    ratio = hi.floor.bytes / lo.floor.bytes if lo.floor.bytes else float("inf")
    ok = added_ms >= need_ms
    return Check(
        name="work scaling",
        ok=ok,
        detail=f"from {lo.label} to {hi.label} the work's bytes grow {ratio:.3g}x "
        f"(+{added_bytes / 1e6:.4g} MB) and the time by {added_ms:+.4g} ms"
        + (
            ""
            if ok
            else f", less than the {need_ms:.4g} ms those bytes need at twice the device's ceiling"
            + (
                f" beyond the {hidden_ms:.4g} ms the smaller size spends on more than its bytes"
                if hidden_ms
                else ""
            )
        ),
    )
