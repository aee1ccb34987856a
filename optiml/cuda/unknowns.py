"""Resolving what a kernel's accesses leave unknown (`optiml.cuda.extent.unknown`): the largest
value of a block index no guard bounds, and the largest value of an index loaded from memory.

The evidence, strongest first: for a block index, the grid the host launches; for both, the
layout (in `x[r * cols + idx[i]]` the loaded index runs along a row of `cols` elements: the
stride of the next index out is its count), then an integer parameter the body never uses (a
kernel that takes `num_segments` and never reads it takes it to say how many there are; one named
after the buffer it counts is taken first), then the element type of the index buffer (an 8-bit
index is below 256). What is resolved from a parameter gives the index buffer its value range,
so generated inputs index in bounds.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from optiml.cuda.extent import Extents, Poly, poly_add, poly_mul, poly_text, unknown
from optiml.lift.model import Lifted, Param, loops_of, stmt_exprs, walk_expr, walk_stmts

_TYPE_RANGE = {"u8": 256, "i8": 128, "u16": 65536, "i16": 32768, "bool": 2}


@dataclass
class Resolved:
    tops: dict[str, Poly] = field(default_factory=dict)  # unknown -> its largest value
    texts: dict[str, str] = field(default_factory=dict)  # unknown -> its count, as host text
    ranges: dict[str, str] = field(default_factory=dict)  # index buffer -> `in [0, P)`'s P
    how: dict[str, str] = field(default_factory=dict)  # unknown -> the evidence, in words


def used_params(lifted: Lifted) -> set[str]:
    """The scalar parameters any expression of the model reads."""
    found: set[str] = set()
    exprs = [e for s in walk_stmts(lifted.body) for e in stmt_exprs(s)]
    for loop in loops_of(lifted):
        exprs += [loop.cond, loop.guard] + [x for c in loop.carried for x in (c.init, c.update)]
    for e in exprs:
        for x in walk_expr(e):
            if isinstance(x, Param):
                found.add(x.name)
    return found


def unknowns_in(ext: Extents) -> list[tuple[str, list[str]]]:
    """Each unknown, in order of first appearance, with the buffers whose accesses it is in."""
    seen: dict[str, list[str]] = {}
    for tensor, polys in ext.lengths.items():
        for p in polys:
            for m in p:
                for a in m:
                    if unknown(a) and tensor not in seen.setdefault(a, []):
                        seen[a].append(tensor)
    return list(seen.items())


def _stride_ratio(ext: Extents, atom: str, int_params: list[str]) -> str | None:
    """The count of an index from the layout: the coefficient of the next index out divided by
    its own (`?idx` with coefficient 1 next to `r * cols`: cols)."""
    found: list[str] = []
    for polys in ext.lengths.values():
        for p in polys:
            own = [tuple(a for a in m if a != atom) for m in p if atom in m]
            for c in own:
                for m in p:
                    if atom in m:
                        continue
                    rest = list(a for a in m if not unknown(a))
                    if all(a in rest for a in c) and all(c.count(a) <= rest.count(a) for a in c):
                        for a in c:
                            rest.remove(a)
                        if len(rest) == 1 and rest[0] in int_params and rest[0] not in found:
                            found.append(rest[0])
    return found[0] if len(found) == 1 else None


def _words(name: str) -> set[str]:
    parts = re.findall(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+", name)
    return {p.lower() for p in parts if len(p) >= 2} | {name.lower()}


def _named_after(param: str, buffers: list[str]) -> bool:
    """`num_src` counts `src`, `nseg` counts `seg`."""
    p = param.lower()
    return any(len(b) >= 2 and any(w in p for w in _words(b)) for b in buffers)


def resolve(
    ext: Extents,
    lifted: Lifted,
    int_params: list[str],
    host_grid: list[str] | None,
    host_block: list[str] | None,
    dtypes: dict[str, str],
) -> Resolved:
    """What each unknown is, from the strongest evidence there is (see the module's text)."""
    out = Resolved()
    unused = [p for p in int_params if p not in used_params(lifted)]
    pending: list[tuple[str, list[str]]] = []
    for atom, buffers in unknowns_in(ext):
        name = atom[1:]
        index = name.startswith(("blockIdx.", "g."))
        if index and host_grid and "xyz".index(name[-1]) < len(host_grid):
            d = "xyz".index(name[-1])
            g = host_grid[d]
            if name.startswith("g."):
                g = f"({g}) * ({host_block[d]})" if host_block and d < len(host_block) else None
            if g is not None:
                out.texts[atom] = g
                out.how[atom] = "the host's launch"
                continue
        ratio = _stride_ratio(ext, atom, int_params)
        if ratio is not None:
            out.tops[atom] = {(ratio,): 1, (): -1}
            if not index:
                out.ranges[name] = ratio
            out.how[atom] = f"the layout: it runs along `{ratio}`"
            continue
        pending.append((atom, buffers))
    # parameters the body never reads: first those named after what the unknown indexes
    for atom, buffers in sorted(
        pending, key=lambda ab: not any(_named_after(p, ab[1] + [ab[0][1:]]) for p in unused)
    ):
        named = [p for p in unused if _named_after(p, buffers + [atom[1:]])]
        pick = (named or unused or [None])[0]
        if pick is not None:
            unused.remove(pick)
            out.tops[atom] = {(pick,): 1, (): -1}
            if not atom[1:].startswith(("blockIdx.", "g.")):
                out.ranges[atom[1:]] = pick
            out.how[atom] = f"`{pick}`, a parameter the body does not otherwise use"
            continue
        size = _TYPE_RANGE.get(dtypes.get(atom[1:], ""))
        if size is not None:
            out.tops[atom] = {(): size - 1}
            out.how[atom] = f"its {dtypes[atom[1:]]} elements"
    return out


def substitute(p: Poly, resolved: Resolved) -> str | None:
    """The length `p` with its unknowns resolved, as spec text (None: one is not resolved)."""
    out: Poly = {}
    marks: dict[str, str] = {}
    for m, c in p.items():
        term: Poly = {(): c}
        for a in m:
            if a in resolved.tops:
                term = poly_mul(term, resolved.tops[a])
            elif a in resolved.texts:
                mark = f"__unknown{len(marks)}"
                marks.setdefault(a, mark)
                term = poly_mul(term, {(marks[a],): 1, (): -1})
            elif unknown(a):
                return None
            else:
                term = poly_mul(term, {(a,): 1})
        out = poly_add(out, term)
    text = poly_text(out)
    for a, mark in marks.items():
        text = re.sub(rf"\b{mark}\b", f"({resolved.texts[a]})", text)
    return text
