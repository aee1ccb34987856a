"""Settings from `initializationOptions`, `workspace/configuration` and `didChangeConfiguration`:
a good `arch` recompiles with it, a bad value is told in one line and the previous value kept."""

from __future__ import annotations

import pytest_lsp
from lsprotocol import types
from pytest_lsp import client_capabilities

from tests.server.helpers import (
    CONFIG,
    EditorClient,
    eventually,
    fixture_text,
    hover_at,
    open_document,
    start,
)
from tests.support import FIXTURES

SAXPY = fixture_text("saxpy.cu")


@pytest_lsp.fixture(config=CONFIG)
async def sm80(lsp_client: EditorClient):
    await start(lsp_client, "neovim", options={"arch": "sm_80"})
    yield
    await lsp_client.shutdown_session()


def changed_configuration(client: EditorClient, settings: object = None) -> None:
    client.workspace_did_change_configuration(types.DidChangeConfigurationParams(settings=settings))


async def hover_mentions(client: EditorClient, uri: str, needle: str) -> str:
    return await eventually(
        lambda: _if_contains(hover_at(client, uri, 12, 18), needle), what=f"a hover with {needle}"
    )


async def _if_contains(pending, needle: str) -> str | None:
    text = await pending
    return text if needle in text else None


async def test_a_bad_arch_is_told_and_the_previous_one_kept(sm80: EditorClient):
    uri = open_document(sm80, FIXTURES / "saxpy.cu", SAXPY)
    await hover_mentions(sm80, uri, "ptxas, sm_80")

    sm80.set_configuration({"arch": "sm_91"}, section="optiml")
    changed_configuration(sm80)
    (message,) = await eventually(lambda: sm80.messages, what="a showMessage")
    assert message.type == types.MessageType.Error
    assert message.message == (
        "OptiML setting `arch`: must be one of sm_70, sm_75, sm_80, sm_86, sm_87, sm_88, sm_89, "
        "sm_90, sm_100, sm_103, sm_110, sm_120, sm_121 (or with an `a` or `f` suffix), "
        "got 'sm_91'; keeping 'sm_80'"
    )
    assert "ptxas, sm_80" in await hover_at(sm80, uri, 12, 18)


async def test_a_good_arch_recompiles_open_documents(sm80: EditorClient):
    uri = open_document(sm80, FIXTURES / "saxpy.cu", SAXPY)
    await hover_mentions(sm80, uri, "ptxas, sm_80")
    sm80.set_configuration({"arch": "sm_86", "provider": "offline"}, section="optiml")
    changed_configuration(sm80)
    await hover_mentions(sm80, uri, "ptxas, sm_86")
    assert sm80.messages == []


@pytest_lsp.fixture(config=CONFIG)
async def misconfigured(lsp_client: EditorClient):
    await start(lsp_client, "visual-studio-code", options={"budget": -1, "colour": "red"})
    yield
    await lsp_client.shutdown_session()


async def test_bad_initialization_options_are_told_once_initialized(misconfigured: EditorClient):
    messages = await eventually(lambda: len(misconfigured.messages) == 2 and misconfigured.messages)
    assert [m.message for m in messages] == [
        "OptiML setting `budget`: input should be greater than 0, got -1; keeping None",
        "OptiML setting `colour` is unknown (known: arch, provider, model, baseUrl, budget, evaluations, seconds, policy, executor, gpus, include, define, std, nvccFlags, compileCommands); ignored",
    ]
    uri = open_document(misconfigured, FIXTURES / "saxpy.cu", SAXPY)
    assert "saxpy" in await hover_at(misconfigured, uri, 12, 18)


@pytest_lsp.fixture(config=CONFIG)
async def pushed(lsp_client: EditorClient):
    """A client that cannot answer `workspace/configuration` and pushes settings instead."""
    caps = client_capabilities("neovim")
    caps.workspace.configuration = False
    await lsp_client.initialize_session(types.InitializeParams(capabilities=caps))
    yield
    await lsp_client.shutdown_session()


async def test_settings_pushed_with_did_change_configuration(pushed: EditorClient):
    changed_configuration(pushed, {"optiml": {"executor": "ftp://gpubox"}})
    (message,) = await eventually(lambda: pushed.messages, what="a showMessage")
    assert message.message == (
        "OptiML setting `executor`: must be `local`, `ssh://[user@]host[:port]`, `ray` or "
        "`ray://host:port`, or several of them separated by commas, got 'ftp://gpubox'; "
        "keeping 'local'"
    )
