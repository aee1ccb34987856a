"""Contractions scheduled from the lifted model (optiml.lift.contraction) rather than matched in the
text: a kernel whose model is a thread per output element of `f(seed + sum over k of a * b)` gets
`_gemm`'s register-blocked SGEMM tiles with each operand's layout (k contiguous or not, the leading
dimension) from its strides, a batch on blockIdx.z with its strides as pointer offsets, and the
epilogue (guard, seed, alpha/beta, bias, activation, the output's type) written back from the model
by optiml.lift.emit, so that every spelling of the same GEMM gets the same kernel.

fp32 operands with an fp32 sum: FFMA tiles (`optiml_sgemm::Tiling`). Kernels `gemm_tiling` matches
in the text are left to it (its configs were measured on that spelling)."""

from __future__ import annotations

import re

from optiml.cuda.types import DTYPES
from optiml.expr import Expr as SizeExpr
from optiml.expr import ExprError
from optiml.lift import Lifted, lift
from optiml.lift.contraction import Contraction, NotOne, contraction
from optiml.lift.emit import CEmitter, NotEmittable
from optiml.lift.families import Affine, affine, global_indices
from optiml.lift.model import BF16, FLOAT, HALF, INT, LONG, Const, Expr, Param
from optiml.search.catalog import _hmma, gemm_tiling
from optiml.search.catalog._gemm import HELPERS, Config, match, render, split_count
from optiml.search.catalog.base import Context, Rewrite, Transformation

# The names the schedule gives the model's indices inside the epilogue.
NAMES = {"m": "optiml_m", "n": "optiml_n", "batch": "optiml_batch"}


class _NoPlan(Exception):
    pass


class ContractionTiling(Transformation):
    name = "contraction_tiling"
    addresses = frozenset({"l1_shared", "l2", "dram", "uncoalesced", "compute", "latency"})
    description = (
        "GEMM tiles from the lifted model: any layout of each operand, batched on blockIdx.z, "
        "the epilogue emitted from the model"
    )

    def propose(self, ctx: Context) -> list[Rewrite]:
        try:
            c = read(ctx)
            if c is None or match(ctx.ast) is not None:
                return []
            extents, batch = launch_extents(ctx, c)
            if c.kind != "matrix-matrix" or c.acc_type != FLOAT:
                return []
            if c.input_types == (FLOAT, FLOAT):
                return _fp32(ctx, c, extents, batch)
            if c.input_types in ((HALF, HALF), (BF16, BF16)) and _admits_mma(ctx, c, extents):
                return _mma(ctx, c, extents, batch)
            return []
        except (_NoPlan, NotEmittable, ExprError, KeyError, ValueError):
            return []


def read(ctx: Context) -> Contraction | None:
    """The kernel's contraction, or None where it does not lift to one."""
    lifted = lift(ctx.source, ctx.kernel, ctx.spec)
    if not isinstance(lifted, Lifted):
        return None
    try:
        return contraction(lifted)
    except NotOne:
        return None


def launch_extents(ctx: Context, c: Contraction) -> tuple[list[tuple[int, int]], str | None]:
    """(M, N) at every problem size (N = 1 for a vector), where the original launch covers every
    output index with a thread (one a launch leaves out would now be computed), and the batch
    count as a spec expression (None without a batch)."""
    out = []
    for sizes in ctx.spec.sizes:
        case = ctx.spec.case(sizes)
        env = ctx.env(case)
        values = {}
        if c.flat is not None:
            values = _flat_extents(c, case, env)
            out.append((values["m"], values.get("n", 1)))
            continue
        for axis, atom in c.atoms.items():
            d = "xyz".index(atom[-1])
            spelled = c.block.get(atom[-1])
            if spelled is not None and spelled != case.block[d]:
                raise _NoPlan("a block size the kernel spells differs from the launch's")
            covered = case.grid[d] * (case.block[d] if atom.startswith("g.") else 1)
            extent = c.extents[axis]
            value = covered if extent is None else SizeExpr.parse(render(extent)).evaluate(env)
            if not isinstance(value, int) or value <= 0 or covered < value:
                raise _NoPlan(f"the launch does not cover the {axis} index")
            values[axis] = value
        used = {atom[-1] for atom in c.atoms.values()}
        for d, dim in enumerate("xyz"):
            if dim not in used and (case.grid[d], case.block[d]) != (1, 1):
                raise _NoPlan("threads along a dimension the output does not use")
        out.append((values["m"], values.get("n", 1)))
    if "batch" not in c.atoms:
        return out, None
    if c.extents["batch"] is not None:
        return out, render(c.extents["batch"])
    grid, block, _ = ctx.launch
    atom = c.atoms["batch"]
    z = f"({grid[2]})" if len(grid) > 2 else "1"
    return out, z if atom == "blockIdx.z" else f"{z} * ({block[2] if len(block) > 2 else 1})"


