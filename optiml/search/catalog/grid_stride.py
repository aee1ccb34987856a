"""Grid-stride loops with thread coarsening for 1-D map kernels: a fixed, smaller grid whose threads
each walk several elements `i, i + stride, ...`. Fewer blocks to schedule, index arithmetic once per
element, and a launch that no longer depends on the problem size for its correctness."""

from __future__ import annotations

from optiml.search.catalog._map import block_threads, map_kernel, statement_text
from optiml.search.catalog.base import LATENCY, MEMORY, Context, Rewrite, Transformation


class GridStride(Transformation):
    name = "grid_stride"
    addresses = MEMORY | LATENCY | frozenset({"dram"})
    gain = 0.5
    keeps_accesses = True
    description = "grid-stride loop, each thread several elements (thread coarsening)"

    def propose(self, ctx: Context) -> list[Rewrite]:
        m = map_kernel(ctx)
        if m is None:
            return []
        ast, var = m.ast, m.index.var
        indent = ast.indent_of(m.index.decl) or "    "
        inner = indent + "    "
        loop = (
            f"{indent}for ({m.index_type} {var} = blockIdx.x * blockDim.x + threadIdx.x; "
            f"{var} < ({m.bound}); {var} += blockDim.x * gridDim.x) {{\n"
            f"{statement_text(ast, [*m.per_element, *m.body], inner)}\n{indent}}}"
        )
        head = statement_text(ast, m.before, indent)
        body = "{\n" + (head + "\n" if head else "") + loop + "\n}"
        definition = ast.definition({(ast.body.start_byte, ast.body.end_byte): body})
        grid, block, smem = ctx.launch
        threads = block_threads(ctx)
        waves = max(1, 2048 // threads)  # resident blocks per SM at full occupancy
        proposals = []
        for per_thread in (4, 8, 16):
            proposals.append(
                Rewrite(
                    params={"per_thread": per_thread},
                    summary=f"grid-stride loop, ~{per_thread} elements per thread",
                    variant=ctx.rewrite(
                        definition, launch=([f"cdiv({grid[0]}, {per_thread})"], block, smem)
                    ),
                    weight=1.0 if per_thread == 4 else 0.8,
                )
            )
        cap = ctx.sm_count * waves
        proposals.append(
            Rewrite(
                params={"grid": "one_wave"},
                summary=f"grid-stride loop, one full wave of {cap} blocks",
                variant=ctx.rewrite(definition, launch=([f"min({grid[0]}, {cap})"], block, smem)),
                weight=0.7,
            )
        )
        return proposals
