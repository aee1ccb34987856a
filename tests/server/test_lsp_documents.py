"""Spec diagnostics: published on open at the spec error's range, updated by incremental changes,
cleared when the spec is fixed; positions in the client's units (UTF-16 for VS Code, UTF-8 for
Neovim)."""

from __future__ import annotations

from lsprotocol import types
from pytest_lsp import LanguageClient

from tests.server.helpers import (
    diagnostics,
    eventually,
    fixture_text,
    hover_at,
    open_document,
    replace,
    span,
)

SAXPY = fixture_text("saxpy.cu")


def spec_errors(client: LanguageClient, uri: str) -> list[types.Diagnostic]:
    return [
        d
        for d in diagnostics(client, uri, "optiml")
        if d.severity == types.DiagnosticSeverity.Error
    ]


async def test_spec_errors_on_open_then_cleared_when_fixed(client: LanguageClient, tmp_path):
    text = SAXPY.replace("y: inout float[n]", "y: inoot float[n]").replace(
        "block = 256", "blok = 256"
    )
    uri = open_document(client, tmp_path / "saxpy.cu", text)

    found = await eventually(lambda: spec_errors(client, uri), what="spec diagnostics")
    by_message = {d.message.split(";")[0]: d.range for d in found}
    assert by_message["unknown role `inoot`"] == span(8, 41, 46)
    assert by_message[
        "launch takes `grid = ...`, `block = ...` and optionally `smem = ...`"
    ] == span(9, 34, 44)
    assert all(d.source == "optiml" for d in found)

    replace(client, uri, 2, span(8, 41, 46), "inout")
    await eventually(lambda: len(spec_errors(client, uri)) == 2, what="one error fixed")
    replace(client, uri, 3, span(9, 34, 38), "block")
    await eventually(lambda: not spec_errors(client, uri), what="errors cleared")


async def test_ranges_in_the_clients_units(client: LanguageClient, tmp_path):
    """An emoji before the kernel's name is 1 code point, 2 UTF-16 units and 4 UTF-8 bytes."""
    prefix = "__global__ void /*😀*/ "
    text = SAXPY.replace("__global__ void ", prefix)
    uri = open_document(client, tmp_path / "saxpy.cu", text)
    utf8 = client.capabilities.general is not None and "utf-8" in (
        client.capabilities.general.position_encodings or []
    )
    units = len(prefix.encode()) if utf8 else len(prefix.encode("utf-16-le")) // 2
    result = await client.text_document_hover_async(
        types.HoverParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            position=types.Position(12, units + 2),
        )
    )
    assert result is not None and result.range == span(12, units, units + len("saxpy"))


async def test_a_file_that_is_not_cuda_is_left_alone(client: LanguageClient, tmp_path):
    uri = (tmp_path / "notes.txt").as_uri()
    client.text_document_did_open(
        types.DidOpenTextDocumentParams(
            text_document=types.TextDocumentItem(
                uri=uri, language_id="plaintext", version=1, text="__global__ void k() {}"
            )
        )
    )
    assert await hover_at(client, uri, 0, 17) == ""
    assert uri not in client.diagnostics


async def test_text_that_is_not_cuda_still_gets_an_answer(client: LanguageClient, tmp_path):
    uri = open_document(client, tmp_path / "garbage.cu", "}}{{ __global__ void (( <<< @optiml\x00")
    await eventually(lambda: uri in client.diagnostics, what="a publish")
    assert await hover_at(client, uri, 0, 3) == ""


def test_spec_cache_moves_errors_with_their_comment_and_reparses_changed_ones():
    from optiml.cuda.source import SourceFile
    from optiml.outline import SpecCache

    spec = "/* @optiml\n *   args: x: in float[n], y: out flaot[n]\n *   launch: grid = cdiv(n, 256), block = 256\n *   sizes: n = 1000\n */\n"
    body = "__global__ void k(int n, const float* x, float* y) { }\n"
    cache = SpecCache()
    first = SourceFile(spec + body, "k.cu")
    sig = "one file's kernels"
    _, issues = cache.parse(first, first.kernel("k"), sig)
    moved = SourceFile("\n\n\n" + spec + body, "k.cu")
    _, moved_issues = cache.parse(moved, moved.kernel("k"), sig)
    assert issues and [i.position.line for i in moved_issues] == [
        i.position.line + 3 for i in issues
    ]
    assert [i.message for i in moved_issues] == [i.message for i in issues]
    fixed = SourceFile(spec.replace("flaot", "float") + body, "k.cu")
    parsed, fixed_issues = cache.parse(fixed, fixed.kernel("k"), sig)
    assert fixed_issues == [] and parsed is not None and parsed.buffers[1].dtype == "f32"
