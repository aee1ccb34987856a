"""Open `.cu`/`.cuh` documents: each version a `Snapshot`, parsed off the event loop into a `Model`
(`optiml.api.Outline`: kernels, specs and spec errors). A burst of edits costs one parse per catch-up, not one
per keystroke: a parse always takes the newest text, and its waiters get the newest model.

Requests that read kernels by position (code actions, hover, inlay hints) do not wait for the parse
of a text that differs from the last parsed one only where it cannot change the outline: typing
inside a function's body (see `carried`). They get the last parse carried over the edits — its
kernels moved where they are now — which is what a parse of the new text says wherever that text
has no syntax error; anything else waits for the parse. An edit's parse starts once the typing
pauses (`PARSE_DELAY_S`), from the previous version's tree."""

from __future__ import annotations

import asyncio
import bisect
import gc
import hashlib
import logging
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path

from lsprotocol import types
from pygls.uris import to_fs_path
from pygls.workspace.position_codec import PositionCodec

from optiml.api import (
    KernelOutline,
    Outline,
    Position,
    Spec,
    SpecIssue,
    Syntax,
    changed,
    outline,
    syntax,
)

logger = logging.getLogger(__name__)

CUDA_SUFFIXES = (".cu", ".cuh")
CUDA_LANGUAGES = ("cuda", "cuda-cpp")  # Neovim's filetype, VS Code's language id

Point = tuple[int, int]  # 0-based (line, character), in code points like the source model
# An edit's parse starts once the typing pauses this long: while keys come faster, requests are
# answered from the last parse carried over the edits (`carried`), and no parse competes with them
# for the interpreter.
PARSE_DELAY_S = 0.15


@dataclass(frozen=True)
class Snapshot:
    """One version of a document: what jobs work on, never the live document."""

    uri: str
    version: int
    text: str

    @property
    def path(self) -> str:
        """The file's path (for `#line`, includes and messages), or the source model's
        `<memory>` for a buffer that is not a file."""
        return to_fs_path(self.uri) or "<memory>"

    @property
    def name(self) -> str:
        return Path(self.path).name if self.path != "<memory>" else self.uri


def is_cuda(uri: str, language_id: str | None = None) -> bool:
    return uri.endswith(CUDA_SUFFIXES) or language_id in CUDA_LANGUAGES


@dataclass(frozen=True)
class Region:
    """Where one text differs from the one before it: from `start` (in both) to `end` in the one
    before and to `now` in the new one. Points before it stay; points after it move with its end."""

    start: Point
    end: Point
    now: Point

    def point(self, p: Point) -> Point:
        if p < self.end:
            return p
        col = p[1] - self.end[1] + self.now[1] if p[0] == self.end[0] else p[1]
        return (p[0] + self.now[0] - self.end[0], col)

    def back(self, p: Point) -> Point:
        """Where a point of the new text was in the one before (a point inside the region: its
        start)."""
        if p < self.start:
            return p
        if p < self.now:
            return self.start
        col = p[1] - self.now[1] + self.end[1] if p[0] == self.now[0] else p[1]
        return (p[0] - self.now[0] + self.end[0], col)

    def line(self, line: int) -> int:
        if line >= self.end[0] and line > self.start[0]:
            return line + self.now[0] - self.end[0]
        return line


