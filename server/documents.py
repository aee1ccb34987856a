"""Open `.cu`/`.cuh` documents: each version a `Snapshot`, parsed off the event loop into a `Model`
(`optiml.api.Outline`: kernels, specs and spec errors). A burst of edits costs one parse per catch-up, not one
per keystroke: a parse always takes the newest text, and its waiters get the newest model."""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from lsprotocol import types
from pygls.uris import to_fs_path
from pygls.workspace.position_codec import PositionCodec

from optiml.api import KernelOutline, Outline, Spec, SpecIssue, outline

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
    outline: Outline

    @property
    def kernels(self) -> list[KernelOutline]:
        return self.outline.kernels

    @property
    def specs(self) -> dict[str, Spec]:
        return self.outline.specs

    @property
    def spec_issues(self) -> list[SpecIssue]:
        return self.outline.spec_issues

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
        return self.outline.kernel(name)

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
    return Model(snapshot, codec, lines, outline(snapshot.text, snapshot.path))


class Document:
    def __init__(self, snapshot: Snapshot):
        self.snapshot = snapshot  # the newest text
        self.model: Model | None = None  # the newest finished parse
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
