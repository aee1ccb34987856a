"""Naive GEMM (a thread per element of C: `acc += A[..] * B[..]` over k, then an epilogue storing a
function of acc to that element) into a register-blocked, shared-memory tiled SGEMM on the FP32 pipes,
for any names and row- or column-major operands; the analysis and the CUDA template are in `_gemm`."""

from __future__ import annotations

from optiml.expr import Expr, ExprError
from optiml.search.catalog._gemm import (
    HELPERS,
    Config,
    Gemm,
    definition,
    match,
    render,
    split_count,
    stream_k_grid,
)
from optiml.search.catalog.base import Context, Rewrite, Transformation
from optiml.search.variant import Variant

# For large problems, ranked by their times on the naive SGEMM fixture at 4096^3 on an H200
# (benchmarks/gemm_configs.py) with the template's earlier copies (a k-contiguous A by word
# cp.async; benchmarks/results/gemm-configs-h200-cp-async.json), 3.23 to 3.58 ms: K tiles of 16
# with 8 x 8 outputs per thread (half the barriers and copy rounds per FFMA of K tiles of 8), then
# 64 x 128 tiles (2048 blocks, 7.8 waves of 264: a shorter tail), then the 128 x 128 x 8 ones;
# 16 x 8 outputs per thread (255 registers, 4 warps a block) and 256 x 128 tiles last. With A
# through registers (gemm-configs-h200.json, 3.05 to 3.44 ms) the first stays first; 128 x 128 x 8
# with 3 stages (3.09 ms) beats 64 x 128 (3.19 ms). With the template that has stream-K
# (gemm-configs-h200-stream-k.json) the data-parallel configs take 2.99 to 3.37 ms, 128 x 128 x 16
# with 16 x 8 per thread now second (2.99 ms, first 3.02). The order is left as it was, which the
# search benchmark's table measured.
# reg_vecs (the most 128-bit vectors per thread and tile staged through registers) is lowered where
# ptxas spills at the register cap otherwise: 128 x 128 x 16 stages A or B alone (both k-contiguous:
# neither), 128 x 64 x 8 at 4 blocks per SM only a k-contiguous B (1 vector; A has 2).
# stream_k: the configs whose stream-K twin beat them at 4096^3 (gemm-configs-h200-stream-k.json:
# 128 x 128 x 16 3.02 -> 2.93 ms, 128 x 128 x 8 with 3 stages 3.07 -> 3.01, 64 x 128 x 8 3.12 ->
# 3.08). The catalog's other configs' twins were slower than they are (3.18 to 3.43 ms against 2.99
# to 3.37: 16 x 8 outputs per thread, or 4 blocks per SM, or a block per SM); not proposed.
LARGE = [
    (Config(128, 128, 16, 2, 2, 2, 2, reg_vecs=2, stream_k=True), 1.0),
    (Config(64, 128, 8, 2, 2, 3, 3, stream_k=True), 0.95),
    (Config(128, 128, 8, 2, 2, 3, 2, stream_k=True), 0.9),
    (Config(128, 128, 8, 4, 2, 3, 2), 0.85),
    (Config(128, 64, 8, 2, 2, 3, 4, reg_vecs=1), 0.75),
    (Config(128, 128, 16, 4, 2, 2, 2), 0.7),
    (Config(256, 128, 8, 4, 2, 3, 1), 0.6),
]
# Small problems, where 128 x 128 tiles leave SMs idle: 4 times as many blocks; and the same tile
# with 4 x 4 outputs a thread, twice the warps: where even 64 x 64 tiles are fewer than the SMs
# and K is split over a cluster of at most 8 (the large-K GEMM: 16 tiles, 128 blocks), a block of
# 4 warps alone on its SM ran at about a fifth of the FFMA peak (KernelBench's task 6 on an H100,
# kb-4-6-34-36-40-h100.json); 8 warps hide more of its latency (not yet measured).
SMALL = [(Config(64, 64, 8, 2, 1, 3, 4), 0.5), (Config(64, 64, 16, 1, 1, 3, 2, reg_vecs=0), 0.45)]
MAX_GRID_Y = 65535
# A stream-K twin of a config where its last wave leaves at least this share of the time idle
# (a whole wave's time for a partial wave: measured, benchmarks/results/sgemm-waves-h200.txt), and
# its weight over the config's.
MIN_TAIL = 0.01
STREAM_K_GAIN = 0.05
# A split of K over a cluster (`_gemm.split_count`) is ranked this much above its config unsplit
# where C's tiles fill at most half the SMs.
SPLIT_GAIN = 0.5


