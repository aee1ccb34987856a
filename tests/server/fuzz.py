"""Fuzzing the language server over stdio: hypothesis strategies for message sequences, and a
client that sends them to a real `python -m server` process and judges what comes back. Shared by
tests/server/test_lsp_fuzz.py (a CI-sized run) and benchmarks/fuzz_lsp.py (thousands, seeded).

A sequence mixes well-formed requests and notifications (initialize or not, documents opened from
the fixtures' CUDA files, possibly mutated, edits at random ranges, hover, code actions, inlay
hints, code lenses and symbols at random positions, commands with arguments of every shape,
cancellations, shutdown and exit), JSON-RPC that is not well-formed (fields missing or of the
wrong type, unknown methods, ids of odd types) and frames that are not frames (bad lengths,
bodies cut short, bytes that are not UTF-8 or not JSON).

What the server must do, whatever it was sent: answer every well-formed request with a valid id
exactly once (before `exit`), keep answering (a hover on a newly opened document right after the
sequence), not exit unless told to (and then with 0 after `shutdown`, 1 without), write only
well-formed frames, and put no traceback, no Python exception repr, no multi-line error and no
"server error" (an unexpected exception) in anything it sends."""

from __future__ import annotations

import collections
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import strategies as st
from pygls.protocol import default_converter
from pytest_lsp import client_capabilities

ROOT = Path(__file__).resolve().parents[2]
FIXTURE_FILES = sorted((ROOT / "fixtures").rglob("*.cu"))  # wild/, broken/, candidates/ too
TEXTS = {p.relative_to(ROOT / "fixtures").as_posix(): p.read_text() for p in FIXTURE_FILES}
KERNELS = sorted({k for t in TEXTS.values() for k in re.findall(r"__global__\s+void\s+(\w+)", t)})

# Sizes the spec parser's bounded evaluator must refuse in one line, not evaluate for ever.
HUGE_EXPRESSIONS = (
    "10**10**10", "2**2**64", "(10**9)**(10**9)", "1 << 10**9", "1 << (1 << 40)", "7 << 99999999",
)  # fmt: skip
# What else goes into a spec's `sizes:` when a text is mutated: values the parser must refuse or
# take, in bounded time.
SIZE_EXPRESSIONS = (
    "0", "-1", "1/0", "1 % 0", "99999999999999999999999", "cdiv(", "n", "1 << 99", "2 * 3 +",
    "min(1, 2)", "x", "1e9", "'a'", "(((((1)))))", "",
)  # fmt: skip

ANSWER_TIMEOUT = 15.0  # seconds for every request of a sequence to be answered after it is sent
PROBE_TIMEOUT = 10.0  # seconds for the hover after a sequence
EXIT_TIMEOUT = 10.0

KNOWN_COMMANDS = (
    "optiml.addSpec", "optiml.optimize", "optiml.profile", "optiml.cancelJob",
    "optiml.acceptProposal", "optiml.rejectProposal", "optiml.compareProposal", "optiml.openReport",
)  # fmt: skip
URIS = (
    "file:///fuzz/a.cu", "file:///fuzz/b.cuh", "file:///fuzz/c%20d.cu", "file:///fuzz/notes.txt",
    "file:///fuzz/%C3%BC.cu", "untitled:Untitled-1", "http://example.com/x.cu", "not a uri", "",
)  # fmt: skip
LANGUAGES = ("cuda", "cuda-cpp", "cpp", "plaintext", "")
POSITION_REQUESTS = (
    "textDocument/hover", "textDocument/documentSymbol", "textDocument/definition",
    "textDocument/completion", "textDocument/references",
)  # fmt: skip
# Bits of text that edits and mutations insert: CUDA, spec keys, and characters that are more than
# one UTF-16 unit (positions are in UTF-16 units by default).
SNIPPETS = (
    "/* @optiml\n *   args: n, x: in float[n]\n */\n", "*/", "/*", "__global__ void k(int n) {}\n",
    "{", "}", ";", "\n", "\r\n", "\t", "sizes: n = ", "launch: grid = 1, block = ", "args: ",
    "inout", "float*", "template <typename T>\n", "#include <cuda_runtime.h>\n", "😋", "中文",
    "\u00e9", "\U0001f680\U0001f680", "\\", '"', "<<<1, 1>>>", "#define N 4\n", "\x00",
)  # fmt: skip

