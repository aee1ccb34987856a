"""Nothing a client or the machine does kills the server: malformed requests get error responses,
garbage on the wire is skipped or answered and the next frame is read, unknown methods and
documents get quiet answers, a missing nvcc is told once while spec diagnostics go on, and an
unexpected exception reaches the client in one line (shown once), its traceback only the log."""

from __future__ import annotations

import asyncio
import json
import os

import pytest
import pytest_lsp
from lsprotocol import types
from pygls.exceptions import JsonRpcException, JsonRpcInvalidParams, JsonRpcMethodNotFound
from pytest_lsp import ClientServerConfig, LanguageClient

from server.app import make_server
from tests.server.helpers import (
    SERVER,
    EditorClient,
    diagnostics,
    eventually,
    fixture_text,
    hover_at,
    open_document,
    save,
    start,
)

SAXPY = fixture_text("saxpy.cu")


class RawClient:
    """JSON-RPC over the server's stdio with nothing checked on the way out, to send what a typed
    client cannot: params of the wrong shape, and bytes that are not JSON or not a frame."""

    def __init__(self, proc: asyncio.subprocess.Process):
        self.proc = proc
        self.notifications: list[dict] = []  # and responses to no request of ours

    @classmethod
    async def start(cls, initialize: bool = True) -> RawClient:
        proc = await asyncio.create_subprocess_exec(
            *SERVER, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
        )
        rpc = cls(proc)
        if initialize:
            init = await rpc.request(
                1, "initialize", {"processId": None, "rootUri": None, "capabilities": {}}
            )
            assert init["result"]["serverInfo"]["name"] == "optiml"
            rpc.notify("initialized", {})
        return rpc

    def write(self, data: bytes) -> None:
        self.proc.stdin.write(data)

    def send(self, body: bytes) -> None:
        self.write(b"Content-Length: %d\r\n\r\n%s" % (len(body), body))

    def notify(self, method: str, params: object) -> None:
        self.send(json.dumps({"jsonrpc": "2.0", "method": method, "params": params}).encode())

    async def request(self, id_: int | str, method: str, params: object) -> dict:
        self.send(
            json.dumps({"jsonrpc": "2.0", "id": id_, "method": method, "params": params}).encode()
        )
        while True:
            message = await asyncio.wait_for(self._read(), timeout=10)
            if message.get("id") == id_ and "method" not in message:
                return message
            self.notifications.append(message)

    async def ends(self) -> int:
        """`shutdown`, `exit`: the exit code."""
        assert "error" not in await self.request("end", "shutdown", None)
        self.notify("exit", None)
        return await asyncio.wait_for(self.proc.wait(), timeout=10)

    def shown(self) -> list[str]:
        """What the server asked the editor to show (window/showMessage)."""
        return [
            m["params"]["message"]
            for m in self.notifications
            if m.get("method") == "window/showMessage"
        ]

    async def _read(self) -> dict:
        length = 0
        while (line := await self.proc.stdout.readline()) not in (b"\r\n", b""):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        return json.loads(await self.proc.stdout.readexactly(length))


async def test_malformed_requests_get_errors_and_the_server_keeps_answering():
    rpc = await RawClient.start()
    proc = rpc.proc

    bad = await rpc.request(2, "textDocument/hover", {"textDocument": 5})
    assert bad["error"]["code"] == JsonRpcInvalidParams.CODE
    assert "textDocument/hover" in bad["error"]["message"]
    unknown = await rpc.request(3, "optiml/noSuchMethod", {})
    assert unknown["error"]["code"] == JsonRpcMethodNotFound.CODE
    rpc.send(b"{not json")
    hover = {"textDocument": {"uri": "file:///nowhere.cu"}, "position": {"line": 0, "character": 0}}
    assert await rpc.request(4, "textDocument/hover", hover) == {
        "jsonrpc": "2.0",
        "id": 4,
        "result": None,
    }

    assert "error" not in await rpc.request(5, "shutdown", None)
    rpc.notify("exit", None)
    assert await asyncio.wait_for(proc.wait(), timeout=10) == 0


HOVER = {"textDocument": {"uri": "file:///nowhere.cu"}, "position": {"line": 0, "character": 0}}
SHUTDOWN = b'{"jsonrpc": "2.0", "id": 99, "method": "shutdown"}'
PARSE_ERROR, INVALID_REQUEST = -32700, -32600