def _flat_extents(c: Contraction, case, env: dict) -> dict[str, int]:
    """The axes' extents of a contraction read from a flat index (every one bounded by the
    guard), where the original 1-D launch runs a thread for each of their elements."""
    flat = c.flat
    assert flat is not None
    if flat.block is not None and flat.block != case.block[0]:
        raise _NoPlan("a block size the kernel spells differs from the launch's")
    if (case.grid[1], case.block[1], case.grid[2], case.block[2]) != (1, 1, 1, 1):
        raise _NoPlan("threads along a dimension the output does not use")
    values, total = {}, 1
    for axis in c.atoms:
        extent = c.extents[axis]
        if extent is None:
            raise _NoPlan(f"no bound on the {axis} index")
        value = SizeExpr.parse(render(extent)).evaluate(env)
        if not isinstance(value, int) or value <= 0:
            raise _NoPlan(f"the {axis} index's extent is not a positive integer")
        values[axis] = value
        total *= value
    if case.grid[0] * case.block[0] < total:
        raise _NoPlan("the launch does not cover the output")
    return values


class Emitter(CEmitter):
    """The model's expressions with the output's thread indices by the schedule's names: an
    integer affine form over them (and the kernel's integer parameters) is written from its form,
    in 64 bits, however the kernel spelled it."""

    def __init__(self, atoms: dict[str, str], names: dict[int, str]):
        super().__init__(names)
        self.atoms = {atom: NAMES[axis] for axis, atom in atoms.items()}

    def expr(self, e: Expr) -> str:
        if e.type in (INT, LONG) and not isinstance(e, Const | Param):
            f = affine(e)
            if f is not None:
                f = global_indices(f)
                if all(a in self.atoms or _is_param(a) for m in f for a in m):
                    named = {tuple(self.atoms.get(a, a) for a in m): c for m, c in f.items()}
                    return f"({render(named, wide=True)})"
        return super().expr(e)


def _is_param(atom: str) -> bool:
    return not atom.startswith(("g.", "threadIdx", "blockIdx", "blockDim", "gridDim", "stride."))


def epilogue(c: Contraction, acc: str, indent: str) -> list[str]:
    """The per-element code after the sum: the guard (an element outside it is left alone), the
    seed added to the sum, the store of the model's value in the output's type; every index
    written from its affine form, whatever its spelling."""
    total = "optiml_sum"
    em = Emitter(c.atoms, {c.acc.var.uid: total})
    # the guard is the conjunction of the extents' bounds (`contraction` reads no other)
    bounds = [f"{NAMES[axis]} < {render(e)}" for axis, e in sorted(c.extents.items()) if e]
    lines = [f"{indent}if (!({' && '.join(bounds)})) return;"]
    seed = f"{em.expr(c.seed)} + " if c.seed is not None else ""
    lines.append(f"{indent}const float {total} = {seed}{acc};")
    value = em.expr(c.store.value)
    if c.store.value.type != c.out.dtype:
        value = em.cast(value, c.store.value.type, c.out.dtype)
    lines.append(f"{indent}{c.store.tensor}[{em.expr(c.store.index)}] = {value};")
    return lines


def base(c: Contraction, which: str) -> str:
    """An operand's pointer at the batch's matrix and the loop's first k."""
    op = getattr(c, which)
    form: Affine = dict(op.offset)
    for axis, name in (("batch", NAMES["batch"]), ("k", None)):
        stride = op.stride(axis)
        scale = {(name,): 1} if name else c.k_start
        for mono, coef in stride.items():
            for m2, c2 in scale.items():
                key = tuple(sorted(mono + m2))
                form[key] = form.get(key, 0) + coef * c2
    form = {m: v for m, v in form.items() if v}
    return f"{op.tensor} + {render(form, wide=True)}" if form else op.tensor


def head(ctx: Context, threads: int, min_blocks: int, cluster: int = 0) -> str:
    """The kernel's declaration with `__launch_bounds__` for the new block, and (`cluster` > 1)
    cluster dimensions (1, 1, cluster), spelled as the attribute `__cluster_dims__` stands for,
    which the C++ grammar reads in this place."""
    text = ctx.source.text[ctx.kernel.span.start : ctx.kernel.body_span.start]
    bounds = f"__launch_bounds__({threads}, {min_blocks})"
    if cluster > 1:
        bounds = f"__attribute__((cluster_dims(1, 1, {cluster}))) {bounds}"
    if "__launch_bounds__" in text:
        return re.sub(r"__launch_bounds__\s*\([^)]*\)", bounds, text, count=1)
    at = ctx.kernel.name_span.start - ctx.kernel.span.start
    return f"{text[:at]}{bounds} {text[at:]}"