_converter = default_converter()
CAPABILITIES = {
    "none": {},
    "vscode": _converter.unstructure(client_capabilities("visual-studio-code")),
    "neovim": _converter.unstructure(client_capabilities("neovim")),
}


# ---- texts --------------------------------------------------------------------------------------


def size_expressions() -> tuple[str, ...]:
    """What a mutation may put in `sizes:`: ordinary expressions and huge ones."""
    return SIZE_EXPRESSIONS + HUGE_EXPRESSIONS


@st.composite
def cuda_texts(draw) -> str:
    """A fixture's text, as it is or with a few mutations (cut, doubled, inserted, lines
    swapped, a size replaced)."""
    text = draw(st.sampled_from(sorted(TEXTS.values())))
    for _ in range(draw(st.integers(0, 3))):
        kind = draw(st.sampled_from(["cut", "double", "insert", "swap", "size", "truncate"]))
        n = len(text)
        at = draw(st.integers(0, n)) if n else 0
        span = draw(st.integers(0, 80))
        if kind == "cut":
            text = text[:at] + text[at + span :]
        elif kind == "double":
            text = text[:at] + text[at : at + span] + text[at:]
        elif kind == "insert":
            piece = draw(st.sampled_from(SNIPPETS) | st.text(max_size=12))
            text = text[:at] + piece + text[at:]
        elif kind == "swap":
            lines = text.split("\n")
            i, j = draw(st.integers(0, len(lines) - 1)), draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
            text = "\n".join(lines)
        elif kind == "size":
            expression = draw(st.sampled_from(size_expressions()))
            text = re.sub(
                r"(sizes:\s*\w+\s*=\s*)[^,\n]*", lambda m, e=expression: m.group(1) + e, text
            )
        else:
            text = text[:at]
    return text


# ---- messages -----------------------------------------------------------------------------------


@dataclass
class Step:
    """What goes on the wire, with what is expected of it."""

    data: bytes
    label: str  # the method, or what kind of garbage
    request_id: int | str | None = None  # a well-formed request: exactly one answer awaited
    effect: str = ""  # "initialize", "shutdown" or "exit": what the runner's model follows


@dataclass
class Sequence:
    steps: list[Step]
    fresh: bool  # on a newly started server
    answers: str  # how the client answers the server's requests
    settings: Any  # what `workspace/configuration` answers

    def describe(self) -> list[str]:
        return [
            s.label if s.request_id is None else f"{s.label} #{s.request_id}" for s in self.steps
        ]


def frame(body: bytes) -> bytes:
    return b"Content-Length: %d\r\n\r\n%s" % (len(body), body)


def encode(message: Any, ascii_only: bool = True) -> bytes:
    return json.dumps(message, ensure_ascii=ascii_only).encode()


positions = st.one_of(
    st.builds(
        lambda line, ch: {"line": line, "character": ch}, st.integers(0, 80), st.integers(0, 120)
    ),
    st.builds(
        lambda line, ch: {"line": line, "character": ch},
        st.integers(0, 2**31 - 1),
        st.integers(0, 2**31 - 1),
    ),
)
ranges = st.builds(lambda a, b: {"start": a, "end": b}, positions, positions)
uris = st.sampled_from(URIS)
settings_values = st.one_of(
    st.none(),
    st.just({}),
    st.fixed_dictionaries(
        {},
        optional={
            "arch": st.sampled_from(["sm_90", "sm_80", "sm_1", None, 5]),
            "evaluations": st.sampled_from([1, 48, 0, -3, "x", None]),
            "policy": st.sampled_from(["offline", "llm", "nope"]),
            "gpus": st.sampled_from(["all", "0,1", "x", ""]),
            "unknown": st.integers(),
            "budget": st.sampled_from([1.5, 0, -1, "x"]),
            "baseUrl": st.sampled_from(["http://127.0.0.1:1/v1", "ftp://x", ""]),
        },
    ),
    st.integers(),
    st.text(max_size=5),
)
odd_ids = st.sampled_from([1.5, True, None, [1], {"a": 1}, -0.0, 1e300])
json_leaf = st.none() | st.booleans() | st.integers() | st.text(max_size=10)
json_any = st.recursive(
    json_leaf,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)