@dataclass(frozen=True)
class Carry:
    """How the positions of a parse move over the edits since, none of which can change it: its
    regions, each in the text the one before it left."""

    regions: tuple[Region, ...]

    def point(self, p: Point) -> Point:
        for r in self.regions:
            p = r.point(p)
        return p

    def back(self, p: Point) -> Point:
        for r in reversed(self.regions):
            p = r.back(p)
        return p

    def line(self, line: int) -> int:
        for r in self.regions:
            line = r.line(line)
        return line

    def range(self, r):
        start, end = self.point(r.start), self.point(r.end)
        return (
            r
            if (start, end) == (r.start, r.end)
            else r.model_copy(update={"start": start, "end": end})
        )

    def position(self, p: Position) -> Position:
        """A 1-based position of a spec issue."""
        line, col = self.point((p.line - 1, p.column - 1))
        if p.end_line is None or p.end_column is None:
            return replace(p, line=line + 1, column=col + 1)
        end_line, end_col = self.point((p.end_line - 1, p.end_column - 1))
        return Position(p.path, line + 1, col + 1, end_line + 1, end_col + 1)

    def kernel(self, k: KernelOutline) -> KernelOutline:
        """`k` where it is now (itself where all of it is before every edit)."""
        last = max([k.range.end, *(r.end for r in k.launches)])
        if all(last < r.start for r in self.regions):
            return k
        return k.model_copy(
            update={
                "range": self.range(k.range),
                "name_range": self.range(k.name_range),
                "body_start": self.point(k.body_start),
                "signature_line": self.line(k.signature_line),
                "first_line": self.line(k.first_line),
                "last_line": self.line(k.last_line),
                "spec_range": self.range(k.spec_range) if k.spec_range is not None else None,
                "spec_issues": [
                    SpecIssue(message=i.message, position=self.position(i.position))
                    for i in k.spec_issues
                ],
                "launches": [self.range(r) for r in k.launches],
            }
        )


@dataclass(frozen=True)
class Index:
    """Lookups of an outline's kernels by position, made once per parse."""

    starts: list[Point]  # where each kernel's definition starts, in the file's order
    launch_lines: frozenset[int]  # the lines that hold a part of a `<<<...>>>` launch site

    @classmethod
    def of(cls, outline: Outline) -> Index:
        launches = {
            line
            for k in outline.kernels
            for r in k.launches
            for line in range(r.start[0], r.end[0] + 1)
        }
        return cls([k.range.start for k in outline.kernels], frozenset(launches))


@dataclass
class Model:
    """The parse of one snapshot (or the last parse carried over an edit that cannot change it: then
    `carry` says how its positions moved). Positions in LSP messages are in the client's units
    (UTF-16 by default), the source model's in code points: `range` and `point` convert."""

    snapshot: Snapshot
    codec: PositionCodec
    lines: list[str]
    outline: Outline
    carry: Carry | None = field(default=None)
    syntax: Syntax | None = field(default=None)  # its text's tree-sitter parse, if at hand
    index: Index = field(default=None)  # type: ignore[assignment]  # made from `outline`

    def __post_init__(self) -> None:
        if self.index is None:
            self.index = Index.of(self.outline)

    @cached_property
    def kernels(self) -> list[KernelOutline]:
        if self.carry is None:
            return self.outline.kernels
        return [self.carry.kernel(k) for k in self.outline.kernels]

    def kernels_at(self, start: Point, end: Point) -> list[KernelOutline]:
        """The kernels whose definition overlaps `start`..`end` (a search: definitions are in the
        file's order and do not overlap), without carrying the others."""
        c, kernels = self.carry, self.outline.kernels
        first, last = (c.back(start), c.back(end)) if c is not None else (start, end)
        i = bisect.bisect_right(self.index.starts, last)
        found = []
        while i > 0 and kernels[i - 1].range.end >= first:
            i -= 1
            k = kernels[i] if c is None else c.kernel(kernels[i])
            if k.range.start <= end and start <= k.range.end:
                found.append(k)
        return found[::-1]

    @property
    def specs(self) -> dict[str, Spec]:
        return self.outline.specs  # a spec's parse has no position that a carry moves

    @property
    def spec_issues(self) -> list[SpecIssue]:
        return [i for k in self.kernels for i in k.spec_issues]

    @property
    def error(self) -> str | None:
        """Why the file could not be read at all."""
        return self.outline.error

    def position(self, point: Point) -> types.Position:
        line, col = self._clamp(point)
        return self.codec.position_to_client_units(self.lines, types.Position(line, col))

    def range(self, start: Point, end: Point) -> types.Range:
        return types.Range(self.position(start), self.position(end))

    def point(self, position: types.Position) -> Point:
        p = self.codec.position_from_client_units(
            self.lines, types.Position(position.line, position.character)
        )
        return (p.line, p.character)

    def line_end(self, line: int) -> Point:
        line = min(line, len(self.lines) - 1)
        return (line, len(self.lines[line].rstrip("\r")))

    def block(self, kernel: KernelOutline) -> Block:
        return kernel_block(self.lines, kernel)

    def kernel(self, name: str) -> KernelOutline | None:
        found = self.outline.kernel(name)
        return found if found is None or self.carry is None else self.carry.kernel(found)

    def _clamp(self, point: Point) -> Point:
        line = min(max(point[0], 0), len(self.lines) - 1)
        return (line, min(max(point[1], 0), len(self.lines[line])))


