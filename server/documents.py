"""Open `.cu`/`.cuh` documents: each version a `Snapshot`, parsed off the event loop into a `Model`
(source model plus specs and spec errors). A burst of edits costs one parse per catch-up, not one
per keystroke: a parse always takes the newest text, and its waiters get the newest model."""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from lsprotocol import types
from pygls.uris import to_fs_path
from pygls.workspace.position_codec import PositionCodec

from optiml.cuda.source import Kernel, SourceFile
from optiml.errors import Position, SpecError
from optiml.spec import Spec, parse_spec
from server.protocol import one_line

if TYPE_CHECKING:
    from server.checks import CheckOutcome

logger = logging.getLogger(__name__)

CUDA_SUFFIXES = (".cu", ".cuh")
CUDA_LANGUAGES = ("cuda", "cuda-cpp")  # Neovim's filetype, VS Code's language id

Point = tuple[int, int]  # 0-based (line, character), in code points like the source model


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


@dataclass
class Model:
    """The parse of one snapshot. Positions in LSP messages are in the client's units (UTF-16 by
    default), the source model's in code points: `range` and `point` convert."""

    snapshot: Snapshot
    codec: PositionCodec
    lines: list[str]
    source: SourceFile | None
    specs: dict[str, Spec] = field(default_factory=dict)
    spec_issues: list[tuple[str, Position]] = field(default_factory=list)
    error: str | None = None  # why the file could not be read at all

    @property
    def kernels(self) -> list[Kernel]:
        return self.source.kernels if self.source else []

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

    def block(self, kernel: Kernel) -> Block:
        return kernel_block(self.lines, kernel)

    def kernel(self, name: str) -> Kernel | None:
        return next((k for k in self.kernels if k.name == name), None)

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


def kernel_block(lines: list[str], kernel: Kernel) -> Block:
    start = kernel.spec_comment.span if kernel.spec_comment is not None else kernel.span
    first, last = start.start_point[0], kernel.span.end_point[0]
    return Block(first, last, "\n".join(lines[first : last + 1]))


def parse(snapshot: Snapshot, codec: PositionCodec) -> Model:
    lines = snapshot.text.split("\n")  # the source model counts lines by "\n" too
    try:
        source = SourceFile(snapshot.text, snapshot.path)
    except Exception as e:  # tree-sitter reads any text, so this is a bug in the source model
        logger.exception("parsing %s", snapshot.uri)
        error = f"OptiML could not read this file ({_what(e)}); see the server log"
        return Model(snapshot, codec, lines, None, error=error)
    model = Model(snapshot, codec, lines, source)
    # every kernel's name and parameter types, digested once: a `reference:` depends on them
    kernels = hashlib.sha1(
        repr([(k.name, [p.declared for p in k.params]) for k in source.kernels]).encode()
    ).hexdigest()
    for k in source.kernels:
        if k.spec_comment is None:
            continue
        try:
            spec, issues = _SPECS.parse(source, k, kernels)
            if spec is not None:
                model.specs[k.name] = spec
            model.spec_issues.extend(issues)
        except Exception as e:  # a bug in the spec parser: report it where the user looks
            logger.exception("parsing the spec of %s in %s", k.name, snapshot.uri)
            at = source.position(k.spec_comment.span.start)
            issue = f"OptiML could not read this spec ({_what(e)}); see the server log"
            model.spec_issues.append((issue, at))
    return model


def _what(e: Exception) -> str:
    """An unexpected exception in one line, for a diagnostic: its type and first line."""
    return f"{type(e).__name__}: {one_line(str(e), 200)}"


class SpecCache:
    """Spec parses of unchanged spec comments, reused across versions: typing elsewhere in a
    large file leaves almost every spec as it was, and parsing them is most of a parse.

    A parse depends on the comment's text and column, the kernel's signature, the other kernels'
    names and parameters (a `reference:`) and the file's path (a NumPy reference's folder); an
    entry found again under a moved comment has its error positions moved by as many lines."""

    LIMIT = 4096

    def __init__(self) -> None:
        self._entries: dict[tuple, tuple[Spec | None, list[tuple[str, Position]], int]] = {}

    def parse(
        self, source: SourceFile, kernel: Kernel, kernels: str
    ) -> tuple[Spec | None, list[tuple[str, Position]]]:
        """`kernels`: a digest of every kernel's name and parameter types, made once per file."""
        comment = kernel.spec_comment
        line, column = comment.span.start_point
        signature = source.text[kernel.span.start : kernel.body_span.start]
        key = (source.path, comment.text, column, signature, kernels)
        hit = self._entries.get(key)
        if hit is None:
            try:
                spec, issues = parse_spec(source, kernel), []
            except SpecError as e:
                spec, issues = None, list(e.issues)
            if len(self._entries) >= self.LIMIT:
                self._entries.clear()
            self._entries[key] = hit = (spec, issues, line)
        spec, issues, cached_line = hit
        shift = line - cached_line
        if shift:
            issues = [(m, _moved(p, shift)) for m, p in issues]
        return spec, issues


def _moved(p: Position, lines: int) -> Position:
    end = p.end_line + lines if p.end_line is not None else None
    return Position(p.path, p.line + lines, p.column, end, p.end_column)


# Parses run on one worker thread (Documents._pool), so the cache needs no lock.
_SPECS = SpecCache()


class Document:
    def __init__(self, snapshot: Snapshot):
        self.snapshot = snapshot  # the newest text
        self.model: Model | None = None  # the newest finished parse
        self.check: CheckOutcome | None = None  # the newest finished compile
        self.parsing: asyncio.Task[None] | None = None


class Documents:
    def __init__(self) -> None:
        self.codec = PositionCodec()  # replaced at initialize by the negotiated encoding
        self._docs: dict[str, Document] = {}
        # One thread: parses run one at a time, and the loop keeps serving requests meanwhile.
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="optiml-parse")

    def get(self, uri: str) -> Document | None:
        return self._docs.get(uri)

    def check(self, uri: str) -> CheckOutcome | None:
        doc = self._docs.get(uri)
        return doc.check if doc is not None else None

    def __iter__(self) -> Iterator[Document]:
        return iter(list(self._docs.values()))

    async def update(self, snapshot: Snapshot) -> Model | None:
        """Take a new version and parse it: its model, or None when a newer version came first
        (whose update publishes instead) or the document was closed meanwhile."""
        doc = self._docs.setdefault(snapshot.uri, Document(snapshot))
        doc.snapshot = snapshot
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