def framed(body: bytes) -> bytes:
    return b"Content-Length: %d\r\n\r\n%s" % (len(body), body)


@pytest.mark.parametrize(
    ("sent", "answer"),
    [
        (b"Content-Length: abc\r\n\r\n{}", None),
        (b"Content-Length: -5\r\n\r\n{}", None),
        (b"Content-Length: 99999999999999\r\n\r\n{}", None),  # not waited for
        (b"Content-Type: application/vscode-jsonrpc\r\n\r\n" + SHUTDOWN, None),  # no length
        (b"Content-Length: %d\r\n" % len(SHUTDOWN) + SHUTDOWN, None),  # no blank line
        (b"Content-Length: 500\r\n\r\n" + SHUTDOWN, PARSE_ERROR),  # cut short by the next
        (b"Content-Length: 60\r\n\r\n" + SHUTDOWN, PARSE_ERROR),  # ends in the next header
        (b"Content-Length: 20\r\n\r\n" + SHUTDOWN, PARSE_ERROR),  # longer than it says
        (framed(b"\xff\xfe{}"), PARSE_ERROR),  # not UTF-8
        (framed(b"{not json"), PARSE_ERROR),
        (framed(b"[" * 100000), PARSE_ERROR),  # too deep for the parser
        (framed(b"[]"), INVALID_REQUEST),
        (framed(b'"hi!"'), INVALID_REQUEST),
        (framed(b'{"jsonrpc": "2.0", "method": 1}'), INVALID_REQUEST),
        (framed(b'{"jsonrpc": "2.0", "id": 1.5, "method": "x"}'), INVALID_REQUEST),
        (framed(b'{"jsonrpc": "2.0", "id": [1], "result": 1}'), None),  # a response: never answered
        (framed(b'{"jsonrpc": "2.0", "id": 12345, "error": "no"}'), None),
        (b"\x00\x01garbage\r\n\r\n", None),
    ],
)
async def test_after_any_bad_frame_the_next_one_is_answered(sent: bytes, answer: int | None):
    rpc = await RawClient.start()
    rpc.write(sent)
    assert await rpc.request(2, "textDocument/hover", HOVER) == {
        "jsonrpc": "2.0",
        "id": 2,
        "result": None,
    }
    if answer is None:
        assert rpc.notifications == []
    else:
        (error,) = rpc.notifications
        assert error["id"] is None and error["error"]["code"] == answer
        assert "\n" not in error["error"]["message"]
    assert await rpc.ends() == 0


async def test_unknown_methods_and_unopened_documents_get_quiet_answers(tmp_path):
    rpc = await RawClient.start()
    unknown = await rpc.request(2, "optiml/noSuchMethod", {})
    assert unknown["error"] == {"code": -32601, "message": "no method optiml/noSuchMethod"}
    for method in ("$/unknownNotification", "optiml/noSuchNotification", "$/progress"):
        rpc.notify(method, {"token": 1, "value": {}})
    never = {"uri": (tmp_path / "never.cu").as_uri()}
    change = {"range": {"start": {"line": 0, "character": 0}, "end": {"line": 0, "character": 0}}}
    rpc.notify("textDocument/didChange", {"textDocument": {**never, "version": 2},
                                          "contentChanges": [{**change, "text": "x"}]})  # fmt: skip
    rpc.notify("textDocument/didSave", {"textDocument": never})
    rpc.notify("textDocument/didClose", {"textDocument": never})
    where = {"textDocument": never, "position": {"line": 5, "character": 3}}
    span = {"start": {"line": 0, "character": 0}, "end": {"line": 99, "character": 0}}
    for method, params, result in [
        ("textDocument/hover", where, None),
        (
            "textDocument/codeAction",
            {"textDocument": never, "range": span, "context": {"diagnostics": []}},
            None,
        ),  # fmt: skip
        ("textDocument/inlayHint", {"textDocument": never, "range": span}, []),
        ("textDocument/codeLens", {"textDocument": never}, None),
    ]:
        assert (await rpc.request(method, method, params))["result"] == result, method

    # positions past the end of an open document: answered, not errors
    uri = (tmp_path / "saxpy.cu").as_uri()
    item = {"uri": uri, "languageId": "cuda", "version": 1, "text": SAXPY}
    rpc.notify("textDocument/didOpen", {"textDocument": item})
    far = {"line": 2**31 - 1, "character": 2**31 - 1}
    for method, params in [
        ("textDocument/hover", {"textDocument": {"uri": uri}, "position": far}),
        (
            "textDocument/inlayHint",
            {"textDocument": {"uri": uri}, "range": {"start": far, "end": far}},
        ),
    ]:
        assert "result" in await rpc.request(f"far-{method}", method, params), method
    rpc.notify("textDocument/didChange", {"textDocument": {"uri": uri, "version": 2},
               "contentChanges": [{"range": {"start": far, "end": far}, "text": "// end\n"}]})  # fmt: skip
    assert "saxpy" in json.dumps(
        await rpc.request(
            3,
            "textDocument/hover",
            {"textDocument": {"uri": uri}, "position": {"line": 12, "character": 18}},
        )  # fmt: skip
    )
    assert [m for m in rpc.notifications if m.get("method") == "window/showMessage"] == []
    assert await rpc.ends() == 0


