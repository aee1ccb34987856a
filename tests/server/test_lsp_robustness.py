"""Nothing a client or the machine does kills the server: malformed requests get error responses,
garbage on the wire is skipped, a missing nvcc is told once while spec diagnostics go on, and an
internal error is shown, once."""

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
    client cannot: params of the wrong shape, and bytes that are not JSON."""

    def __init__(self, proc: asyncio.subprocess.Process):
        self.proc = proc
        self.notifications: list[dict] = []

    def send(self, body: bytes) -> None:
        self.proc.stdin.write(b"Content-Length: %d\r\n\r\n%s" % (len(body), body))

    def notify(self, method: str, params: object) -> None:
        self.send(json.dumps({"jsonrpc": "2.0", "method": method, "params": params}).encode())

    async def request(self, id_: int, method: str, params: object) -> dict:
        self.send(
            json.dumps({"jsonrpc": "2.0", "id": id_, "method": method, "params": params}).encode()
        )
        while True:
            message = await asyncio.wait_for(self._read(), timeout=10)
            if message.get("id") == id_ and "method" not in message:
                return message
            self.notifications.append(message)

    async def _read(self) -> dict:
        length = 0
        while (line := await self.proc.stdout.readline()) not in (b"\r\n", b""):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        return json.loads(await self.proc.stdout.readexactly(length))


async def test_malformed_requests_get_errors_and_the_server_keeps_answering():
    proc = await asyncio.create_subprocess_exec(
        *SERVER, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
    )
    rpc = RawClient(proc)
    init = await rpc.request(
        1, "initialize", {"processId": None, "rootUri": None, "capabilities": {}}
    )
    assert init["result"]["serverInfo"]["name"] == "optiml"
    rpc.notify("initialized", {})

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


def test_an_internal_error_is_shown_once():
    server = make_server()
    shown: list[types.ShowMessageParams] = []
    server.window_show_message = shown.append
    for _ in range(3):
        server.report_server_error(RuntimeError("boom"), JsonRpcException)
    assert [m.message for m in shown] == [
        "OptiML server error (RuntimeError): boom; see the server log"
    ]
