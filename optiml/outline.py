"""A file's outline as plain data: its kernels (names, ranges, parameters, launch sites), each
kernel's spec block with its parse or its errors, and what an editor needs beside (where a
signature ends, a kernel's whole lines). Made from the text and path alone; positions are 0-based
(line, column) in code points, like the source model's.

Spec parses of unchanged spec comments are reused across calls: typing elsewhere in a large file
leaves almost every spec as it was, and parsing them is most of an outline."""

from __future__ import annotations

import functools
import hashlib
import logging
import threading
from dataclasses import dataclass

from pydantic import BaseModel, Field
from tree_sitter import Tree

from optiml.cuda.draft import draft_spec as _draft_spec
from optiml.cuda.source import Kernel, SourceFile, changed, reparse_tree
from optiml.errors import Position, SpecError
from optiml.spec import Spec, parse_spec

logger = logging.getLogger(__name__)

Point = tuple[int, int]  # 0-based (line, column), in code points


class Range(BaseModel):
    start: Point
    end: Point


class SpecIssue(BaseModel):
    """One error of a spec: what is wrong and what would be right, at its place in the file."""

    message: str
    position: Position


class Parameter(BaseModel):
    name: str
    declared: str  # its type as declared: `const float*`


class KernelOutline(BaseModel):
    name: str  # qualified with namespaces
    range: Range  # the whole definition, `template <...>` line included
    name_range: Range
    body_start: Point
    signature_line: int  # where the parameter list closes (the body may open there or below)
    first_line: int  # the kernel's whole lines: from its spec comment (or definition) ...
    last_line: int  # ... to its closing brace
    parameters: list[Parameter]
    template: bool  # a template kernel
    spec_range: Range | None = None  # its `@optiml` comment, if it has one
    spec: Spec | None = None  # the comment's parse, if it parsed
    spec_issues: list[SpecIssue] = Field(default_factory=list)  # else why not
    launches: list[Range] = Field(default_factory=list)  # `<<<...>>>` sites in the file


@dataclass(frozen=True)
class Syntax:
    """A text's UTF-8 and its tree-sitter tree."""

    data: bytes
    tree: Tree

    def edit(self, text: str) -> tuple[Syntax, bool]:
        """`text` (a later version of this one) parsed incrementally from this parse, and whether
        the one region in which the texts differ and every range whose syntax tree-sitter finds
        changed lie inside one function's body, between its braces: then the file's functions,
        their signatures and the comments above them are as they were."""
        data = text.encode("utf-8")
        region = changed(self.data, data)
        start, _, end = region
        edited, tree = reparse_tree(self.data, self.tree, data, region)
        after = Syntax(data, tree)
        node = tree.root_node.descendant_for_byte_range(start, end)
        while node is not None and node.type != "function_definition":
            node = node.parent
        body = node.child_by_field_name("body") if node is not None else None
        if body is None or body.type != "compound_statement":
            return after, False
        inside = range(body.start_byte + 1, body.end_byte)  # after `{`, up to `}`
        if (
            not (start in inside and end in inside)
            or data[body.end_byte - 1 : body.end_byte] != b"}"
        ):
            return after, False
        ranges = edited.changed_ranges(tree)
        return after, all(r.start_byte in inside and r.end_byte in inside for r in ranges)


class Outline(BaseModel):
    path: str
    kernels: list[KernelOutline] = Field(default_factory=list)
    error: str | None = None  # why the file could not be read at all

    def kernel(self, name: str) -> KernelOutline | None:
        return next((k for k in self.kernels if k.name == name), None)

    @property
    def specs(self) -> dict[str, Spec]:
        return {k.name: k.spec for k in self.kernels if k.spec is not None}

    @property
    def spec_issues(self) -> list[SpecIssue]:
        return [i for k in self.kernels for i in k.spec_issues]


def outline(text: str, path: str = "<memory>") -> Outline:
    """The outline of `text` as the file at `path` (which a spec's NumPy reference is found
    beside). Never raises for what the text holds: a bug in reading it is the outline's `error`
    (or a spec issue), its traceback in the log."""
    try:
        source = _source(text, path)
        _remember(source)  # a version outlined again (from the cache) is the path's last again
    except Exception as e:  # tree-sitter reads any text, so this is a bug in the source model
        logger.exception("parsing %s", path)
        return Outline(
            path=path, error=f"OptiML could not read this file ({_what(e)}); see the server log"
        )
    # every kernel's name and parameter types, digested once: a `reference:` depends on them
    kernels = hashlib.sha1(
        repr([(k.name, [p.declared for p in k.params]) for k in source.kernels]).encode()
    ).hexdigest()
    launches: dict[str, list[Range]] = {}
    for site in source.launch_sites():
        launches.setdefault(site.kernel.rsplit("::", 1)[-1], []).append(_range(site.span))
    return Outline(
        path=path, kernels=[_kernel(source, k, kernels, launches) for k in source.kernels]
    )


def syntax(text: str, path: str = "<memory>") -> Syntax | None:
    """The tree-sitter parse `outline` made of `text` as the file at `path`, while it is the last
    one made for that path (None after another version's, or before any): for `Syntax.edit`."""
    with _LAST_LOCK:
        source = _LAST.get(path)
    if source is None or source.text != text:
        return None
    return Syntax(source._bytes, source.tree)