def _fp32(
    ctx: Context, c: Contraction, extents: list[tuple[int, int]], batch: str | None
) -> list[Rewrite]:
    lda, ldb = c.a.leading("m"), c.b.leading("n")
    if lda is None or ldb is None:
        return []
    m, n, k = (render(x) for x in (c.extents["m"], c.extents["n"], c.k_extent))
    out = []
    for config, weight in gemm_tiling._ranked(ctx, extents[0]):
        if not config.fits(c) or any(
            -(-mm // config.bm) > gemm_tiling.MAX_GRID_Y for mm, _ in extents
        ):
            continue
        out.append(_fp32_variant(ctx, c, config, weight, batch, lda, ldb, (m, n, k)))
        split = split_k(ctx, c, config, extents[0], batch)
        if split:
            weight += gemm_tiling.SPLIT_GAIN if split[1] else 0.0
            out.append(_fp32_variant(ctx, c, config, weight, batch, lda, ldb, (m, n, k), split[0]))
    return sorted(out, key=lambda p: -p.weight)


def split_k(
    ctx: Context, c: Contraction, config: Config, main: tuple[int, int], batch: str | None
) -> tuple[int, bool] | None:
    """`_gemm.split_count` for `config` at the main problem size (K and the batch count from it)."""
    try:
        k = ctx.value(render(c.k_extent))
        z = ctx.value(batch) if batch is not None else 1
    except ExprError:
        return None
    if not isinstance(k, int) or not isinstance(z, int) or z < 1:
        return None
    kc = (c.a.k_contiguous, c.b.k_contiguous)
    return split_count(config, main, k, z, ctx.sm_count, kc)


def _run_tile(
    c: Contraction, smem: str, call: str, lds: tuple, mnk: tuple[str, str, str]
) -> list[str]:
    """The tile template's call (`run`, `run_split<S>`) with the epilogue as its lambda, and the
    kernel body's end."""
    args = ", ".join([smem, base(c, "a"), render(lds[0]), base(c, "b"), render(lds[1]), *mnk])
    lines = [
        f"    optiml_tile::{call}({args}, [=](int {NAMES['m']}, int {NAMES['n']}, "
        "float optiml_acc) {"
    ]
    lines += epilogue(c, "optiml_acc", " " * 8)
    return [*lines, "    });", "}"]


def _fp32_variant(
    ctx: Context,
    c: Contraction,
    config: Config,
    weight: float,
    batch: str | None,
    lda,
    ldb,
    mnk: tuple[str, str, str],
    split: int = 0,
) -> Rewrite:
    """One FFMA config's variant: a block per tile of C, or (`split` > 1) a cluster of that many
    blocks per tile, each summing its share of K."""
    m, n, k = mnk
    flags = f"{str(c.a.k_contiguous).lower()}, {str(c.b.k_contiguous).lower()}"
    targs = (
        f"{config.bm}, {config.bn}, {config.bk}, {config.rm}, {config.rn}, {config.stages}, "
        f"{flags}, {config.reg_vecs}"
    )
    lines = [
        "{",
        f"    // From the lifted model: {c.out.tensor} = f(sum over k of {c.a.tensor} * "
        f"{c.b.tensor}), {config.bm} x {config.bn} tiles in K steps of {config.bk}"
        + (f", K split over a cluster of {split} blocks" if split else ""),
        f"    using optiml_tile = optiml_sgemm::Tiling<{targs}>;",
        "    __shared__ float4 optiml_smem[optiml_tile::"
        + ("SPLIT_VECS];" if split else "SMEM_VECS];"),
    ]
    if batch is not None:
        z = f"blockIdx.z / {split}" if split else "blockIdx.z"
        lines.append(f"    const long long {NAMES['batch']} = {z};")
    call = f"run_split<{split}>" if split else "run"
    lines += _run_tile(c, "optiml_smem", call, (lda, ldb), mnk)
    grid = [f"cdiv({n}, {config.bn})", f"cdiv({m}, {config.bm})"]
    if batch is not None:
        grid.append(f"({batch}) * {split}" if split else batch)
    elif split:
        grid.append(str(split))
    variant = ctx.rewrite(
        head(ctx, config.threads, config.min_blocks, cluster=split) + "\n".join(lines),
        launch=(grid, [str(config.threads)], "0"),
        helpers="" if gemm_tiling._has_helpers(ctx) else HELPERS,
    )
    layout = f"{c.a.tensor} {'k' if c.a.k_contiguous else 'm'}-contiguous, {c.b.tensor} " + (
        "k-contiguous" if c.b.k_contiguous else "n-contiguous"
    )
    summary = (
        f"from the lifted model: {config.bm}x{config.bn}x{config.bk} smem tiles, "
        f"{config.tm}x{config.tn} FFMA per thread ({config.threads} threads), "
        f"{config.stages} stages; {layout}"
        + (", batched on blockIdx.z" if batch else "")
        + (
            f"; K split over a cluster of {split} blocks summed in distributed shared memory"
            if split
            else ""
        )
    )
    params = {**config.params, "split_k": split} if split else config.params
    return Rewrite(params, summary, variant, weight)


# The tensor cores' fp32 accumulation keeps fewer bits below the largest addend than IEEE fp32's
# round-to-nearest (products are exact, sums are aligned and truncated): taken as 2 bits, a unit
# roundoff of 2^-22. A reordered sum of K terms drifts by about sqrt(K) such units (relative to the
# sum of magnitudes); the output's tolerance must admit 4 times that at the largest K.
MMA_UNIT = 2.0**-22
MMA_MARGIN = 4.0


def _admits_mma(ctx: Context, c: Contraction, extents: list[tuple[int, int]]) -> bool:
    """Whether the output's tolerance (the spec's, else its type's default) admits a sum of
    16-bit products accumulated in fp32 on the tensor cores in another order."""
    out = next(b for b in ctx.spec.buffers if b.name == c.out.tensor)
    rtol, atol = ctx.spec.tolerance(DTYPES[out.dtype])
    k_extent = SizeExpr.parse(render(c.k_extent))
    k = max(k_extent.evaluate(ctx.env(case)) for case in ctx.spec.cases())
    return max(rtol, atol) >= MMA_MARGIN * MMA_UNIT * max(k, 1) ** 0.5


def _mma(
    ctx: Context, c: Contraction, extents: list[tuple[int, int]], batch: str | None
) -> list[Rewrite]:
    lda, ldb = c.a.leading("m"), c.b.leading("n")
    if lda is None or ldb is None:
        return []
    ctype = {HALF: "__half", BF16: "__nv_bfloat16"}[c.a.dtype]
    m, n, k = (render(x) for x in (c.extents["m"], c.extents["n"], c.k_extent))
    main = extents[0]
    small = -(-main[0] // 128) * -(-main[1] // 128) < ctx.sm_count
    ranked = (
        [(cf, w + 1.0) for cf, w in _hmma.SMALL] + _hmma.CONFIGS
        if small
        else _hmma.CONFIGS + _hmma.SMALL
    )
    out = []
    for config, weight in ranked:
        if any(-(-mm // config.bm) > gemm_tiling.MAX_GRID_Y for mm, _ in extents):
            continue
        flags = f"{str(c.a.k_contiguous).lower()}, {str(c.b.k_contiguous).lower()}"
        targs = (
            f"{ctype}, {config.bm}, {config.bn}, {config.bk}, {config.warps_m}, "
            f"{config.warps_n}, {config.stages}, {flags}"
        )
        lines = [
            "{",
            f"    // From the lifted model: {c.out.tensor} = f(sum over k of {c.a.tensor} * "
            f"{c.b.tensor}) on the tensor cores (mma.sync m16n8k16, fp32 accumulators)",
            f"    using optiml_tile = optiml_hgemm::Mma<{targs}>;",
            "    extern __shared__ float4 optiml_dsmem[];",
        ]
        if batch is not None:
            lines.append(f"    const long long {NAMES['batch']} = blockIdx.z;")
        lines += _run_tile(c, "optiml_dsmem", "run", (lda, ldb), (m, n, k))
        grid = [f"cdiv({n}, {config.bn})", f"cdiv({m}, {config.bm})"]
        if batch is not None:
            grid.append(batch)
        smem = config.smem_bytes(c.a.k_contiguous, c.b.k_contiguous)
        has = "#define OPTIML_HGEMM_MMA" in ctx.source.text
        variant = ctx.rewrite(
            head(ctx, config.threads, 1) + "\n".join(lines),
            launch=(grid, [str(config.threads)], str(smem)),
            helpers="" if has else _hmma.HELPERS,
        )
        summary = (
            f"from the lifted model: tensor cores, {config.bm}x{config.bn}x{config.bk} tiles, "
            f"{config.threads // 32} warps of mma.sync m16n8k16 ({ctype}, fp32 accumulators), "
            f"ldmatrix, {config.stages}-stage cp.async ring ({smem // 1024} KiB)"
            + (", batched on blockIdx.z" if batch else "")
        )
        out.append(Rewrite(config.params, summary, variant, weight))
    return sorted(out, key=lambda p: -p.weight)
