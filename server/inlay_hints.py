"""Static feedback per kernel as an inlay hint at the end of its signature line, from the newest
finished compile: registers, spills and occupancy in one line."""

from __future__ import annotations

from lsprotocol import types

from optiml.api import KernelOutline, StaticReport
from server.checks import CheckOutcome
from server.documents import Model, Point


def summary(report: StaticReport) -> str:
    """`32 regs · 0 B spills · occupancy 100% (warps)`"""
    r = report.resources
    parts = [f"{r.registers} regs", f"{r.spill_store_bytes} B spills"]
    occ = report.occupancy
    if occ is not None and occ.blocks_per_sm == 0:
        parts.append("does not fit on an SM")
    elif occ is not None:
        parts.append(f"occupancy {occ.occupancy:.0%} ({occ.limiter.replace('_', ' ')})")
    return " · ".join(parts)


def inlay_hints(model: Model, check: CheckOutcome, visible: types.Range) -> list[types.InlayHint]:
    first, last = visible.start.line, visible.end.line
    out = []
    for k in model.kernels_at((first, 0), (last + 1, 0)):
        feedback = check.kernels.get(k.name)
        if feedback is None or feedback.report is None:
            continue
        at = signature_end(model, k)
        if first <= at[0] <= last:
            out.append(
                types.InlayHint(
                    position=model.position(at),
                    label=summary(feedback.report),
                    padding_left=True,
                    tooltip="\n".join(feedback.report.notes) or None,
                )
            )
    return out


def signature_end(model: Model, kernel: KernelOutline) -> Point:
    """The end of the line where the parameter list closes (the body may open there or below)."""
    return model.line_end(kernel.signature_line)