@st.composite
def command_arguments(draw, uri: str) -> Any:
    target = st.fixed_dictionaries(
        {},
        optional={
            "uri": st.sampled_from([uri, *URIS]) | json_leaf,
            "version": st.integers(-2, 5) | json_leaf,
            "kernel": st.sampled_from([*KERNELS, "nope", ""]) | json_leaf,
        },
    )
    one = st.one_of(
        target,
        st.fixed_dictionaries({"proposal": st.text(max_size=8) | json_leaf}),
        st.fixed_dictionaries({"job": st.text(max_size=8) | json_leaf}),
        json_any,
    )
    return draw(
        st.one_of(
            st.just(None),
            st.just([]),
            st.lists(one, min_size=1, max_size=3),
            st.builds(
                lambda v, k: [uri, v, k],
                st.integers(0, 5) | json_leaf,
                st.sampled_from(KERNELS) | st.text(max_size=6),
            ),
            json_leaf,  # not an array at all
        )
    )


class _Ids:
    def __init__(self) -> None:
        self.n = 0

    def next(self, draw) -> int | str:
        self.n += 1
        kind = draw(st.sampled_from(["int", "int", "str", "big", "negative"]))
        return {
            "int": self.n,
            "str": f"r{self.n}",
            "big": 2**70 + self.n,
            "negative": -self.n,
        }[kind]


def _request(ids: _Ids, draw, method: str, params: Any, **kw) -> Step:
    msg_id = ids.next(draw)
    message = {"jsonrpc": "2.0", "id": msg_id, "method": method}
    if params is not None or draw(st.booleans()):
        message["params"] = params
    data = frame(encode(message, draw(st.booleans())))
    return Step(data, method, request_id=msg_id, **kw)


def _notify(draw, method: str, params: Any, **kw) -> Step:
    message = {"jsonrpc": "2.0", "method": method, "params": params}
    return Step(frame(encode(message, draw(st.booleans()))), method, **kw)


@st.composite
def well_formed(draw, ids: _Ids, opened: list[str]) -> Step:
    """A request or notification that is valid JSON-RPC (its params need not be valid LSP)."""
    uri = draw(st.sampled_from(opened) if opened and draw(st.booleans()) else uris)
    doc = {"uri": uri}
    kind = draw(
        st.sampled_from(
            ["open", "open", "change", "change", "save", "close", "position", "position",
             "code_action", "inlay", "lens", "command", "command", "cancel", "config",
             "progress_cancel", "trace", "unknown", "unknown_notification", "initialized"]
        )
    )  # fmt: skip
    if kind == "open":
        text = draw(cuda_texts() | st.text(max_size=200))
        item = {
            "uri": uri,
            "languageId": draw(st.sampled_from(LANGUAGES)),
            "version": draw(st.integers(0, 10)),
            "text": text,
        }
        opened.append(uri)
        return _notify(draw, "textDocument/didOpen", {"textDocument": item})
    if kind == "change":
        changes = draw(
            st.lists(
                st.one_of(
                    st.builds(
                        lambda r, t: {"range": r, "text": t},
                        ranges,
                        st.sampled_from(SNIPPETS) | st.text(max_size=20),
                    ),
                    st.builds(lambda t: {"text": t}, cuda_texts() | st.text(max_size=50)),
                ),
                max_size=3,
            )
        )
        versioned = {"uri": uri, "version": draw(st.integers(0, 1000))}
        params = {"textDocument": versioned, "contentChanges": changes}
        return _notify(draw, "textDocument/didChange", params)
    if kind == "save":
        return _notify(draw, "textDocument/didSave", {"textDocument": doc})
    if kind == "close":
        return _notify(draw, "textDocument/didClose", {"textDocument": doc})
    if kind == "position":
        method = draw(st.sampled_from(POSITION_REQUESTS))
        return _request(ids, draw, method, {"textDocument": doc, "position": draw(positions)})
    if kind == "code_action":
        only = draw(st.none() | st.just(["refactor"]) | st.just(["quickfix"]))
        context = {"diagnostics": []} | ({"only": only} if only else {})
        params = {"textDocument": doc, "range": draw(ranges), "context": context}
        return _request(ids, draw, "textDocument/codeAction", params)
    if kind == "inlay":
        params = {"textDocument": doc, "range": draw(ranges)}
        return _request(ids, draw, "textDocument/inlayHint", params)
    if kind == "lens":
        return _request(ids, draw, "textDocument/codeLens", {"textDocument": doc})
    if kind == "command":
        command = draw(st.sampled_from(KNOWN_COMMANDS) | st.text(max_size=12))
        params = {"command": command}
        arguments = draw(command_arguments(uri))
        if arguments is not None or draw(st.booleans()):
            params["arguments"] = arguments
        return _request(ids, draw, "workspace/executeCommand", params)
    if kind == "cancel":
        target = draw(st.integers(0, ids.n + 2) | st.just(f"r{ids.n}") | st.text(max_size=4))
        return _notify(draw, "$/cancelRequest", {"id": target})
    if kind == "config":
        return _notify(draw, "workspace/didChangeConfiguration", {"settings": draw(json_any)})
    if kind == "progress_cancel":
        token = draw(st.text(max_size=10) | st.integers() | st.just("optiml/job/x"))
        return _notify(draw, "window/workDoneProgress/cancel", {"token": token})
    if kind == "trace":
        value = draw(st.sampled_from(["off", "messages", "verbose", "loud"]))
        return _notify(draw, "$/setTrace", {"value": value})
    if kind == "unknown":
        method = draw(st.sampled_from(["optiml/nothing", "$/unknown", "textDocument/rename", ""]))
        return _request(ids, draw, method, draw(json_any.filter(lambda v: isinstance(v, dict))))
    if kind == "unknown_notification":
        method = draw(st.sampled_from(["$/progress", "$/unknown", "optiml/nothing", "exit2"]))
        return _notify(draw, method, draw(json_any))
    return _notify(draw, "initialized", {})


