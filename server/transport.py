"""The LSP base protocol on the server's side: frames (a header block with `Content-Length`, a blank
line, then a UTF-8 JSON body) read from a byte stream and checked before pygls sees them.

pygls's own loop (`pygls.io_.run_async`) trusts the stream. A header it cannot read, a header block
without its blank line, or a body longer or shorter than its `Content-Length` put it out of step
with the frames for good: it reads the next frame's header as a body and that frame's body as a
header, and never answers again. A huge length makes it wait for bytes that never come. Here:

- a frame whose header is bad (a missing, negative, non-numeric or duplicated `Content-Length`, one
  over `MAX_BODY`, a line that is no header, a block that does not end) is skipped, and reading
  resumes at the next `Content-Length:` in the stream; nothing in it can be answered;
- a body cut short by the next frame's header (its `Content-Length` was too large), whether that
  header lies inside the body or begins in its last bytes, is answered with a ParseError, and
  reading resumes at that header. JSON never holds a header line (a raw line break is not allowed
  inside a JSON string) nor ends with the start of one, so a well-formed body is never cut;
- a body that is not UTF-8 or not JSON gets a ParseError; JSON that is not a JSON-RPC message an
  InvalidRequest, with the message's id where it can be read, else id null (JSON-RPC 2.0, 5.1);
- what pygls cannot structure (params of the wrong shape) is answered by `server.protocol`;
- after `exit`, what is still running gets `EXIT_GRACE_S` seconds to end (`asyncio.run` would
  wait for it without limit).

The reader wraps pygls's stdin reader (`StdinAsyncReader`, reading on the server's thread pool) or
the TCP connection's `asyncio.StreamReader`; the loop hands each message to the pygls protocol."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import sys
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, BinaryIO

from pygls.exceptions import (
    JsonRpcInternalError,
    JsonRpcInvalidRequest,
    JsonRpcParseError,
)
from pygls.io_ import StdinAsyncReader, StdoutWriter

if TYPE_CHECKING:
    from server.protocol import Protocol

logger = logging.getLogger(__name__)

MAX_BODY = 64 * 2**20  # bytes; a longer frame is skipped unread
MAX_HEADER = 8 * 1024  # bytes in one header block
CHUNK = 64 * 1024
EXIT_GRACE_S = 3.0  # for what is still running when the server exits

_CONTENT_LENGTH = re.compile(rb"content-length[ \t]*:", re.IGNORECASE)
# A complete `Content-Length` header line: inside a body, proof that the body was cut short.
_HEADER_LINE = re.compile(rb"content-length[ \t]*:[ \t]*\d+[ \t]*\r?\n", re.IGNORECASE)
_FIELD = re.compile(rb"([!#$%&'*+.^_`|~0-9A-Za-z-]+)[ \t]*:[ \t]*(.*?)[ \t]*")

Read = Callable[[int], Awaitable[bytes]]


class StdinReader(StdinAsyncReader):
    """pygls's stdin reader, which can also read what has arrived so far (up to `n` bytes) instead
    of waiting for an exact count: a frame's declared length is not to be trusted."""

    def read_some(self, n: int) -> Awaitable[bytes]:
        return self.loop.run_in_executor(self.executor, self.stdin.read1, n)


@dataclass(frozen=True)
class Broken:
    """A header block that cannot be read: why, and where to look for the next frame (the next
    line after a bad value: the lines that follow may be the next frame's)."""

    resume: int
    why: str


@dataclass(frozen=True)
class Frame:
    """A body as the header framed it, or (`body` None) a body cut short, with why."""

    body: bytes | None
    problem: str = ""


