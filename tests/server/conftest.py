"""The language server's client fixture: one server per test, with the client capabilities of
VS Code and of Neovim in turn."""

from __future__ import annotations

import pytest_lsp

from tests.server.helpers import CLIENTS, CONFIG, EditorClient, start


@pytest_lsp.fixture(params=CLIENTS, config=CONFIG)
async def client(request, lsp_client: EditorClient):
    await start(lsp_client, request.param)
    yield
    await lsp_client.shutdown_session()
