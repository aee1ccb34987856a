"""What the language server's tests share: the server as a subprocess (`python -m server`), a
pytest-lsp client that answers like an editor, and helpers to open, edit, save and wait."""

from __future__ import annotations

import asyncio
import inspect
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Union

from lsprotocol import types
from pygls.protocol import default_converter
from pytest_lsp import ClientServerConfig, LanguageClient, client_capabilities
from pytest_lsp.client import register_lsp_features

from tests.support import FIXTURES

SERVER = [sys.executable, "-m", "server"]
CLIENTS = ["visual-studio-code", "neovim"]


def _converter():
    """pygls's converter, reading a CodeAction that carries a command as a CodeAction (lsprotocol
    reads any object with a `command` as a Command)."""
    converter = default_converter()

    def code_action(obj: Any, _: type) -> types.Command | types.CodeAction:
        kind = types.Command if isinstance(obj.get("command"), str) else types.CodeAction
        return converter.structure(obj, kind)

    converter.register_structure_hook(Union[types.Command, types.CodeAction], code_action)  # noqa: UP007
    return converter


class EditorClient(LanguageClient):
    """pytest-lsp's client, also answering the server's inlay hint and code lens refreshes and
    its `workspace/applyEdit` (recorded, and answered with `apply_edits`) as an editor does."""

    def __init__(self) -> None:
        super().__init__(converter_factory=_converter)
        register_lsp_features(self)
        self.inlay_hint_refreshes = 0
        self.code_lens_refreshes = 0
        self.preset = ""  # the client whose capabilities it has
        self.applied: list[types.ApplyWorkspaceEditParams] = []
        self.apply_edits = True

        def refresh(params: None) -> None:
            self.inlay_hint_refreshes += 1

        def refresh_lenses(params: None) -> None:
            self.code_lens_refreshes += 1

        def apply_edit(params: types.ApplyWorkspaceEditParams) -> types.ApplyWorkspaceEditResult:
            self.applied.append(params)
            return types.ApplyWorkspaceEditResult(applied=self.apply_edits)

        self.feature(types.WORKSPACE_INLAY_HINT_REFRESH)(refresh)
        self.feature(types.WORKSPACE_CODE_LENS_REFRESH)(refresh_lenses)
        self.feature(types.WORKSPACE_APPLY_EDIT)(apply_edit)


CONFIG = ClientServerConfig(server_command=SERVER, client_factory=EditorClient)


def fixture_text(name: str) -> str:
    return (FIXTURES / name).read_text()


def without_spec(text: str) -> str:
    start = text.index("/* @optiml")
    end = text.index("*/", start) + len("*/\n")
    return text[:start] + text[end:]


async def start(client: LanguageClient, preset: str, options: Any = None) -> None:
    caps = client_capabilities(preset)
    if isinstance(client, EditorClient):
        client.preset = preset
    await client.initialize_session(
        types.InitializeParams(capabilities=caps, initialization_options=options)
    )


def open_document(client: LanguageClient, path: Path, text: str) -> str:
    uri = path.as_uri()
    client.text_document_did_open(
        types.DidOpenTextDocumentParams(
            text_document=types.TextDocumentItem(uri=uri, language_id="cuda", version=1, text=text)
        )
    )
    return uri


def replace(client: LanguageClient, uri: str, version: int, at: types.Range, text: str) -> None:
    """An incremental change, as editors send them."""
    client.text_document_did_change(
        types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
            content_changes=[types.TextDocumentContentChangePartial(range=at, text=text)],
        )
    )


def save(client: LanguageClient, uri: str) -> None:
    client.text_document_did_save(
        types.DidSaveTextDocumentParams(text_document=types.TextDocumentIdentifier(uri=uri))
    )


def span(line: int, start: int, end: int) -> types.Range:
    return types.Range(types.Position(line, start), types.Position(line, end))


def diagnostics(client: LanguageClient, uri: str, source: str | None = None) -> list:
    return [d for d in client.diagnostics.get(uri, []) if source in (None, d.source)]


async def eventually(check: Callable[[], Any], timeout: float = 30.0, what: str = "") -> Any:
    """Poll `check` (sync or async) until it returns something truthy."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or check}")
        await asyncio.sleep(0.05)


def hover_text(result: types.Hover | None) -> str:
    return result.contents.value if result is not None else ""


async def hover_at(client: LanguageClient, uri: str, line: int, character: int) -> str:
    result = await client.text_document_hover_async(
        types.HoverParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            position=types.Position(line, character),
        )
    )
    return hover_text(result)
