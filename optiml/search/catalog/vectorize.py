"""16-byte loads and stores for 1-D map kernels: every `p[i]` of the body is served from a vector of
the `16 / sizeof(T)` elements a thread now owns, loaded (and stored) with one instruction. A run-time
alignment check falls back to the scalar loop, and a scalar tail takes the elements past the last
whole vector, so any size and any pointer offset stay correct. Includes a grid-stride loop."""

from __future__ import annotations

from optiml.cuda.kernel_ast import unparen
from optiml.cuda.types import lookup
from optiml.search.catalog._map import map_kernel, statement_text
from optiml.search.catalog.base import Context, Rewrite, Transformation

PACK_HELPER = """// A vector of N elements of E, aligned so that one load or store moves all of it.
template <typename E, int N>
struct alignas(sizeof(E) * N) optiml_pack {
    E v[N];
};"""


def ensure_pack_helper(text: str) -> str:
    """The helper's text if the file does not define it yet, else ""."""
    return "" if "struct alignas(sizeof(E) * N) optiml_pack" in text else PACK_HELPER


class Vectorize(Transformation):
    name = "vectorize"
    addresses = frozenset({"dram", "l2", "l1_shared", "latency"})
    description = "16-byte vector loads/stores with an alignment check and a scalar tail"

    def propose(self, ctx: Context) -> list[Rewrite]:
        m = map_kernel(ctx)
        if m is None:
            return []
        ast, var = m.ast, m.index.var
        stmts = [*m.per_element, *m.body]
        accesses = [a for st in stmts for a in ast.accesses(st)]
        at_i: dict[str, list] = {}
        other: set[str] = set()
        for a in accesses:
            plain = unparen(a.index)
            if a.offset is None and plain.type == "identifier" and ast.text(plain) == var:
                at_i.setdefault(a.pointer, []).append(a)
            else:
                other.add(a.pointer)
        written = {a.pointer for a in accesses if a.write}
        if any(a.atomic for a in accesses):
            return []
        # A pointer written anywhere must be accessed at [i] only: its vector is the truth.
        if written & other or written - set(at_i):
            return []
        escaped = {ast.pointer_of(ast.text(n))[0] for n in ast.pointer_escapes()}
        vec_ptrs = [p for p in at_i if p not in escaped and (p not in other or p not in written)]
        if not vec_ptrs:
            return []
        sizes = {}
        for p in vec_ptrs:
            size = _element_size(ctx, p)
            if size is None:
                return []
            sizes[p] = size
        lanes = 16 // max(sizes.values())
        if lanes < 2:
            return []
        loaded = [
            p
            for p in vec_ptrs
            if any(a.read for a in at_i[p]) or not _written_unconditionally(ast, m.body, at_i[p])
        ]
        stores = [p for p in vec_ptrs if p in written]
        params = ctx.kernel.params
        elem = {p.name: p.type_text for p in params}

        it = m.index_type
        ind = ast.indent_of(m.index.decl) or "    "
        i1, i2, i3 = ind + "    ", ind + "        ", ind + "            "
        replace = {
            (a.node.start_byte, a.node.end_byte): f"optiml_vec_{a.pointer}.v[optiml_l]"
            for p in vec_ptrs
            for a in at_i[p]
        }
        aligned = " | ".join(f"reinterpret_cast<unsigned long long>({p})" for p in vec_ptrs)
        pack_bytes = max(sizes.values()) * lanes
        lines = ["{"]
        if m.before:
            lines.append(statement_text(ast, m.before, ind))
        lines += [
            f"{ind}const {it} optiml_n = ({m.bound});",
            f"{ind}const {it} optiml_first = blockIdx.x * blockDim.x + threadIdx.x;",
            f"{ind}const {it} optiml_stride = blockDim.x * gridDim.x;",
            f"{ind}{it} optiml_tail = 0;",
            f"{ind}if ((({aligned}) % {pack_bytes}) == 0) {{",
            f"{i1}optiml_tail = optiml_n - optiml_n % {lanes};",
            f"{i1}for ({it} optiml_v = optiml_first * {lanes}; optiml_v < optiml_tail; "
            f"optiml_v += optiml_stride * {lanes}) {{",
        ]
        for p in vec_ptrs:
            pack = f"optiml_pack<{elem[p]}, {lanes}>"
            if p in loaded:
                lines.append(
                    f"{i2}{pack} optiml_vec_{p} = *reinterpret_cast<const {pack}*>({p} + optiml_v);"
                )
            else:
                lines.append(f"{i2}{pack} optiml_vec_{p};")
        # The lane's own index, where the body still uses it beyond the vectorized accesses.
        vectorized = [(a.node.start_byte, a.node.end_byte) for p in vec_ptrs for a in at_i[p]]
        uses_var = any(
            not any(s <= u.start_byte and u.end_byte <= e for s, e in vectorized)
            for st in stmts
            for u in ast.uses(st, var)
        )
        lines += [
            f"{i2}#pragma unroll",
            f"{i2}for (int optiml_l = 0; optiml_l < {lanes}; ++optiml_l) {{",
        ]
        if uses_var:
            lines.append(f"{i3}const {it} {var} = optiml_v + optiml_l;")
        lines += [statement_text(ast, stmts, i3, replace), f"{i2}}}"]
        for p in stores:
            pack = f"optiml_pack<{elem[p]}, {lanes}>"
            lines.append(f"{i2}*reinterpret_cast<{pack}*>({p} + optiml_v) = optiml_vec_{p};")
        lines += [
            f"{i1}}}",
            f"{ind}}}",
            f"{ind}for ({it} {var} = optiml_tail + optiml_first; {var} < optiml_n; "
            f"{var} += optiml_stride) {{",
            statement_text(ast, stmts, i1),
            f"{ind}}}",
            "}",
        ]
        definition = ast.definition({(ast.body.start_byte, ast.body.end_byte): "\n".join(lines)})
        helpers = ensure_pack_helper(ctx.source.text)
        grid, block, smem = ctx.launch
        names = ", ".join(vec_ptrs)
        proposals = []
        for per_thread, weight in ((1, 1.0), (2, 0.7), (4, 0.5)):
            vectors = lanes * per_thread
            proposals.append(
                Rewrite(
                    params={"lanes": lanes, "vectors_per_thread": per_thread},
                    summary=f"{pack_bytes}-byte accesses to {names} ({lanes} elements per access), "
                    f"{per_thread} vector(s) per thread, scalar tail",
                    variant=ctx.rewrite(
                        definition,
                        launch=([f"cdiv({grid[0]}, {vectors})"], block, smem),
                        helpers=helpers,
                    ),
                    weight=weight,
                )
            )
        return proposals


def _element_size(ctx: Context, pointer: str) -> int | None:
    param = ctx.kernel.param(pointer)
    if param is None or param.pointer_depth != 1:
        return None
    type_text = ctx.spec.template.get(param.type_text, param.type_text)
    dtype = lookup(type_text)
    return dtype.size if dtype is not None and dtype.size in (2, 4, 8) else None


def _written_unconditionally(ast, body, accesses) -> bool:
    """Every lane's element is assigned by a top-level `p[i] = ...;` of the body."""
    tops = set()
    for st in body:
        if st.type == "expression_statement" and st.named_children:
            expr = st.named_children[0]
            if expr.type == "assignment_expression":
                tops.add(unparen(expr.child_by_field_name("left")).id)
    return any(a.write and a.node.id in tops for a in accesses)