@st.composite
def malformed(draw, ids: _Ids) -> Step:
    """JSON that is not a well-formed JSON-RPC message, correctly framed."""
    base = {"jsonrpc": "2.0", "id": ids.next(draw), "method": "textDocument/hover", "params": {}}
    kind = draw(
        st.sampled_from(
            ["no_jsonrpc", "old_version", "method_type", "odd_id", "params_type", "no_method",
             "array", "scalar", "empty_object", "bad_params", "response"]
        )
    )  # fmt: skip
    message: Any = dict(base)
    if kind == "no_jsonrpc":
        del message["jsonrpc"]
    elif kind == "old_version":
        message["jsonrpc"] = "1.0"
    elif kind == "method_type":
        message["method"] = draw(st.integers() | st.none() | st.lists(st.text(), max_size=2))
    elif kind == "odd_id":
        message["id"] = draw(odd_ids)
        message["method"] = draw(st.sampled_from(["shutdown", "textDocument/hover", "nothing"]))
    elif kind == "params_type":
        message["params"] = draw(st.integers() | st.text(max_size=5) | st.booleans())
    elif kind == "no_method":
        del message["method"]
    elif kind == "array":
        message = [message]
    elif kind == "scalar":
        message = draw(json_leaf)
    elif kind == "empty_object":
        message = {}
    elif kind == "response":  # to no request of the server's, or of the wrong shape
        message = {"jsonrpc": "2.0", "id": draw(odd_ids | st.integers() | st.text(max_size=5))}
        message[draw(st.sampled_from(["result", "error"]))] = draw(json_any)
    else:  # valid JSON-RPC, params of the wrong shape: a request still answered, by its id
        message["method"] = draw(
            st.sampled_from(
                ["textDocument/hover", "textDocument/codeAction", "workspace/executeCommand",
                 "textDocument/inlayHint", "initialize", "shutdown"]
            )
        )  # fmt: skip
        message["params"] = draw(json_any.filter(lambda v: isinstance(v, dict | list)))
        # shutdown takes any params (pygls reads them as None): it still shuts the server down
        effect = "shutdown" if message["method"] == "shutdown" else ""
        label = f"{message['method']} (bad params)"
        return Step(frame(encode(message)), label, message["id"], effect)
    return Step(frame(encode(message)), f"malformed: {kind}")


junk_bytes = st.binary(max_size=60).filter(lambda b: b"content-length" not in b.lower())


