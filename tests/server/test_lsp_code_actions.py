""" "Add OptiML spec": offered inside a kernel without a spec and nowhere else; its edit, applied,
gives a file whose spec parses. Clients without code action literals get a Command instead."""

from __future__ import annotations

import pytest_lsp
from lsprotocol import types
from pytest_lsp import LanguageClient, client_capabilities

from optiml.cuda.source import SourceFile
from optiml.spec import parse_spec
from tests.server.helpers import (
    CONFIG,
    EditorClient,
    eventually,
    fixture_text,
    open_document,
    replace,
    span,
    without_spec,
)

SAXPY = fixture_text("saxpy.cu")
BARE = without_spec(SAXPY)  # the kernel is on lines 7-13 (0-based), host code below


async def actions(
    client: LanguageClient, uri: str, at: types.Range, only: list[str] | None = None
) -> list:
    found = await client.text_document_code_action_async(
        types.CodeActionParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            range=at,
            context=types.CodeActionContext(diagnostics=[], only=only),
        )
    )
    return found or []


def apply(text: str, edit: types.WorkspaceEdit, uri: str, version: int) -> str:
    """The edit (one insertion at the start of a line) applied to `text`."""
    if edit.document_changes is not None:  # versioned: VS Code
        (change,) = edit.document_changes
        assert change.text_document.uri == uri and change.text_document.version == version
        (insert,) = change.edits
    else:
        (insert,) = edit.changes[uri]
    assert insert.range.start == insert.range.end and insert.range.start.character == 0
    lines = text.split("\n")
    line = insert.range.start.line
    return "\n".join(lines[:line]) + "\n" + insert.new_text + "\n".join(lines[line:])


async def test_add_spec_inside_a_kernel_without_one(client: LanguageClient, tmp_path):
    uri = open_document(client, tmp_path / "saxpy.cu", BARE)
    (action,) = await eventually(lambda: actions(client, uri, span(10, 4, 4)), what="an action")
    assert action.title == "Add OptiML spec for `saxpy`"
    assert action.kind == types.CodeActionKind.RefactorRewrite
    # both clients resolve: the draft (checked with nvcc) is made once the action is picked
    assert action.edit is None and action.data == [uri, 1, "saxpy"]
    action = await client.code_action_resolve_async(action)

    text = apply(BARE, action.edit, uri, version=1)
    assert "@optiml" in text
    source = SourceFile(text, str(tmp_path / "saxpy.cu"))
    spec = parse_spec(source, source.kernel("saxpy"))
    assert spec.kernel == "saxpy" and spec.launch.block == ["256"]


async def test_nothing_outside_kernels_or_on_a_kernel_with_a_spec(client: LanguageClient, tmp_path):
    bare = open_document(client, tmp_path / "bare.cu", BARE)
    specced = open_document(client, tmp_path / "saxpy.cu", SAXPY)
    assert await eventually(lambda: actions(client, bare, span(9, 0, 0)), what="an action")
    assert await actions(client, bare, span(2, 0, 0)) == []  # a comment above the kernel
    assert await actions(client, bare, span(17, 4, 4)) == []  # host code
    assert not [a for a in await actions(client, specced, span(15, 4, 4)) if "spec" in a.title]
    assert await actions(client, bare, span(10, 4, 4), only=["quickfix"]) == []
    assert await actions(client, bare, span(10, 4, 4), only=["refactor"])


def _literal_free() -> types.ClientCapabilities:
    caps = client_capabilities("neovim")
    caps.text_document.code_action.code_action_literal_support = None
    return caps


@pytest_lsp.fixture(config=CONFIG)
async def old_client(lsp_client: EditorClient):
    await lsp_client.initialize_session(types.InitializeParams(capabilities=_literal_free()))
    yield
    await lsp_client.shutdown_session()


async def test_clients_without_literals_get_a_command_that_applies_the_edit(
    old_client: EditorClient, tmp_path
):
    uri = open_document(old_client, tmp_path / "saxpy.cu", BARE)
    (command,) = await eventually(
        lambda: actions(old_client, uri, span(10, 4, 4)), what="a command"
    )
    assert isinstance(command, types.Command) and list(command.arguments) == [uri, 1, "saxpy"]
    await old_client.workspace_execute_command_async(
        types.ExecuteCommandParams(command=command.command, arguments=command.arguments)
    )
    (params,) = old_client.applied
    assert "@optiml" in apply(BARE, params.edit, uri, version=1)


def _no_resolve() -> types.ClientCapabilities:
    caps = client_capabilities("visual-studio-code")
    caps.text_document.code_action.resolve_support = None
    return caps


@pytest_lsp.fixture(config=CONFIG)
async def no_resolve(lsp_client: EditorClient):
    await lsp_client.initialize_session(types.InitializeParams(capabilities=_no_resolve()))
    yield
    await lsp_client.shutdown_session()


async def test_clients_without_resolve_get_the_edit_with_the_action(no_resolve, tmp_path):
    uri = open_document(no_resolve, tmp_path / "saxpy.cu", BARE)
    (action,) = await eventually(lambda: actions(no_resolve, uri, span(10, 4, 4)), what="one")
    assert "@optiml" in apply(BARE, action.edit, uri, version=1)


async def test_a_resolve_after_an_edit_of_the_kernel_says_to_ask_again(client, tmp_path):
    uri = open_document(client, tmp_path / "saxpy.cu", BARE)
    (action,) = await eventually(lambda: actions(client, uri, span(10, 4, 4)), what="an action")
    replace(client, uri, 2, span(9, 0, 0), "// edited\n")
    await eventually(lambda: actions(client, uri, span(11, 4, 4)), what="the new version")
    resolved = await client.code_action_resolve_async(action)
    assert resolved.edit is None
    assert "changed since the action was offered" in client.messages[-1].message