async def test_the_lifecycle_is_kept_whatever_comes_when():
    rpc = await RawClient.start(initialize=False)
    early = await rpc.request(1, "textDocument/hover", HOVER)
    assert early["error"] == {"code": -32002, "message": "textDocument/hover before initialize"}
    rpc.notify("textDocument/didOpen", {"textDocument": {"uri": "file:///a.cu"}})  # dropped
    init = {"processId": None, "rootUri": None, "capabilities": {}}
    assert "result" in await rpc.request(2, "initialize", init)
    again = await rpc.request(3, "initialize", init)
    assert again["error"] == {"code": -32600, "message": "initialize was already sent"}
    assert (await rpc.request(4, "textDocument/hover", HOVER))["result"] is None
    assert await rpc.request(5, "shutdown", None) == {"jsonrpc": "2.0", "id": 5, "result": None}
    late = await rpc.request(6, "textDocument/hover", HOVER)
    assert late["error"]["code"] == -32600
    assert (
        late["error"]["message"] == "textDocument/hover after shutdown: only exit is accepted now"
    )
    rpc.notify("exit", None)
    assert await asyncio.wait_for(rpc.proc.wait(), timeout=10) == 0

    unasked = await RawClient.start()  # exit without shutdown: 1
    unasked.notify("exit", None)
    assert await asyncio.wait_for(unasked.proc.wait(), timeout=10) == 1


async def test_a_document_closed_as_soon_as_opened_is_forgotten_quietly(tmp_path):
    rpc = await RawClient.start()
    uri = (tmp_path / "gone.cu").as_uri()  # no such file: nothing may read it from disk
    item = {"uri": uri, "languageId": "cuda", "version": 1, "text": SAXPY}
    opened = {"jsonrpc": "2.0", "method": "textDocument/didOpen", "params": {"textDocument": item}}
    closed = {"jsonrpc": "2.0", "method": "textDocument/didClose",
              "params": {"textDocument": {"uri": uri}}}  # fmt: skip
    rpc.write(b"".join(framed(json.dumps(m).encode()) for m in (opened, closed)))  # one read
    where = {"textDocument": {"uri": uri}, "position": {"line": 12, "character": 18}}
    assert (await rpc.request(2, "textDocument/hover", where))["result"] is None
    assert rpc.shown() == []
    assert await rpc.ends() == 0


async def test_a_client_that_fails_the_servers_requests_gets_no_pop_up():
    rpc = await RawClient.start(initialize=False)
    caps = {"workspace": {"configuration": True}}
    init = {"processId": None, "rootUri": None, "capabilities": caps}
    assert "result" in await rpc.request(1, "initialize", init)
    rpc.notify("initialized", {})
    while not any(m.get("method") == "workspace/configuration" for m in rpc.notifications):
        rpc.notifications.append(await asyncio.wait_for(rpc._read(), timeout=10))
    (asked,) = [m for m in rpc.notifications if m.get("method") == "workspace/configuration"]
    failed = {"jsonrpc": "2.0", "id": asked["id"], "error": {"code": -32603, "message": "no"}}
    rpc.send(json.dumps(failed).encode())
    assert (await rpc.request(2, "textDocument/hover", HOVER))["result"] is None
    assert rpc.shown() == []
    assert await rpc.ends() == 0


