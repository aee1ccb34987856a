"""Background compiles: nvcc's errors as diagnostics on the right line after a save, ptxas's figures
as inlay hints (Neovim) or Hint diagnostics (VS Code) and in the hover, the user's file never
written, and a stale compile killed when a newer snapshot arrives."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
from lsprotocol import types
from pytest_lsp import LanguageClient

from optiml.api import check_file
from tests.server.helpers import (
    EditorClient,
    diagnostics,
    eventually,
    fixture_text,
    hover_at,
    open_document,
    replace,
    save,
    span,
)
from tests.support import FIXTURES

BROKEN = fixture_text("broken/compile_error.cu")
FIXED = BROKEN.replace("y[idx]", "y[i]")


def compiles_done(client: LanguageClient) -> int:
    return sum(
        1
        for reports in client.progress_reports.values()
        if reports and isinstance(reports[-1], types.WorkDoneProgressEnd)
    )


def nvcc_errors(client: LanguageClient, uri: str) -> list[types.Diagnostic]:
    return [
        d for d in diagnostics(client, uri, "nvcc") if d.severity == types.DiagnosticSeverity.Error
    ]


async def test_an_nvcc_error_appears_on_its_line_after_a_save(client: LanguageClient, tmp_path):
    uri = open_document(client, tmp_path / "leaky.cu", FIXED)
    await eventually(lambda: compiles_done(client) == 1, what="the compile on open")
    assert nvcc_errors(client, uri) == []
    (begin, *_), *_ = client.progress_reports.values()
    # not offered as cancellable: VS Code would show every save's compile as a notification
    assert begin.title == "OptiML: compiling leaky.cu" and not begin.cancellable

    replace(client, uri, 2, span(15, 10, 11), "idx")
    save(client, uri)
    (error,) = await eventually(lambda: nvcc_errors(client, uri), what="nvcc's error")
    assert error.range == span(15, 10, 13)  # `idx`, line 16 of the file
    assert error.message == 'identifier "idx" is undefined'
    assert "The last compile failed" in await hover_at(client, uri, 10, 18)

    replace(client, uri, 3, span(15, 10, 13), "i")
    save(client, uri)
    await eventually(lambda: compiles_done(client) == 3, what="the compile of the fix")
    await eventually(lambda: not nvcc_errors(client, uri), what="the error cleared")


@pytest.fixture(scope="module")
def saxpy_registers() -> int:
    """ptxas's count, from the same compile the server runs (so it hits the same cache)."""
    (k,) = check_file(FIXTURES / "saxpy.cu").kernels
    return k.report.resources.registers


async def test_static_feedback_shows_ptxas_registers(client: EditorClient, saxpy_registers):
    text = fixture_text("saxpy.cu")
    uri = open_document(client, FIXTURES / "saxpy.cu", text)
    expected = f"{saxpy_registers} regs · 0 B spills · occupancy 100% (warps)"

    hover = await eventually(
        lambda: _text_if(hover_at(client, uri, 12, 18), "registers"), what="the hover's report"
    )
    assert f"| registers | {saxpy_registers} per thread |" in hover
    assert "limited by warps" in hover
    assert "sizes: `n = 67108864, 1000003`" in hover
    assert "launch: `grid = cdiv(n, 256), block = 256`" in hover

    signature = text.split("\n")[12]
    if client.capabilities.text_document.inlay_hint is not None:  # Neovim
        assert client.inlay_hint_refreshes
        (hint,) = await client.text_document_inlay_hint_async(
            types.InlayHintParams(
                text_document=types.TextDocumentIdentifier(uri=uri),
                range=types.Range(types.Position(0, 0), types.Position(len(text.split("\n")), 0)),
            )
        )
        assert hint.label == expected
        assert hint.position == types.Position(12, len(signature))
        assert not [
            d for d in diagnostics(client, uri) if d.severity == types.DiagnosticSeverity.Hint
        ]
    else:  # VS Code 1.65 has no inlay hints: a Hint diagnostic on the kernel's name
        (hint,) = await eventually(
            lambda: [
                d for d in diagnostics(client, uri) if d.severity == types.DiagnosticSeverity.Hint
            ],
            what="the Hint diagnostic",
        )
        assert hint.message == expected and hint.range == span(12, 16, 21)


async def _text_if(pending, needle: str) -> str | None:
    text = await pending
    return text if needle in text else None