@st.composite
def garbage(draw) -> Step:
    """Bytes that are not a well-formed frame. None of them contains a header that reaches into
    the frame after it, so that frame must still be read and answered."""
    kind = draw(
        st.sampled_from(
            ["bad_length", "negative", "huge", "missing", "no_blank_line", "cut_short",
             "too_long", "not_utf8", "not_json", "deep", "bytes", "empty_body", "nan"]
        )
    )  # fmt: skip
    hover = b'{"jsonrpc": "2.0", "id": 0, "method": "textDocument/hover", "params": {}}'
    data = {
        "bad_length": lambda: b"Content-Length: %s\r\n\r\n" % draw(st.sampled_from([b"abc", b"1.5", b"", b"0x10", b"1 2"])) + draw(junk_bytes),
        "negative": lambda: b"Content-Length: -%d\r\n\r\n" % draw(st.integers(1, 99)) + draw(junk_bytes),
        "huge": lambda: b"Content-Length: %d\r\n\r\n" % draw(st.integers(2**26 + 1, 2**80)),
        "missing": lambda: b"Content-Type: application/vscode-jsonrpc\r\n\r\n" + hover,
        "no_blank_line": lambda: b"Content-Length: %d\r\n" % len(hover) + hover,
        "cut_short": lambda: b"Content-Length: %d\r\n\r\n" % (len(hover) + draw(st.integers(1, 500))) + hover,
        "too_long": lambda: b"Content-Length: %d\r\n\r\n" % draw(st.integers(1, len(hover) - 1)) + hover,
        "not_utf8": lambda: frame(draw(st.sampled_from([b"\xff\xfe{}", b'{"a": "\xc3\x28"}', b"\x80"]))),
        "not_json": lambda: frame(draw(st.sampled_from([b"{not json", b"", b"}", b'{"a": 1,}', b"nul"]))),
        "deep": lambda: frame(b"[" * draw(st.integers(1000, 200_000))),
        "bytes": lambda: draw(junk_bytes),
        "empty_body": lambda: b"Content-Length: 0\r\n\r\n",
        "nan": lambda: frame(b'{"jsonrpc": "2.0", "id": NaN, "method": "shutdown"}'),
    }[kind]()  # fmt: skip
    return Step(data, f"garbage: {kind}")


@st.composite
def initialize(draw, ids: _Ids) -> Step:
    params = {
        "processId": draw(st.none() | st.integers(1, 99999)),
        "rootUri": draw(st.none() | st.just("file:///fuzz")),
        "capabilities": CAPABILITIES[draw(st.sampled_from(sorted(CAPABILITIES)))],
        "initializationOptions": draw(settings_values),
    }
    return _request(ids, draw, "initialize", params, effect="initialize")


@st.composite
def sequences(draw, max_steps: int = 24) -> Sequence:
    ids = _Ids()
    opened: list[str] = []
    steps: list[Step] = []
    if draw(st.integers(0, 9)) < 8:
        steps.append(draw(initialize(ids)))
        if draw(st.booleans()):
            steps.append(_notify(draw, "initialized", {}))
    for _ in range(draw(st.integers(0, max_steps))):
        which = draw(st.integers(0, 59))
        if which < 40:
            steps.append(draw(well_formed(ids, opened)))
        elif which < 47:
            steps.append(draw(malformed(ids)))
        elif which < 56:
            steps.append(draw(garbage()))
        elif which < 59:
            steps.append(draw(initialize(ids)))
        else:
            steps.append(_request(ids, draw, "shutdown", None, effect="shutdown"))
    if draw(st.integers(0, 9)) == 0:
        steps.append(_notify(draw, "exit", None, effect="exit"))
    return Sequence(
        steps=steps,
        fresh=draw(st.integers(0, 4)) == 0,
        answers=draw(st.sampled_from(["normal", "normal", "null", "error", "garbage"])),
        settings=draw(settings_values),
    )


# ---- the client ---------------------------------------------------------------------------------

# A traceback, a frame of one, an exception's repr (`KeyError('x')`) or an object's
# (`<Future at 0x7f...>`), anywhere in what the server sends.
LEAK = re.compile(
    r"Traceback \(most recent call last\)|File \"[^\"]*\", line \d+"
    r"|\b[A-Z]\w*(?:Error|Exception)\(|<[\w.]+ (?:object )?at 0x[0-9a-f]+"
)
# What the server says when a handler raised: a bug, whatever the client sent.
INTERNAL = ("OptiML server error", "OptiML could not read this")


@dataclass
class Failure:
    kind: str  # traceback, internal error, multi-line error, hang, silent, crash, exit code, bad frame
    detail: str
    sequence: list[str] = field(default_factory=list)
    log: str = ""  # the end of the server's log

    def as_dict(self) -> dict:
        return {"kind": self.kind, "detail": self.detail, "sent": self.sequence, "log": self.log}