def _kernel(
    source: SourceFile, k: Kernel, kernels: str, launches: dict[str, list[Range]]
) -> KernelOutline:
    spec, issues = None, []
    if k.spec_comment is not None:
        try:
            spec, issues = _SPECS.parse(source, k, kernels)
        except Exception as e:  # a bug in the spec parser: report it where the user looks
            logger.exception("parsing the spec of %s in %s", k.name, source.path)
            at = source.position(k.spec_comment.span.start)
            issue = f"OptiML could not read this spec ({_what(e)}); see the server log"
            issues = [SpecIssue(message=issue, position=at)]
    text, body = source.text, k.body_span.start
    close = k.name_span.end + len(text[k.name_span.end : body].rstrip())
    first = k.spec_comment.span if k.spec_comment is not None else k.span
    # Built without validation (the data is the source model's own, of the declared types): on
    # a file of a thousand kernels, validating every outline on every edit was half an outline.
    return KernelOutline.model_construct(
        name=k.name,
        range=_range(k.span),
        name_range=_range(k.name_span),
        body_start=k.body_span.start_point,
        signature_line=k.body_span.start_point[0] - text.count("\n", close, body),
        first_line=first.start_point[0],
        last_line=k.span.end_point[0],
        parameters=[Parameter.model_construct(name=p.name, declared=p.declared) for p in k.params],
        template=bool(k.template_params),
        spec_range=_range(k.spec_comment.span) if k.spec_comment is not None else None,
        spec=spec,
        spec_issues=issues,
        launches=launches.get(k.name.rsplit("::", 1)[-1], []),
    )


def draft_spec(text: str, path: str, kernel: str) -> str:
    """A drafted `@optiml` comment for `kernel` (from its signature, the body's reads and writes,
    the host's allocations and a launch in the same file); the text is not changed."""
    source = _source(text, path)
    return _draft_spec(source, source.kernel(kernel))


def _range(span) -> Range:
    return Range.model_construct(start=span.start_point, end=span.end_point)


def _what(e: Exception) -> str:
    """An unexpected exception in one line, for a diagnostic: its type and first non-blank line, at
    most 200 characters."""
    line = next((x.strip() for x in str(e).splitlines() if x.strip()), "")
    return f"{type(e).__name__}: {line if len(line) <= 200 else line[:199] + '…'}"


@functools.lru_cache(maxsize=8)
def _source(text: str, path: str) -> SourceFile:
    """The source model of a text, kept for the few texts asked about last (an editor asks for the
    outline and then a draft of the same version); parsed from the tree of the last one made for
    the same path (an editor's previous version: tree-sitter re-parses only what changed)."""
    with _LAST_LOCK:  # a buffer with no file is no version of the last one seen
        previous = _LAST.get(path) if path != "<memory>" else None
    source = SourceFile(text, path, previous)
    _remember(source)
    return source


def _remember(source: SourceFile) -> None:
    """`source` as the last parse of its path (the next version's starts from its tree)."""
    with _LAST_LOCK:  # outlines are made on several threads (the server's parse, jobs)
        _LAST.pop(source.path, None)
        _LAST[source.path] = source
        while len(_LAST) > _LAST_PATHS:
            _LAST.pop(next(iter(_LAST)), None)


_LAST: dict[str, SourceFile] = {}  # the last source model made for each path, newest last
_LAST_PATHS = 16
_LAST_LOCK = threading.Lock()


class SpecCache:
    """Spec parses of unchanged spec comments, reused across versions.

    A parse depends on the comment's text and column, the kernel's signature, the other kernels'
    names and parameters (a `reference:`) and the file's path (a NumPy reference's folder); an
    entry found again under a moved comment has its error positions moved by as many lines."""

    LIMIT = 4096

    def __init__(self) -> None:
        self._entries: dict[tuple, tuple[Spec | None, list[SpecIssue], int]] = {}
        self._lock = threading.Lock()

    def parse(
        self, source: SourceFile, kernel: Kernel, kernels: str
    ) -> tuple[Spec | None, list[SpecIssue]]:
        """`kernels`: a digest of every kernel's name and parameter types, made once per file."""
        comment = kernel.spec_comment
        assert comment is not None
        line, column = comment.span.start_point
        signature = source.text[kernel.span.start : kernel.body_span.start]
        key = (source.path, comment.text, column, signature, kernels)
        with self._lock:
            hit = self._entries.get(key)
        if hit is None:
            try:
                spec, issues = parse_spec(source, kernel), []
            except SpecError as e:
                spec = None
                issues = [SpecIssue(message=m, position=p) for m, p in e.issues]
            hit = (spec, issues, line)
            with self._lock:
                if len(self._entries) >= self.LIMIT:
                    self._entries.clear()
                self._entries[key] = hit
        spec, issues, cached_line = hit
        shift = line - cached_line
        if shift:
            issues = [
                SpecIssue(message=i.message, position=_moved(i.position, shift)) for i in issues
            ]
        return spec, issues


def _moved(p: Position, lines: int) -> Position:
    end = p.end_line + lines if p.end_line is not None else None
    return Position(p.path, p.line + lines, p.column, end, p.end_column)


_SPECS = SpecCache()

__all__ = [
    "KernelOutline",
    "Outline",
    "Parameter",
    "Range",
    "SpecIssue",
    "draft_spec",
    "outline",
]