class FrameReader:
    """Frames from a byte stream, resynchronised on the next `Content-Length:` after a bad one."""

    def __init__(self, read: Read, max_body: int = MAX_BODY) -> None:
        self._read = read
        self._max_body = max_body
        self._buf = bytearray()
        self._eof = False
        self.skipped = 0  # bytes thrown away while resynchronising

    def reset(self) -> None:
        """Forget what is buffered (a bug met it); reading resumes with the next bytes."""
        self.skipped += len(self._buf)
        self._buf.clear()

    async def next(self) -> Frame | None:
        """The next frame, or None at the end of the stream."""
        header = await self._header()
        return await self._body(*header) if header is not None else None

    async def _fill(self, want: int = CHUNK) -> bool:
        if self._eof:
            return False
        chunk = await self._read(max(1, min(want, 16 * CHUNK)))
        if not chunk:
            self._eof = True
            return False
        self._buf += chunk
        return True

    def _skip(self, n: int, why: str) -> None:
        """Drop `n` bytes from the buffer, saying why if `why`."""
        if why:
            logger.warning("skipped a frame: %s", why)
        del self._buf[:n]
        self.skipped += n

    async def _resync(self) -> bool:
        """Drop bytes up to the next `Content-Length:` (there may be none yet); False at the end."""
        while True:
            found = _CONTENT_LENGTH.search(self._buf)
            if found is not None:
                if found.start():
                    logger.warning("skipped %d bytes that were not a frame", found.start())
                    self._skip(found.start(), "")
                return True
            keep = len(b"content-length:") - 1  # a header may straddle two reads
            if len(self._buf) > keep:
                self._skip(len(self._buf) - keep, "")
            if not await self._fill():
                if self._buf:
                    logger.warning(
                        "the stream ended amid %d bytes that were not a frame", len(self._buf)
                    )
                return False

    async def _header(self) -> tuple[int, int] | None:
        """(where the body starts, its length) of the next well-formed header block."""
        while True:
            while not self._buf:
                if not await self._fill():
                    return None
            parsed = self._parse_header()
            if parsed is None:  # incomplete: read on
                if len(self._buf) > MAX_HEADER:
                    self._skip(1, f"no header block ends within {MAX_HEADER} bytes")
                    if not await self._resync():
                        return None
                elif not await self._fill():
                    if self._buf:
                        logger.warning("the stream ended amid a header")
                    return None
                continue
            if isinstance(parsed, Broken):
                self._skip(parsed.resume, parsed.why)
                if not await self._resync():
                    return None
                continue
            return parsed

    def _parse_header(self) -> tuple[int, int] | Broken | None:
        """The header block at the start of the buffer: (body start, length), what is wrong with
        it, or None if it is not all there yet."""
        at, length = 0, None
        while True:
            end = self._buf.find(b"\n", at, MAX_HEADER + 1)
            if end < 0:
                return None
            line = bytes(self._buf[at:end]).removesuffix(b"\r")
            start, at = at, end + 1
            if not line:
                if length is None:
                    return Broken(at, "a header block without Content-Length")
                return at, length
            field = _FIELD.fullmatch(line)
            if field is None:  # perhaps a frame's start after bytes that were not one
                return Broken(start + 1, f"not a header line: {_show(line)}")
            if (inner := _CONTENT_LENGTH.search(line, 1)) is not None:
                # `abc` + `Content-Length: 5`: a frame's start after bytes that were not one
                return Broken(
                    start + inner.start(), f"not a header: {_show(line[: inner.start()])}"
                )
            if field.group(1).lower() != b"content-length":
                continue  # Content-Type (always UTF-8 JSON) or an unknown header
            value = field.group(2)
            if not value.isdigit():
                return Broken(at, f"Content-Length is not a number of bytes: {_show(value)}")
            if len(value.lstrip(b"0")) > 18 or int(value) > self._max_body:
                return Broken(at, f"Content-Length {_show(value)} is over {self._max_body} bytes")
            if length is not None and int(value) != length:
                return Broken(at, "two different Content-Length headers")
            length = int(value)

    async def _body(self, start: int, length: int) -> Frame | None:
        """The body after the header block; a Frame without body if the next frame's header
        begins before its end (that header starts the next frame); None if the stream ends
        first."""
        scanned = start
        while True:
            end = min(len(self._buf), start + length)
            found = _HEADER_LINE.search(self._buf, scanned, end)
            cut = found.start() if found is not None else None
            if cut is None and end == start + length:
                cut = _header_tail(self._buf, start, end)
                if cut is None:
                    break
            if cut is not None:
                self._skip(cut, "")
                problem = (
                    f"the body ended after {cut - start} of its {length} bytes (Content-Length)"
                )
                logger.warning("skipped a frame: %s", problem)
                return Frame(None, problem)
            scanned = max(start, end - 64)  # a header line may straddle two reads
            if not await self._fill(start + length - len(self._buf)):
                logger.warning("the stream ended amid a body of %d bytes", length)
                self._skip(len(self._buf), "")
                return None
        body = bytes(self._buf[start : start + length])
        del self._buf[: start + length]
        return Frame(body)


