"""A document's diagnostics: spec errors from its newest parse, nvcc's messages from its newest
compile, static feedback as Hint diagnostics for clients without inlay hints, and the hotspots of
each kernel's newest profile (while the kernel's lines are those profiled)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from lsprotocol import types

from optiml.api import CompilerMessage, Hotspot, KernelOutline, Position
from server.checks import CheckOutcome
from server.documents import Model, Point
from server.inlay_hints import summary
from server.jobs import KernelProfile

SEVERITY = {
    "error": types.DiagnosticSeverity.Error,
    "warning": types.DiagnosticSeverity.Warning,
    "remark": types.DiagnosticSeverity.Information,
    "note": types.DiagnosticSeverity.Information,
}
_WORD = re.compile(r"\w+|\S")


# A hotspot with this share of the kernel's stall samples is Information; a smaller one a Hint,
# and one below HOTSPOT_MIN (with no excess sectors either) is not shown.
HOTSPOT_INFO = 0.2
HOTSPOT_MIN = 0.05


def diagnostics(
    model: Model,
    check: CheckOutcome | None,
    hints: bool,
    profiles: Sequence[tuple[KernelOutline, KernelProfile]] = (),
) -> list[types.Diagnostic]:
    out = [_spec_issue(model, i.message, i.position) for i in model.spec_issues]
    if model.error:
        out.append(_at(model, (0, 0), None, model.error, types.DiagnosticSeverity.Warning))
    if check is not None:
        out += [_compiler_message(model, m) for m in check.messages]
        if hints:
            out += _static_feedback(model, check)
    for kernel, found in profiles:
        out += _hotspots(model, kernel, found)
    return out


def _hotspots(model: Model, kernel: KernelOutline, found: KernelProfile) -> list[types.Diagnostic]:
    """The profile's hotspots in the kernel's lines, where they are now: the kernel is unchanged
    since the profile (else it is not passed here), but it may have moved."""
    block = model.block(kernel)
    name = model.range(kernel.name_range.start, kernel.name_range.end)
    related = [
        types.DiagnosticRelatedInformation(
            location=types.Location(uri=model.snapshot.uri, range=name),
            message=f"`{kernel.name}`: {found.profile.bottleneck.explanation}",
        )
    ]
    out = []
    for h in found.profile.hotspots:
        line = h.line - 1 - found.first + block.first
        inside = block.first <= line <= block.last
        if not inside or not _same_file(h.file, found.path):
            continue
        if h.share < HOTSPOT_MIN and not h.excessive_sectors:
            continue
        end = model.line_end(line)
        text = model.lines[line]
        start = (line, len(text) - len(text.lstrip()))
        severity = (
            types.DiagnosticSeverity.Information
            if h.share >= HOTSPOT_INFO
            else types.DiagnosticSeverity.Hint
        )
        out.append(
            types.Diagnostic(
                range=model.range(start, end),
                message=hotspot_message(h),
                severity=severity,
                source="optiml",
                related_information=related,
            )
        )
    return out


def hotspot_message(h: Hotspot) -> str:
    """`hotspot: 62 % of stall samples (long_scoreboard); 58M excess L2 sectors`"""
    parts = [f"hotspot: {h.share:.0%} of stall samples".replace("%", " %")]
    if h.top_stall:
        parts[0] += f" ({h.top_stall})"
    if h.excessive_sectors:
        parts.append(f"{_count(h.excessive_sectors)} excess L2 sectors")
    return "; ".join(parts)


def _count(n: float) -> str:
    for size, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "K")):
        if n >= size:
            return f"{n / size:.3g}{suffix}"
    return f"{n:.0f}"


def _spec_issue(model: Model, message: str, at: Position) -> types.Diagnostic:
    start = (at.line - 1, at.column - 1)
    end = (at.end_line - 1, at.end_column - 1) if at.end_line and at.end_column else None
    return _at(model, start, end, message, types.DiagnosticSeverity.Error)


def _compiler_message(model: Model, m: CompilerMessage) -> types.Diagnostic:
    severity = SEVERITY.get(m.severity, types.DiagnosticSeverity.Error)
    if m.path is None or m.line is None:
        return _at(model, (0, 0), None, m.message, severity, source="nvcc")
    if _same_file(m.path, model.snapshot.path):
        if m.column:
            return _at(model, (m.line - 1, m.column - 1), None, m.message, severity, "nvcc")
        return _whole_line(model, m.line - 1, m.message, severity)
    # A message about an included file goes on the line that includes it.
    line = _include_line(model, Path(m.path).name)
    return _whole_line(model, line, f"{m.path}:{m.line}: {m.message}", severity)


def _static_feedback(model: Model, check: CheckOutcome) -> list[types.Diagnostic]:
    out = []
    for k in model.kernels:
        feedback = check.kernels.get(k.name)
        if feedback is not None and feedback.report is not None:
            out.append(
                types.Diagnostic(
                    range=model.range(k.name_range.start, k.name_range.end),
                    message=summary(feedback.report),
                    severity=types.DiagnosticSeverity.Hint,
                    source="optiml",
                )
            )
    return out


def _at(
    model: Model,
    start: Point,
    end: Point | None,
    message: str,
    severity: types.DiagnosticSeverity,
    source: str = "optiml",
) -> types.Diagnostic:
    if end is None or end <= start:
        end = _word_end(model, start)
    return types.Diagnostic(
        range=model.range(start, end), message=message, severity=severity, source=source
    )


def _whole_line(
    model: Model, line: int, message: str, severity: types.DiagnosticSeverity
) -> types.Diagnostic:
    end = model.line_end(line)
    text = model.lines[end[0]]
    start = (end[0], len(text) - len(text.lstrip()))
    return _at(model, start, end, message, severity, "nvcc")


def _word_end(model: Model, start: Point) -> Point:
    """A position alone (nvcc gives no end) underlines the word there, or the rest of the line."""
    line, col = start
    if not 0 <= line < len(model.lines):
        return start
    m = _WORD.search(model.lines[line], col)
    return (line, m.end()) if m else model.line_end(line)


def _include_line(model: Model, name: str) -> int:
    pattern = re.compile(r'^\s*#\s*include\s*[<"](?:.*/)?' + re.escape(name) + r'[">]')
    return next((i for i, text in enumerate(model.lines) if pattern.match(text)), 0)


def _same_file(a: str, b: str) -> bool:
    return a == b or (b != "<memory>" and Path(a).resolve() == Path(b).resolve())