class GemmTiling(Transformation):
    name = "gemm_tiling"
    addresses = frozenset({"l1_shared", "l2", "dram", "uncoalesced", "compute", "latency"})
    description = (
        "register-blocked shared-memory tiled SGEMM (FFMA), stages fed through registers and "
        "cp.async; stream-K for a last wave that is not whole (where the spec keeps state)"
    )

    def propose(self, ctx: Context) -> list[Rewrite]:
        g = match(ctx.ast)
        if g is None:
            return []
        extents = _extents(ctx, g)
        if extents is None:
            return []
        configs = _ranked(ctx, extents[0])
        helpers = "" if _has_helpers(ctx) else HELPERS
        out = []
        for config, weight in configs:
            if not config.fits(g) or any(-(-m // config.bm) > MAX_GRID_Y for m, _ in extents):
                continue
            summary = (
                f"{config.bm}x{config.bn}x{config.bk} smem tiles, {config.tm}x{config.tn} "
                f"FFMA per thread ({config.threads} threads), {config.stages}-stage "
                f"ring ({_copies(config, g)}), float4 fragment loads"
            )
            variant = tiled(ctx, g, config, helpers=helpers)
            out.append(Rewrite(config.params, summary, variant, weight))
            blocks = ctx.sm_count * config.min_blocks
            # stream-K keeps a static workspace between launches (two launches in flight on
            # different streams would share it): only where the spec says state is kept on purpose,
            # else the judge rejects it and the evaluation is wasted
            if (
                config.stream_k
                and ctx.spec.state_kept
                and _tail(extents[0], config, blocks) >= MIN_TAIL
            ):
                variant = tiled(ctx, g, config, stream_k=blocks, helpers=helpers)
                params = {**config.params, "stream_k": blocks}
                summary += (
                    f"; the last wave stream-K over {blocks} blocks (a static workspace: "
                    "launches must not overlap)"
                )
                out.append(Rewrite(params, summary, variant, weight + STREAM_K_GAIN))
            split = _split(ctx, g, config, extents[0])
            if split:
                variant = tiled(ctx, g, config, split=split[0], helpers=helpers)
                params = {**config.params, "split_k": split[0]}
                summary += f"; K split over a cluster of {split[0]} blocks"
                gain = SPLIT_GAIN if split[1] else 0.0
                out.append(Rewrite(params, summary, variant, weight + gain))
        return sorted(out, key=lambda p: -p.weight)


def _split(ctx: Context, g: Gemm, config: Config, main: tuple[int, int]) -> tuple[int, bool] | None:
    """`split_count` for `config` at the main problem size."""
    try:
        k = ctx.value(render(g.k))
    except ExprError:
        return None
    if not isinstance(k, int):
        return None
    return split_count(config, main, k, 1, ctx.sm_count, (g.a.k_contiguous, g.b.k_contiguous))


def tiled(
    ctx: Context,
    g: Gemm,
    config: Config,
    stream_k: int = 0,
    helpers: str = HELPERS,
    split: int = 0,
) -> Variant:
    """The variant of one config: a block per tile on a 2-D grid, (`stream_k` > 0) stream-K
    over that many blocks on a 1-D grid, or (`split` > 1) a cluster of that many blocks along z
    per tile, each summing its share of K."""
    tiles = [f"cdiv({render(g.n)}, {config.bn})", f"cdiv({render(g.m)}, {config.bm})"]
    grid = [stream_k_grid(" * ".join(tiles), stream_k)] if stream_k else tiles
    if split:
        grid = [*tiles, str(split)]
    return ctx.rewrite(
        definition(g, config, stream_k=stream_k, split=split),
        launch=(grid, [str(config.threads)], "0"),
        helpers=helpers,
    )


def _tail(main: tuple[int, int], config: Config, blocks: int) -> float:
    """The share of a data-parallel launch's time that SMs sit idle in its last wave, at the main
    problem size, with `blocks` blocks resident at once (0 if that wave is whole or the only
    one)."""
    m, n = main
    tiles = -(-m // config.bm) * -(-n // config.bn)
    if tiles < blocks or tiles % blocks == 0:
        return 0.0
    waves = -(-tiles // blocks)
    return (blocks - tiles % blocks) / (blocks * waves)


def _copies(config: Config, g: Gemm) -> str:
    """How each operand reaches shared memory on the vector path: `A via registers, B by
    cp.async`."""
    out = []
    staged = config.staged(g.a.k_contiguous, g.b.k_contiguous)
    for op, regs in zip((g.a, g.b), staged, strict=True):
        how = "via registers" if regs else "by word cp.async" if op.k_contiguous else "by cp.async"
        out.append(f"{op.pointer} {how}")
    return ", ".join(out)


def _extents(ctx: Context, g: Gemm) -> list[tuple[int, int]] | None:
    """(M, N) at every problem size, if the original launch covers every (row, col) of them with
    exactly one thread in a 2-D grid; None otherwise (a thread the guard leaves out would now be
    computed, one computed twice would now be once)."""
    out = []
    for sizes in ctx.spec.sizes:
        try:
            case = ctx.spec.case(sizes)
            env = ctx.env(case)
            m = Expr.parse(render(g.m)).evaluate(env)
            n = Expr.parse(render(g.n)).evaluate(env)
        except ExprError:
            return None
        if case.grid[2] != 1 or case.block[2] != 1 or not isinstance(m, int):
            return None
        for index, extent in ((g.row, m), (g.col, n)):
            d = "xyz".index(index.dim)
            if index.block != f"blockDim.{index.dim}":
                try:
                    block = Expr.parse(index.block).evaluate(env)
                except ExprError:
                    return None
                if block != case.block[d]:
                    return None
            if not isinstance(extent, int) or case.grid[d] * case.block[d] < extent:
                return None
        out.append((m, n))
    return out


def _ranked(ctx: Context, main: tuple[int, int]) -> list[tuple[Config, float]]:
    """The configs by weight; the small-tile one first where 128 x 128 tiles fill under one wave of
    the GPU's SMs at the main problem size."""
    m, n = main
    if -(-m // 128) * -(-n // 128) < ctx.sm_count:
        return [(c, w + 1.0) for c, w in SMALL] + LARGE
    return LARGE + SMALL


def _has_helpers(ctx: Context) -> bool:
    """Whether the file defines the template before this kernel already."""
    at = ctx.source.text.find("#define OPTIML_SGEMM_TILING")
    spec = ctx.kernel.spec_comment
    start = spec.span.start if spec is not None else ctx.kernel.span.start
    return 0 <= at < start