def judge(message: dict, raw: str) -> list[tuple[str, str]]:
    """What is wrong with one message from the server."""
    found = []
    if LEAK.search(raw):
        found.append(("traceback", raw[:500]))
    if any(marker in raw for marker in INTERNAL):
        found.append(("internal error", raw[:500]))
    error = message.get("error")
    if isinstance(error, dict):
        if error.get("code") == -32603:
            found.append(("internal error", raw[:500]))
        if "\n" in str(error.get("message", "")):
            found.append(("multi-line error", raw[:500]))
    if message.get("method") in ("window/showMessage", "window/logMessage"):
        params = message.get("params") or {}
        if params.get("type") == 1 and "\n" in str(params.get("message", "")):
            found.append(("multi-line error", raw[:500]))
    return found


class ServerProcess:
    """`python -m server` from this checkout, with a thread that reads its frames, answers its
    requests as `answers` says, and files responses by id."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        fd, self.log_path = tempfile.mkstemp(prefix="optiml-fuzz-", suffix=".log")
        environ = {**os.environ, "PYTHONFAULTHANDLER": "1", **(env or {})}
        environ["PYTHONPATH"] = os.pathsep.join(
            [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "server"],
            cwd=ROOT,
            env=environ,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=fd,
        )
        os.close(fd)
        self.answers = "normal"
        self.settings: Any = None
        self.initialized = False
        self.shut = False
        self.responses: dict[Any, tuple[float, dict]] = {}
        self.problems: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        self._arrived = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    # writing

    def write(self, data: bytes) -> bool:
        with self._lock:
            try:
                self.proc.stdin.write(data)
                self.proc.stdin.flush()
                return True
            except (BrokenPipeError, OSError, ValueError):
                return False

    def send(self, message: dict) -> bool:
        return self.write(frame(encode(message)))

    # reading

    def _read(self) -> None:
        out = self.proc.stdout
        while True:
            length = None
            while True:
                line = out.readline()
                if not line:
                    return
                if line == b"\r\n":
                    break
                name, _, value = line.decode("ascii", "replace").partition(":")
                if name.lower() == "content-length":
                    length = int(value.strip())
            if length is None:
                self.problems.append(("bad frame", "a header block without Content-Length"))
                continue
            body = out.read(length)
            try:
                raw = body.decode("utf-8")
                message = json.loads(raw)
            except ValueError as e:
                self.problems.append(("bad frame", f"{e}: {body[:200]!r}"))
                continue
            self.problems.extend(judge(message, raw))
            if "method" in message and "id" in message:
                self._answer(message)
            elif "method" not in message:
                key = _key(message.get("id"))
                with self._arrived:
                    if key in self.responses and key != "null":
                        self.problems.append(("duplicate answer", raw[:500]))
                    self.responses[key] = (time.monotonic(), message)
                    self._arrived.notify_all()

    def _answer(self, request: dict) -> None:
        method, msg_id = request["method"], request["id"]
        reply: dict[str, Any] = {"jsonrpc": "2.0", "id": msg_id}
        if self.answers == "error":
            reply["error"] = {"code": -32603, "message": "the client failed"}
        elif self.answers == "garbage":
            reply["result"] = {"applied": "yes", "success": 3, "items": 5}
        elif self.answers == "null":
            reply["result"] = None
        elif method == "workspace/configuration":
            items = (request.get("params") or {}).get("items") or []
            reply["result"] = [self.settings for _ in items]
        elif method == "workspace/applyEdit":
            reply["result"] = {"applied": True}
        elif method == "window/showDocument":
            reply["result"] = {"success": True}
        else:
            reply["result"] = None
        self.send(reply)

    def wait_for(self, ids: list[Any], timeout: float) -> list[Any]:
        """The ids among `ids` still unanswered after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        with self._arrived:
            while True:
                missing = [i for i in ids if _key(i) not in self.responses]
                left = deadline - time.monotonic()
                if not missing or left <= 0 or self.proc.poll() is not None:
                    return missing
                self._arrived.wait(min(left, 0.2))

    def request(self, msg_id: Any, method: str, params: Any, timeout: float) -> dict | None:
        self.send({"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params})
        if self.wait_for([msg_id], timeout):
            return None
        return self.responses[_key(msg_id)][1]

    def ready(self, timeout: float = 30.0) -> bool:
        """Whether it answers (a request before `initialize`, refused) within `timeout` seconds:
        its start-up is not counted in the sequence's answer times."""
        answer = self.request("ready", "optiml/ready", None, timeout)
        self.responses.clear()
        return answer is not None

    def tail(self, lines: int = 40) -> str:
        try:
            text = Path(self.log_path).read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def dump(self) -> None:
        """Its threads' stacks into its log (Python's faulthandler, on SIGABRT), then killed: what
        a hung server was doing."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGABRT)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def log_text(self) -> str:
        try:
            return Path(self.log_path).read_text(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        """Shut down politely if it still answers, else kill it."""
        if self.proc.poll() is None:
            if not self.shut and self.initialized:
                self.request("fuzz-stop", "shutdown", None, timeout=5)
            self.send({"jsonrpc": "2.0", "method": "exit"})
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(timeout=5)
        for stream in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                stream.close()


_EXCEPTION_LINE = re.compile(r"^[ |+-]*((?:[A-Za-z_]\w*\.)*([A-Z]\w*))(?::|$)")


def logged_exceptions(log: str) -> list[str]:
    """The type of each exception whose traceback is in `log` (an exception group's: its own,
    not those of the exceptions it groups)."""
    found, lines = [], log.splitlines()
    for i, line in enumerate(lines):
        if line.endswith("Traceback (most recent call last):") and "|" not in line:
            for later in lines[i + 1 :]:
                if (m := _EXCEPTION_LINE.match(later)) and "File " not in later:
                    found.append(m.group(2))
                    break
    return found


def _key(msg_id: Any) -> str:
    return json.dumps(msg_id)


PROBE = TEXTS["saxpy.cu"]
PROBE_KERNEL = next(
    (i, line.index("saxpy")) for i, line in enumerate(PROBE.split("\n")) if "void saxpy" in line
)


@dataclass
class Outcome:
    messages: int = 0  # frames and pieces sent, the probe's included
    answered: int = 0
    slowest_ms: float = 0.0
    slowest: str = ""
    exited: bool = False
    failures: list[Failure] = field(default_factory=list)


class Fuzzer:
    """Runs sequences on one server process at a time: a new one for a sequence that asks for a
    fresh server, after `exit` or a failure, and every `reuse` sequences."""

    def __init__(self, env: dict[str, str] | None = None, reuse: int = 8) -> None:
        self.env = env
        self.reuse = reuse
        self.server: ServerProcess | None = None
        self.runs_on_server = 0
        self.probes = 0
        self.restarts = 0
        # the exceptions whose tracebacks the servers logged (stderr), where they belong
        self.tracebacks_logged: collections.Counter[str] = collections.Counter()

    def close(self) -> None:
        if self.server is not None:
            self._retire()

    def _retire(self) -> None:
        assert self.server is not None
        self.server.stop()
        for kind in logged_exceptions(self.server.log_text()):
            self.tracebacks_logged[kind] += 1
        Path(self.server.log_path).unlink(missing_ok=True)
        self.server = None

    def _fresh(self) -> ServerProcess:
        if self.server is not None:
            self._retire()
        self.server = ServerProcess(self.env)
        self.runs_on_server = 0
        self.restarts += 1
        return self.server

    def run(self, sequence: Sequence) -> Outcome:
        need_new = (
            self.server is None
            or sequence.fresh
            or self.runs_on_server >= self.reuse
            or self.server.proc.poll() is not None
        )
        server = self._fresh() if need_new else self.server
        assert server is not None
        self.runs_on_server += 1
        server.answers, server.settings = sequence.answers, sequence.settings
        out = Outcome()
        labels = sequence.describe()

        def fail(kind: str, detail: str) -> None:
            if kind in ("hang", "silent"):
                server.dump()
            out.failures.append(Failure(kind, detail, labels, server.tail(120)))

        if need_new and not server.ready():
            fail("silent", "a new server did not answer within 30 s")
            self._retire()
            return out
        sent: dict[str, tuple[float, str]] = {}
        pending: list[Any] = []
        exit_code = None
        for step in sequence.steps:
            if step.effect == "initialize" and not server.initialized and not server.shut:
                server.initialized = True
            if step.effect == "shutdown" and server.initialized and not server.shut:
                server.shut = True
            if step.effect == "exit":
                exit_code = 0 if server.shut else 1
            if step.request_id is not None:
                sent[_key(step.request_id)] = (time.monotonic(), step.label)
                pending.append(step.request_id)
            out.messages += 1
            if not server.write(step.data):
                break
        if exit_code is not None:
            self._expect_exit(server, exit_code, fail)
            out.exited = True
        else:
            missing = server.wait_for(pending, ANSWER_TIMEOUT)
            if server.proc.poll() is not None:
                fail("crash", f"the server exited with {server.proc.returncode} unasked")
            elif missing:
                unanswered = ", ".join(f"{sent[_key(i)][1]} #{i!r}" for i in missing)
                fail("hang", f"no answer within {ANSWER_TIMEOUT} s to {unanswered}")
            else:
                self._probe(server, out, fail)
        for msg_id, (started, label) in sent.items():
            answer = server.responses.get(msg_id)
            if answer is not None:
                out.answered += 1
                ms = (answer[0] - started) * 1e3
                if ms > out.slowest_ms:
                    out.slowest_ms, out.slowest = ms, label
        retire = out.failures or out.exited or server.shut or server.proc.poll() is not None
        if retire:
            server.stop()  # and read what it wrote to the end
        for kind, detail in server.problems:
            fail(kind, detail)
        server.problems.clear()
        server.responses.clear()
        if retire:
            self._retire()
        return out

    def _expect_exit(self, server: ServerProcess, code: int, fail) -> None:
        try:
            got = server.proc.wait(timeout=EXIT_TIMEOUT)
        except subprocess.TimeoutExpired:
            fail("hang", f"exit did not end the server within {EXIT_TIMEOUT} s")
            return
        if got != code:
            fail("exit code", f"exit ended the server with {got}, not {code}")

    def _probe(self, server: ServerProcess, out: Outcome, fail) -> None:
        """A well-formed request must still be answered: after `shutdown` with InvalidRequest
        (then `exit` ends it with 0), else a hover on a newly opened document."""
        self.probes += 1
        tag = f"probe-{self.probes}"
        if server.shut:
            hover = {
                "textDocument": {"uri": "file:///fuzz/a.cu"},
                "position": {"line": 0, "character": 0},
            }
            answer = server.request(tag, "textDocument/hover", hover, PROBE_TIMEOUT)
            out.messages += 2
            if answer is None:
                fail("silent", "no answer to a request after shutdown")
            elif (answer.get("error") or {}).get("code") != -32600:
                fail("silent", f"a request after shutdown got {answer}")
            server.send({"jsonrpc": "2.0", "method": "exit"})
            self._expect_exit(server, 0, fail)
            return
        if not server.initialized:
            caps = {"processId": None, "rootUri": None, "capabilities": {}}
            answer = server.request(f"{tag}-init", "initialize", caps, PROBE_TIMEOUT)
            out.messages += 2
            if answer is None or "result" not in answer:
                fail("silent", f"initialize after the sequence got {answer}")
                return
            server.initialized = True
            server.send({"jsonrpc": "2.0", "method": "initialized", "params": {}})
        uri = f"file:///fuzz/{tag}.cu"
        item = {"uri": uri, "languageId": "cuda", "version": 1, "text": PROBE}
        server.send(
            {"jsonrpc": "2.0", "method": "textDocument/didOpen", "params": {"textDocument": item}}
        )
        line, character = PROBE_KERNEL
        params = {"textDocument": {"uri": uri}, "position": {"line": line, "character": character}}
        started = time.monotonic()
        answer = server.request(tag, "textDocument/hover", params, PROBE_TIMEOUT)
        out.messages += 3
        if answer is None:
            fail("silent", f"no answer to a hover within {PROBE_TIMEOUT} s after the sequence")
        elif "saxpy" not in json.dumps(answer.get("result")):
            fail("silent", f"the hover after the sequence got {json.dumps(answer)[:300]}")
        else:
            ms = (time.monotonic() - started) * 1e3
            if ms > out.slowest_ms:
                out.slowest_ms, out.slowest = ms, "textDocument/hover (probe)"
        server.send(
            {
                "jsonrpc": "2.0",
                "method": "textDocument/didClose",
                "params": {"textDocument": {"uri": uri}},
            }
        )
