"""A scatter-add by rows scheduled from the lifted model (optiml.lift): for a kernel whose model
adds, atomically, elements of a source row into a row chosen by an index loaded from memory
(`out[idx[i], :] += f(v[i, :])`: an embedding's backward, `index_add`), whatever the spelling of
its index arithmetic (a 1-D index taken apart with `/` and `%`, or a 2-D launch), the thread's
index is read as coordinates along axes (as in permute_tiles), and the row's elements, the axis
along which both the source and the destination move by one, go to consecutive threads, each
adding V of them with one vector atomic (`atomicAdd` on float4 or float2, sm_90) where the
addresses allow (checked at run time), element by element otherwise; the other axes (the source
row) go over the grid. A scalar-atomic variant is proposed for GPUs before sm_90.

Atomics land in any order, as the original's do: float sums are reordered (the spec's tolerance,
or the harness's oracle in double, decides). Atomic counts of a constant (a histogram) are not
this schedule's (privatize_histogram).
"""

from __future__ import annotations

from optiml.expr import ExprError
from optiml.lift import Lifted, lift
from optiml.lift.emit import NotEmittable
from optiml.lift.families import describe
from optiml.search.catalog.base import Context, Rewrite, Transformation
from optiml.search.catalog.permute_tiles import (
    Axes,
    Plan,
    _evaluates,
    _kept,
    _kept_choices,
    _proposals,
    _vector_width,
)
from optiml.search.catalog.warp_rows import _NoPlan

CHOICES = ((256, 1.0), (128, 0.8))


class ScatterRows(Transformation):
    name = "scatter_rows"
    addresses = frozenset({"dram", "uncoalesced", "latency", "l2"})
    description = (
        "a scatter-add by rows from the lifted model: the row's elements along consecutive "
        "threads, vector atomics (float4/float2 on sm_90)"
    )

    def propose(self, ctx: Context) -> list[Rewrite]:
        try:
            lifted = lift(ctx.source, ctx.kernel, ctx.spec)
            if not isinstance(lifted, Lifted) or describe(lifted, ctx.spec).family != "scatter":
                return []
            plan = Axes(lifted, ctx, scatter=True).plan()
            if plan.tiled:
                raise _NoPlan("the source and destination rows move along different axes")
            floats = all(lifted.tensors[s.tensor].dtype == "float" for s in plan.stores)
            width = _vector_width(plan) if floats else 1
            choices = _kept_choices(plan, width, CHOICES) if width > 1 else []
            choices += [
                (dict(p, vector=1), 0.5, g) for p, _, g in _kept_choices(plan, 1, CHOICES[:1])
            ]
            bodies = [(p, w, _kept(lifted, plan, p["vector"]), grid) for p, w, grid in choices]
            for _, _, _, grid in bodies:
                _evaluates(ctx, grid)
        except (_NoPlan, NotEmittable, ExprError, KeyError, ValueError, ZeroDivisionError):
            return []
        return _proposals(ctx, plan, bodies, _summary)


def _summary(plan: Plan, params: dict) -> str:
    v = params["vector"]
    how = f"one float{v} atomicAdd per {v} elements (sm_90)" if v > 1 else "scalar atomics"
    return (
        f"scatter-add by rows from the lifted model: the row axis {plan.names[plan.a]} along "
        f"consecutive threads, {how}, {params['threads']} threads per block"
    )