@dataclass(frozen=True)
class Block:
    """A kernel's whole lines, from its spec comment (or its definition, without one) to its closing
    brace: what a profile or a proposal is about, and what must be unchanged for them to apply."""

    first: int  # 0-based lines, both included
    last: int
    text: str

    @property
    def digest(self) -> str:
        return hashlib.sha1(self.text.encode()).hexdigest()


def kernel_block(lines: list[str], kernel: KernelOutline) -> Block:
    first, last = kernel.first_line, kernel.last_line
    return Block(first, last, "\n".join(lines[first : last + 1]))


def parse(snapshot: Snapshot, codec: PositionCodec) -> Model:
    lines = snapshot.text.split("\n")  # the source model counts lines by "\n" too
    made = outline(snapshot.text, snapshot.path)
    return Model(snapshot, codec, lines, made, syntax=syntax(snapshot.text, snapshot.path))


def carried(model: Model, snapshot: Snapshot) -> Model | None:
    """`model` (a parse of an older text, or one carried over edits since) carried over to
    `snapshot`, where the one region in which their texts differ lies inside one function's body,
    away from launch sites, and cannot move where any function begins or ends: tree-sitter's
    incremental re-parse finds the syntax changed only inside that body (`Syntax.edit`), or, in a
    kernel's body, the edit leaves the braces, quotes, comments and directives as they were
    (`_lexically_inside`: a half-typed `if (` is a syntax error, from which tree-sitter's recovery
    may end the function at another brace, but the kernel is where its braces say). None
    otherwise: the caller waits for the parse."""
    if model.error is not None:
        return None
    old, new = model.snapshot.text, snapshot.text
    start, old_end, new_end = changed(old, new)
    first, end = _point(old, start), _point(old, old_end)
    stop = new.find("\n", new_end)
    middle = new[start - first[1] : len(new) if stop < 0 else stop].split("\n")
    base = model.carry.back if model.carry is not None else (lambda p: p)
    touched = range(base((first[0], 0))[0], base((end[0], 1 << 30))[0] + 1)
    if any("<<<" in line for line in middle) or not model.index.launch_lines.isdisjoint(touched):
        return None  # a launch site's text changes, or one appears
    # The lexical test first: it reads a few lines, where a re-parse of a half-typed statement may
    # take tree-sitter's error recovery tens of milliseconds. A model carried that way has no tree
    # (the next edit is carried the same way, or waits for the parse).
    syntax = None
    if not _lexically_inside(model, old[start:old_end], new[start:new_end], first, end, middle):
        if model.syntax is None:
            return None
        syntax, inside = model.syntax.edit(new)
        if not inside:
            return None
    lines = model.lines[: first[0]] + middle + model.lines[end[0] + 1 :]
    regions = (model.carry.regions if model.carry is not None else ()) + (
        Region(first, end, _point(new, new_end)),
    )
    return Model(snapshot, model.codec, lines, model.outline, Carry(regions), syntax, model.index)


_LEXICAL = re.compile(r"[{}\"'#\\]")  # what a kernel's extent depends on, beside comments
_COMMENT_MARKS = ("//", "/*", "*/")
_BREAK_RISK = re.compile(r"[/\"'#\\]")  # a line break here may end a comment or a directive


def _lexically_inside(
    model: Model, removed: str, inserted: str, first: Point, end: Point, middle: list[str]
) -> bool:
    """Whether an edit from `first` to `end` (replaced by `inserted`; the new text's lines it
    touches: `middle`) lies inside one kernel's body, between its braces, and leaves the braces,
    quotes, comments and directives as they were."""
    found = model.kernels_at(first, end)
    if len(found) != 1:
        return False
    k = found[0]
    if not (k.body_start < first and end <= (k.range.end[0], k.range.end[1] - 1)):
        return False
    if _LEXICAL.search(removed) or _LEXICAL.search(inserted):
        return False
    before = "\n".join(model.lines[first[0] : end[0] + 1])
    after = "\n".join(middle)
    if any(before.count(mark) != after.count(mark) for mark in _COMMENT_MARKS):
        return False
    return not (("\n" in removed or "\n" in inserted) and _BREAK_RISK.search(before))