_NAME = b"content-length"
_HEADER_TAIL = re.compile(rb"content-length[ \t]*(?::[ \t]*\d*\r?)?", re.IGNORECASE)


def _header_tail(buf: bytearray, start: int, end: int) -> int | None:
    """Where a header line begins that the body `buf[start:end]` ends in the middle of (its
    length was a few bytes too large), or None. JSON never ends so (it ends with `}`, `]`, `"`, a
    digit or a literal), so a well-formed body is never cut."""
    for at in range(max(start, end - 40), end):
        tail = bytes(buf[at:end])
        if _NAME.startswith(tail.lower()) or _HEADER_TAIL.fullmatch(tail):
            return at
    return None


def _show(raw: bytes, limit: int = 60) -> str:
    text = raw[:limit].decode("utf-8", "replace")
    return repr(text) + ("…" if len(raw) > limit else "")


# ---- messages -----------------------------------------------------------------------------------


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def decode(body: bytes) -> Any:
    """The JSON value of a body; JsonRpcParseError with what is wrong otherwise."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise JsonRpcParseError(f"Parse error: the body is not UTF-8 (byte {e.start})") from None
    try:
        return json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as e:
        raise JsonRpcParseError(f"Parse error: {e.msg} at byte {e.pos}") from None
    except (ValueError, RecursionError) as e:  # NaN, a 5,000-digit number, 100,000 `[`
        raise JsonRpcParseError(f"Parse error: {str(e).splitlines()[0][:120]}") from None


def is_id(value: Any) -> bool:
    """An LSP message id: an integer or a string (JSON-RPC also allows null and fractions; LSP
    does not)."""
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def check(data: Any) -> str | None:
    """What makes `data` not a JSON-RPC 2.0 message, or None. Requests, notifications and
    responses; LSP has no batches."""
    if isinstance(data, list):
        return "a batch (a JSON array): LSP sends one message per frame"
    if not isinstance(data, dict):
        return f"a message must be a JSON object, got {_json_type(data)}"
    if data.get("jsonrpc") != "2.0":
        return 'a message must have "jsonrpc": "2.0"'
    if "method" in data:
        if not isinstance(data["method"], str):
            return f'"method" must be a string, got {_json_type(data["method"])}'
        if "id" in data and not is_id(data["id"]):
            return f'"id" must be an integer or a string, got {_json_type(data["id"])}'
        if "params" in data and not isinstance(data["params"], dict | list | None):
            return f'"params" must be an object or an array, got {_json_type(data["params"])}'
        return None
    if "id" in data and ("result" in data or "error" in data):  # to one of the server's requests
        return None if is_id(data["id"]) else "a response's id must be an integer or a string"
    return 'a message needs "method" (a request or notification) or "result"/"error" (a response)'


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"


def dispatch(protocol: Protocol, body: bytes) -> None:
    """One body: parsed, checked, structured and handled by `protocol`, or answered with the
    error that says why not."""
    try:
        data = decode(body)
    except JsonRpcParseError as e:
        logger.warning("%s", e.message)
        protocol.reply_error(None, e)
        return
    problem = check(data)
    if problem is not None:
        logger.warning("invalid message: %s", problem)
        if (
            isinstance(data, dict)
            and "method" not in data
            and ("result" in data or "error" in data)
        ):
            return  # a response of the client's is never answered
        msg_id = data.get("id") if isinstance(data, dict) else None
        protocol.reply_error(msg_id if is_id(msg_id) else None, JsonRpcInvalidRequest(problem))
        return
    try:
        protocol.receive(data)
    except Exception as e:  # a bug here or in pygls, not in a handler (pygls catches those)
        logger.exception("handling a message")
        if "method" in data and is_id(data.get("id")):
            protocol.reply_error(data["id"], JsonRpcInternalError(f"{type(e).__name__}: {e}"))
        else:
            protocol._server._report_server_error(e, JsonRpcInternalError)


async def run(stop_event: threading.Event, frames: FrameReader, protocol: Protocol) -> None:
    """Read and handle messages until the stream ends or the server stops (`exit` raises
    SystemExit out of here, as in pygls's loop)."""
    while not stop_event.is_set():
        try:
            frame = await frames.next()
        except OSError:
            logger.exception("reading from the client")
            break
        except Exception:  # a bug in the reader: what it holds is lost, not the connection
            logger.exception("reading a frame; resuming with the next bytes")
            frames.reset()
            continue
        if frame is None:
            break
        if frame.body is None:
            protocol.reply_error(None, JsonRpcParseError(f"Parse error: {frame.problem}"))
            continue
        dispatch(protocol, frame.body)


# ---- serving ------------------------------------------------------------------------------------


def serve_io(server: Any, stdin: BinaryIO | None = None, stdout: BinaryIO | None = None) -> int:
    """pygls's `start_io` with this module's reader and loop; the exit code `exit` asked for
    (0 after `shutdown`, 1 without), 0 when the client closed the stream."""
    server._stop_event = threading.Event()
    reader = StdinReader(stdin or sys.stdin.buffer, server.thread_pool)
    server.protocol.set_writer(StdoutWriter(stdout or sys.stdout.buffer))
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    code = 0
    try:
        loop.run_until_complete(
            run(server._stop_event, FrameReader(reader.read_some), server.protocol)
        )
    except BrokenPipeError:
        logger.error("the client is gone (broken pipe); shutting down")
    except KeyboardInterrupt:
        pass
    except SystemExit as e:  # `exit`
        code = e.code if isinstance(e.code, int) else 0
    finally:
        server.protocol.abandon()  # `exit` closed stdout, or the client is gone
        wind_down(loop)
        server.shutdown()
    return code


def wind_down(loop: asyncio.AbstractEventLoop, grace: float = EXIT_GRACE_S) -> None:
    """What `asyncio.run` does once its coroutine is done, within `grace` seconds: every task
    cancelled (a compile kills its process group) and given that long to finish. `asyncio.run`
    waits for them, and for the default executor's threads, without limit: one stuck task or
    thread and `exit` never ends the server."""
    tasks = asyncio.all_tasks(loop)
    for task in tasks:
        task.cancel()
    if tasks:
        _, pending = loop.run_until_complete(asyncio.wait(tasks, timeout=grace))
        for task in pending:
            logger.warning("still running %.0f s after exit, left behind: %r", grace, task)
        for task in tasks - pending:
            if not task.cancelled() and task.exception() is not None:
                logger.warning("at exit: %r", task.exception())
    loop.run_until_complete(loop.shutdown_asyncgens())
    asyncio.set_event_loop(None)
    loop.close()


def serve_tcp(server: Any, host: str, port: int) -> None:
    """pygls's `start_tcp` with this module's reader and loop: one client, then the server ends."""
    server._stop_event = stop_event = threading.Event()

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        logger.info("a client connected")
        server.protocol.set_writer(writer)
        await run(stop_event, FrameReader(reader.read), server.protocol)
        server.shutdown()

    async def listen() -> None:
        server._server = await asyncio.start_server(connection, host, port)
        logger.info("serving on %s:%s", host, port)
        async with server._server:
            await server._server.serve_forever()

    with contextlib.suppress(asyncio.CancelledError):
        asyncio.run(listen())