async def test_the_users_file_is_never_written(client: LanguageClient, tmp_path):
    path = tmp_path / "leaky.cu"
    path.write_text(BROKEN)
    before = os.stat(path).st_mtime_ns
    uri = open_document(client, path, BROKEN)
    save(client, uri)
    await eventually(lambda: nvcc_errors(client, uri), what="nvcc's error")
    await eventually(lambda: compiles_done(client) >= 1, what="the compile's end")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["leaky.cu"]
    assert path.read_text() == BROKEN and os.stat(path).st_mtime_ns == before


def _big(n: int) -> str:
    kernel = (FIXTURES / "saxpy.cu").read_text().split("// Host-side")[0]
    return "\n".join(kernel.replace("saxpy", f"saxpy_{i}") for i in range(n))


def _processes_mentioning(needle: str) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and needle in (proc / "cmdline").read_bytes().decode(
                errors="replace"
            ):
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def compile_ends(client: LanguageClient) -> list[str]:
    """The messages of the compiles' ended progress, in the order the compiles started."""
    return [
        reports[-1].message or ""
        for token, reports in client.progress_reports.items()
        if token.startswith("optiml/job/")
        and reports  # a token created whose first report has not come yet
        and isinstance(reports[-1], types.WorkDoneProgressEnd)
    ]


async def test_a_newer_snapshot_kills_the_stale_compile(client: LanguageClient, tmp_path):
    path = tmp_path / f"stale_{uuid.uuid4().hex[:12]}.cu"  # its own: tests run side by side
    big = _big(200)
    uri = open_document(client, path, big)
    await eventually(lambda: _processes_mentioning(path.stem), what="nvcc running")
    lines = big.split("\n")
    everything = types.Range(types.Position(0, 0), types.Position(len(lines) - 1, len(lines[-1])))
    replace(client, uri, 2, everything, BROKEN)
    save(client, uri)
    ends = await eventually(
        lambda: found if len(found := compile_ends(client)) == 2 else None,
        timeout=120,  # a 200-kernel compile on a loaded machine
        what="both compiles' ends",
    )
    assert ends == [f"{path.name}: cancelled", f"{path.name}: 1 compile error"]
    # the killed group's processes are gone (SIGKILL is delivered, not waited for, by the kill)
    await eventually(lambda: not _processes_mentioning(path.stem), timeout=15, what="nvcc gone")
    (error,) = nvcc_errors(client, uri)  # the newer snapshot's outcome, published
    assert error.message == 'identifier "idx" is undefined'


async def test_an_edit_saved_before_the_open_is_parsed_is_what_gets_compiled(
    client: LanguageClient, tmp_path
):
    """The open's parse of a long file may end after the edit's save: the open's compile, older,
    then neither starts nor ends the newer one."""
    path = tmp_path / f"race_{uuid.uuid4().hex[:12]}.cu"
    big = _big(200)
    uri = open_document(client, path, big)
    lines = big.split("\n")
    everything = types.Range(types.Position(0, 0), types.Position(len(lines) - 1, len(lines[-1])))
    replace(client, uri, 2, everything, BROKEN)
    save(client, uri)
    (error,) = await eventually(lambda: nvcc_errors(client, uri), timeout=120, what="the error")
    assert error.message == 'identifier "idx" is undefined'
    await eventually(lambda: not _processes_mentioning(path.stem), timeout=120, what="no compile")
    # the diagnostics are published just before the compile's progress ends
    last = f"{path.name}: 1 compile error"
    ends = await eventually(
        lambda: (found := compile_ends(client)) and last in found and found, what="its end"
    )
    assert ends[-1] == last and set(ends[:-1]) <= {f"{path.name}: cancelled"}
    (error,) = nvcc_errors(client, uri)  # no older compile published over it


async def test_an_older_snapshot_never_ends_a_newer_compile(monkeypatch):
    """The rule behind the race above, without its timing: once version 2 compiles or has
    compiled, version 1's compile is not started."""
    from server import app
    from server.checks import CheckOutcome
    from server.documents import Snapshot

    started: list[int] = []
    monkeypatch.setattr(app, "start", lambda ls, kind, snapshot: started.append(snapshot.version))
    ls = app.OptimlServer()
    v1, v2, v3 = (Snapshot("file:///k.cu", v, "") for v in (1, 2, 3))
    ls.jobs.new("check", v2, "", ls.settings)  # version 2 compiling
    ls.compile(v1)
    ls.compile(v3)
    assert started == [3]
    ls.jobs = app.Jobs()
    ls.checks.keep(CheckOutcome(v2))  # version 2 compiled, nothing in flight
    ls.compile(v1)
    ls.compile(v2)
    assert started == [3, 2]