def _point(text: str, offset: int) -> Point:
    return (text.count("\n", 0, offset), offset - (text.rfind("\n", 0, offset) + 1))


class Document:
    def __init__(self, snapshot: Snapshot):
        self.snapshot = snapshot  # the newest text
        self.model: Model | None = None  # the newest finished parse
        # that parse carried over to the newest text, where it can be
        self.carried: Model | None = None
        self.parsing: asyncio.Task[None] | None = None


class Documents:
    def __init__(self) -> None:
        self.codec = PositionCodec()  # replaced at initialize by the negotiated encoding
        self._docs: dict[str, Document] = {}
        # One thread: parses run one at a time, and the loop keeps serving requests meanwhile.
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="optiml-parse")

    def get(self, uri: str) -> Document | None:
        return self._docs.get(uri)

    def __iter__(self) -> Iterator[Document]:
        return iter(list(self._docs.values()))

    async def update(self, snapshot: Snapshot, delay: float = 0.0) -> Model | None:
        """Take a new version and parse it: its model, or None when a newer version came first
        (whose update publishes instead) or the document was closed meanwhile. `delay`: start
        the parse only once no newer version came for that long (an edit's: `PARSE_DELAY_S`),
        unless a request asks for the model meanwhile."""
        doc = self._docs.setdefault(snapshot.uri, Document(snapshot))
        doc.snapshot = snapshot
        if delay > 0:
            await asyncio.sleep(delay)
            if doc.snapshot is not snapshot or self._docs.get(snapshot.uri) is not doc:
                return None
        await self._catch_up(doc)
        current = self._docs.get(snapshot.uri) is doc and doc.model is not None
        return doc.model if current and doc.model.snapshot is snapshot else None

    async def model(self, uri: str) -> Model | None:
        """The model of the newest version, waiting for its parse if one is running."""
        doc = self._docs.get(uri)
        if doc is None:
            return None
        if doc.model is None or doc.model.snapshot is not doc.snapshot:
            await self._catch_up(doc)
        return doc.model

    async def current(self, uri: str) -> Model | None:
        """The model of the newest version for a request that reads kernels where they are: the
        last parse carried over the edits since, if they cannot change it (`carried`), else the
        parse of the newest version, waiting for it."""
        doc = self._docs.get(uri)
        if doc is None:
            return None
        if doc.model is not None and doc.model.snapshot is not doc.snapshot:
            if doc.carried is None or doc.carried.snapshot is not doc.snapshot:
                # from the last carried model where there is one: each carry is one keystroke's
                doc.carried = carried(doc.carried or doc.model, doc.snapshot)
            if doc.carried is not None:
                return doc.carried
        return await self.model(uri)

    def close(self, uri: str) -> Document | None:
        return self._docs.pop(uri, None)

    def _catch_up(self, doc: Document) -> asyncio.Future[None]:
        if doc.parsing is None or doc.parsing.done():
            doc.parsing = asyncio.create_task(self._parse(doc))
        # shielded: a cancelled request must not cancel the parse others wait for
        return asyncio.shield(doc.parsing)

    async def _parse(self, doc: Document) -> None:
        loop = asyncio.get_running_loop()
        while doc.model is None or doc.model.snapshot is not doc.snapshot:
            doc.model = await loop.run_in_executor(self._pool, parse, doc.snapshot, self.codec)
            doc.carried = None
            # The parse's objects live until the next one: frozen, the collector's full sweeps
            # do not walk them (on a 20,000-line file, ~50,000 objects: a sweep of those the last
            # parses kept stalled the event loop for ~130 ms). The previous parse's are freed by
            # reference counts as it is replaced (they hold no cycles: over 200 parses the frozen
            # count stays flat), so freezing costs no memory.
            gc.freeze()
