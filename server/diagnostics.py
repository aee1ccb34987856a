"""A document's diagnostics: spec errors from its newest parse, nvcc's messages from its newest
compile, and static feedback as Hint diagnostics for clients without inlay hints."""

from __future__ import annotations

import re
from pathlib import Path

from lsprotocol import types

from optiml.api import CompilerMessage
from optiml.errors import Position
from server.checks import CheckOutcome
from server.documents import Model, Point
from server.inlay_hints import summary

SEVERITY = {
    "error": types.DiagnosticSeverity.Error,
    "warning": types.DiagnosticSeverity.Warning,
    "remark": types.DiagnosticSeverity.Information,
    "note": types.DiagnosticSeverity.Information,
}
_WORD = re.compile(r"\w+|\S")


def diagnostics(model: Model, check: CheckOutcome | None, hints: bool) -> list[types.Diagnostic]:
    out = [_spec_issue(model, message, at) for message, at in model.spec_issues]
    if model.error:
        out.append(_at(model, (0, 0), None, model.error, types.DiagnosticSeverity.Warning))
    if check is not None:
        out += [_compiler_message(model, m) for m in check.messages]
        if hints:
            out += _static_feedback(model, check)
    return out


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
                    range=model.range(k.name_span.start_point, k.name_span.end_point),
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