async def test_exit_amid_work_ends_the_server_at_once_and_quietly(tmp_path):
    """`exit` without shutdown while a compile and a command run: the server is gone within the
    grace it gives them, with 1, and nothing it still tried to say (stdout is closed) is
    reported as a server error."""
    proc = await asyncio.create_subprocess_exec(
        *SERVER,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    rpc = RawClient(proc)
    caps = {"window": {"workDoneProgress": True}}
    init = {"processId": None, "rootUri": None, "capabilities": caps}
    assert "result" in await rpc.request(1, "initialize", init)
    uri = (tmp_path / "saxpy.cu").as_uri()
    item = {"uri": uri, "languageId": "cuda", "version": 1, "text": SAXPY}
    rpc.notify("textDocument/didOpen", {"textDocument": item})
    rpc.send(json.dumps({"jsonrpc": "2.0", "id": 2, "method": "workspace/executeCommand",
             "params": {"command": "optiml.addSpec", "arguments": [uri, 1, "saxpy"]}}).encode())  # fmt: skip
    rpc.notify("exit", None)
    assert await asyncio.wait_for(proc.wait(), timeout=8) == 1
    log = (await proc.stderr.read()).decode()
    assert "server error" not in log and "closed file" not in log, log
    assert "CancelledError" not in log, log


@pytest.mark.parametrize(
    ("command", "arguments", "message"),
    [
        ("optiml.optimize", None, "optiml.optimize takes [{uri, version, kernel}], got []"),
        ("optiml.generate", [{"uri": "file:///k.cu", "version": 1, "line": -1}],
         'optiml.generate takes [{uri, version, line}], got [{"uri": "file:///k.cu", "version": 1, "line": -1}]'),
        ("optiml.generate", [{"uri": "file:///nowhere.cu", "version": 1, "line": 0}],
         "optiml.generate: file:///nowhere.cu is not open (or not a CUDA file)"),
        ("optiml.profile", [{"uri": 5, "version": 1, "kernel": "k"}],
         'optiml.profile takes [{uri, version, kernel}], got [{"uri": 5, "version": 1, "kernel": "k"}]'),
        ("optiml.optimize", [{"uri": "file:///nowhere.cu", "version": 1, "kernel": "saxpy"}],
         "optiml.optimize: file:///nowhere.cu is not open (or not a CUDA file)"),
        ("optiml.addSpec", [], "optiml.addSpec takes [uri, version, kernel], got []"),
        ("optiml.addSpec", ["file:///nowhere.cu", 1, "saxpy"],
         "optiml.addSpec: file:///nowhere.cu is not open (or not a CUDA file)"),
        ("optiml.acceptProposal", [[1, 2]], "optiml.acceptProposal takes [{proposal}], got [[1, 2]]"),
        ("optiml.cancelJob", [{"job": 7}], 'optiml.cancelJob takes [{job}] or nothing, got [{"job": 7}]'),
        ("optiml.rejectProposal", "p1", "the arguments of optiml.rejectProposal must be an array"),
        ("optiml.compareProposal", ["x" * 500], None),  # long: cut to one short line
        ("optiml.nothing", [], "no command 'optiml.nothing'; the commands are optiml.acceptProposal, "
         "optiml.addSpec, optiml.cancelJob, optiml.compareProposal, optiml.generate, optiml.openReport, "
         "optiml.optimize, optiml.profile, optiml.rejectProposal"),
    ],
)  # fmt: skip
async def test_a_command_with_bad_arguments_says_what_it_takes(command, arguments, message):
    rpc = await RawClient.start()
    params = {"command": command} | ({"arguments": arguments} if arguments is not None else {})
    error = (await rpc.request(2, "workspace/executeCommand", params))["error"]
    assert error["code"] == JsonRpcInvalidParams.CODE
    assert "\n" not in error["message"] and len(error["message"]) <= 300
    if message is not None:
        assert error["message"] == message
    assert rpc.shown() == []
    assert await rpc.ends() == 0


async def test_a_command_with_bad_arguments_gets_an_error(client: LanguageClient, tmp_path):
    uri = open_document(client, tmp_path / "saxpy.cu", SAXPY)
    with pytest.raises(JsonRpcException) as bad_args:
        await client.workspace_execute_command_async(
            types.ExecuteCommandParams(command="optiml.addSpec", arguments=[uri, "one", "saxpy"])
        )
    assert bad_args.value.code == JsonRpcInvalidParams.CODE
    assert "saxpy" in await hover_at(client, uri, 12, 18)


@pytest_lsp.fixture(
    config=ClientServerConfig(
        server_command=SERVER,
        client_factory=EditorClient,
        server_env={**os.environ, "OPTIML_NVCC": "/nonexistent/nvcc"},
    )
)
async def no_nvcc(lsp_client: EditorClient):
    await start(lsp_client, "neovim")
    yield
    await lsp_client.shutdown_session()


async def test_without_nvcc_specs_are_still_checked_and_it_is_told_once(
    no_nvcc: EditorClient, tmp_path
):
    text = SAXPY.replace("y: inout", "y: inoot")
    uri = open_document(no_nvcc, tmp_path / "saxpy.cu", text)
    (message,) = await eventually(lambda: no_nvcc.messages, what="a showMessage")
    assert message.type == types.MessageType.Warning
    assert message.message == "OptiML: nvcc not found: OPTIML_NVCC=/nonexistent/nvcc is not a file"
    (spec_error,) = diagnostics(no_nvcc, uri, "optiml")
    assert spec_error.message.startswith("unknown role `inoot`")
    assert "Not compiled: nvcc not found" in await hover_at(no_nvcc, uri, 12, 18)

    save(no_nvcc, uri)
    await eventually(
        lambda: sum(1 for r in no_nvcc.progress_reports.values() if len(r) == 2) == 2,
        what="the second compile's end",
    )
    assert len(no_nvcc.messages) == 1


class Captured:
    """A writer for the server that keeps what it sends."""

    def __init__(self) -> None:
        self.data = b""

    def write(self, data: bytes) -> None:
        self.data += data

    def close(self) -> None:
        pass

    def messages(self) -> list[dict]:
        out, rest = [], self.data
        while rest:
            header, _, rest = rest.partition(b"\r\n\r\n")
            length = int(header.split(b"\r\n")[0].split(b":")[1])
            out.append(json.loads(rest[:length]))
            rest = rest[length:]
        return out


def test_an_unexpected_exception_is_one_line_to_the_client_and_a_traceback_in_the_log(caplog):
    server = make_server()
    sent = Captured()
    server.protocol.set_writer(sent)

    def boom(ls, params):
        raise RuntimeError("first line\nsecond line")

    server.feature("optiml/boom")(boom)
    server.feature("optiml/boomed")(boom)
    init = {"processId": None, "rootUri": None, "capabilities": {}}
    server.protocol.receive({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": init})
    for _ in range(2):
        server.protocol.receive({"jsonrpc": "2.0", "id": 2, "method": "optiml/boom", "params": {}})
        server.protocol.receive({"jsonrpc": "2.0", "method": "optiml/boomed", "params": {}})

    one_line = "OptiML server error (RuntimeError): first line; see the server log"
    _, answer, shown, again = sent.messages()
    assert answer == {"jsonrpc": "2.0", "id": 2, "error": {"code": -32603, "message": one_line}}
    assert again == answer
    assert shown == {
        "jsonrpc": "2.0",
        "method": "window/showMessage",
        "params": {"type": 1, "message": one_line},  # once: the second is only logged
    }
    assert "Traceback" not in sent.data.decode() and "second line" not in sent.data.decode()
    assert "Traceback (most recent call last)" in caplog.text and "in boom" in caplog.text


def test_a_spec_parser_crash_is_one_line_in_the_diagnostics(monkeypatch):
    from pygls.workspace.position_codec import PositionCodec

    from optiml import outline
    from server import documents

    def crash(*args):
        raise ValueError("first line\nsecond line")

    monkeypatch.setattr(outline._SPECS, "parse", crash)
    model = documents.parse(documents.Snapshot("file:///x.cu", 1, SAXPY), PositionCodec())
    (issue,) = (i.message for i in model.spec_issues)
    assert issue == ("OptiML could not read this spec (ValueError: first line); see the server log")


def test_an_internal_error_is_shown_once():
    server = make_server()
    shown: list[types.ShowMessageParams] = []
    server.window_show_message = shown.append
    for _ in range(3):
        server.report_server_error(RuntimeError("boom"), JsonRpcException)
    assert [m.message for m in shown] == [
        "OptiML server error (RuntimeError): boom; see the server log"
    ]
