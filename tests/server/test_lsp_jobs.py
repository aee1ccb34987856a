"""Optimize and profile jobs from the editor, against the server with the stand-in executor
(`stand_in_server.py`: candidates compiled for real, a cost model for the GPU, a profile with
hotspots): the code actions that start them, their progress, cancelling one, the proposal's code
lenses, Accept (versioned, re-anchored, or refused), Reject, Compare and Report, the profile in the
hover and its hotspots as diagnostics. VS Code's capabilities come with the OptiML extension's
`experimental.optiml` (it opens diffs and reports itself); Neovim's without."""

from __future__ import annotations

import random
import sys
from pathlib import Path
from typing import Any

import pytest
import pytest_lsp
from lsprotocol import types
from pygls.exceptions import JsonRpcException, JsonRpcInvalidParams
from pygls.uris import to_fs_path
from pygls.workspace.position_codec import PositionCodec
from pytest_lsp import ClientServerConfig, client_capabilities

from server.documents import Snapshot, parse
from server.proposals import line_edits, text_edits
from tests.server.helpers import (
    CLIENTS,
    SERVER,
    EditorClient,
    diagnostics,
    eventually,
    fixture_text,
    hover_at,
    open_document,
    replace,
    span,
)
from tests.support import FIXTURES

STAND_IN = [sys.executable, str(Path(__file__).with_name("stand_in_server.py"))]
SAXPY = fixture_text("saxpy.cu")
# The fixture itself (never written): candidates of the same text and path hit the compile cache
# that tests/search/test_optimize.py filled.
SAXPY_PATH = FIXTURES / "saxpy.cu"
NAME = (12, 18)  # on `saxpy` in `__global__ void saxpy(...)`
JOB_TIMEOUT = 120.0


def capabilities(preset: str) -> types.ClientCapabilities:
    caps = client_capabilities(preset)
    if preset == "visual-studio-code":  # as vscode-client/ declares
        caps.experimental = {"optiml": {"diff": True, "openReport": True}}
    return caps


async def _start(client: EditorClient, preset: str, evaluations: int = 4) -> None:
    client.preset = preset
    await client.initialize_session(
        types.InitializeParams(
            capabilities=capabilities(preset), initialization_options={"evaluations": evaluations}
        )
    )


@pytest_lsp.fixture(
    params=CLIENTS, config=ClientServerConfig(server_command=STAND_IN, client_factory=EditorClient)
)
async def editor(request, lsp_client: EditorClient):
    await _start(lsp_client, request.param)
    yield
    await lsp_client.shutdown_session()


@pytest_lsp.fixture(
    config=ClientServerConfig(server_command=[*STAND_IN, "--broken"], client_factory=EditorClient)
)
async def broken(lsp_client: EditorClient):
    await _start(lsp_client, "neovim")
    yield
    await lsp_client.shutdown_session()


# ---- helpers ------------------------------------------------------------------------------------


async def execute(client: EditorClient, command: str, *args: Any) -> Any:
    return await client.workspace_execute_command_async(
        types.ExecuteCommandParams(command=command, arguments=list(args))
    )


def target(uri: str, version: int = 1, kernel: str = "saxpy") -> dict:
    return {"uri": uri, "version": version, "kernel": kernel}


async def start_job(client: EditorClient, command: str, uri: str, version: int = 1) -> str:
    started = await execute(client, command, target(uri, version))
    assert started is not None, client.messages
    return started["job"]


def reports(client: EditorClient, job: str) -> list:
    return client.progress_reports.get(f"optiml/job/{job}", [])


async def job_end(client: EditorClient, job: str) -> list:
    """The job's progress, begin to end, once it has ended."""
    return await eventually(
        lambda: (r := reports(client, job)) and isinstance(r[-1], types.WorkDoneProgressEnd) and r,
        timeout=JOB_TIMEOUT,
        what=f"the end of job {job}",
    )


async def lenses(client: EditorClient, uri: str) -> list[types.CodeLens]:
    found = await client.text_document_code_lens_async(
        types.CodeLensParams(text_document=types.TextDocumentIdentifier(uri=uri))
    )
    return found or []


async def optimized(client: EditorClient, uri: str) -> tuple[list, str]:
    """Optimize `saxpy`: its progress and the id of its proposal."""
    progress = await job_end(client, await start_job(client, "optiml.optimize", uri))
    (accept, *_) = await eventually(lambda: lenses(client, uri), what="the code lenses")
    return progress, accept.command.arguments[0]["proposal"]


def apply_text_edits(text: str, edits: list[types.TextEdit]) -> str:
    """What an editor does with an edit (ASCII text: UTF-8 and UTF-16 positions agree)."""
    lines = text.split("\n")
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line) + 1)

    def offset(p: types.Position) -> int:
        return min(starts[p.line] + p.character, len(text)) if p.line < len(lines) else len(text)

    # from the last: inserts at one position end up in the order given
    last_first = sorted(enumerate(edits), key=lambda ie: (offset(ie[1].range.start), ie[0]))
    for _, e in reversed(last_first):
        text = text[: offset(e.range.start)] + e.new_text + text[offset(e.range.end) :]
    return text


def applied_text(client: EditorClient, text: str, uri: str, version: int) -> str:
    """The one edit the server asked to apply, applied to `text`; checks it is versioned (VS
    Code) and annotated to be confirmed where the client supports that."""
    (params,) = client.applied
    edit = params.edit
    if client.preset == "visual-studio-code":
        (change,) = edit.document_changes
        assert change.text_document.uri == uri and change.text_document.version == version
        (annotation,) = edit.change_annotations.values()
        assert annotation.needs_confirmation
        assert (
            annotation.label.startswith("OptiML: ") and "× faster (dram → dram)" in annotation.label
        )
        assert all(e.annotation_id in edit.change_annotations for e in change.edits)
        return apply_text_edits(text, change.edits)
    assert edit.document_changes is None and edit.change_annotations is None  # Neovim 0.11
    return apply_text_edits(text, edit.changes[uri])


# ---- tests --------------------------------------------------------------------------------------


async def test_job_actions_on_a_kernel_with_a_valid_spec_only(editor: EditorClient, tmp_path):
    uri = open_document(editor, SAXPY_PATH, SAXPY)
    broken = open_document(editor, tmp_path / "broken.cu", SAXPY.replace("inout", "inoot"))

    async def titles(at_uri: str, line: int, only: list[str] | None = None) -> list[str]:
        found = await editor.text_document_code_action_async(
            types.CodeActionParams(
                text_document=types.TextDocumentIdentifier(uri=at_uri),
                range=span(line, 4, 4),
                context=types.CodeActionContext(diagnostics=[], only=only),
            )
        )
        return [a.title for a in found or []]

    assert await eventually(lambda: titles(uri, 15)) == [
        "Optimize kernel `saxpy`",
        "Profile kernel `saxpy`",
    ]
    assert await titles(uri, 20) == []  # host code
    assert await titles(uri, 2) == []  # the comment at the top
    assert await titles(broken, 15) == []  # a spec with errors
    assert await titles(uri, 15, only=["quickfix"]) == []
    assert len(await titles(uri, 15, only=["refactor"])) == 2
    (action, _) = await editor.text_document_code_action_async(
        types.CodeActionParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            range=span(15, 4, 4),
            context=types.CodeActionContext(diagnostics=[]),
        )
    )
    assert action.command.command == "optiml.optimize"
    assert list(action.command.arguments) == [target(uri)]


async def test_optimize_shows_progress_then_a_proposal_to_accept(editor: EditorClient):
    uri = open_document(editor, SAXPY_PATH, SAXPY)
    (begin, *middle, end), proposal = await optimized(editor, uri)

    assert begin.title == "OptiML: optimizing saxpy" and begin.cancellable
    searched = [r for r in middle if r.message and "evaluations" in r.message]
    assert searched and searched[-1].message.startswith("4/4 evaluations · best ")
    assert " · dram · " in searched[-1].message
    percentages = [r.percentage for r in middle]
    assert percentages == sorted(percentages) and percentages[-1] == 100
    assert end.message.startswith("saxpy: ") and "× faster" in end.message

    found = await lenses(editor, uri)
    titles = [lens.command.title for lens in found]
    assert titles[0].startswith("Accept (") and titles[0].endswith("× faster)")
    assert titles[1:] == ["Reject", "Compare", "Report"]
    assert {lens.range.start.line for lens in found} == {7}  # the spec comment's first line
    if editor.preset == "visual-studio-code":
        assert editor.code_lens_refreshes >= 1

    hover = await hover_at(editor, uri, *NAME)
    assert "OptiML proposal" in hover and " ms → " in hover and "bottleneck: dram → dram" in hover

    compared = await execute(editor, "optiml.compareProposal", {"proposal": proposal})
    assert compared["original"] == uri and compared["title"].startswith("saxpy.cu ↔ ")
    variant = Path(to_fs_path(compared["variant"]))
    assert variant.name == "saxpy.cu" and variant.parent != SAXPY_PATH.parent
    report = await execute(editor, "optiml.openReport", {"proposal": proposal})
    assert Path(to_fs_path(report["report"])).read_text().startswith("<!")
    if editor.preset == "neovim":  # no `experimental.optiml`: the server shows them
        shown = [(d.uri, bool(d.external)) for d in editor.shown_documents]
        assert shown == [(compared["variant"], False), (report["report"], True)]
    else:
        assert editor.shown_documents == []

    assert await execute(editor, "optiml.acceptProposal", {"proposal": proposal}) == {
        "applied": True
    }
    assert applied_text(editor, SAXPY, uri, version=1) == variant.read_text()
    assert await lenses(editor, uri) == []
    assert SAXPY_PATH.read_text() == SAXPY  # the server never writes the user's file


async def test_accept_re_anchors_after_an_edit_elsewhere_and_refuses_after_one_inside(
    editor: EditorClient,
):
    uri = open_document(editor, SAXPY_PATH, SAXPY)
    _, proposal = await optimized(editor, uri)
    variant = await execute(editor, "optiml.compareProposal", {"proposal": proposal})
    variant = Path(to_fs_path(variant["variant"])).read_text()

    replace(editor, uri, 2, span(16, 8, 8), " ")  # inside the kernel
    refused = await execute(editor, "optiml.acceptProposal", {"proposal": proposal})
    assert refused == {"applied": False} and editor.applied == []
    assert "changed since the optimize job started" in editor.messages[-1].message
    assert len(await lenses(editor, uri)) == 4  # kept

    replace(editor, uri, 3, span(16, 8, 9), "")  # undone
    header = "// a line above\n// and another\n"
    replace(editor, uri, 4, span(0, 0, 0), header)
    accepted = await execute(editor, "optiml.acceptProposal", {"proposal": proposal})
    assert accepted == {"applied": True}
    assert applied_text(editor, header + SAXPY, uri, version=4) == header + variant


async def test_reject_removes_the_proposal(editor: EditorClient):
    uri = open_document(editor, SAXPY_PATH, SAXPY)
    _, proposal = await optimized(editor, uri)
    assert await execute(editor, "optiml.rejectProposal", {"proposal": proposal}) is None
    assert await lenses(editor, uri) == []
    assert "OptiML proposal" not in await hover_at(editor, uri, *NAME)
    assert await execute(editor, "optiml.acceptProposal", {"proposal": proposal}) is None
    assert editor.messages[-1].message.startswith("OptiML: that proposal is gone")
    assert editor.applied == []


async def test_cancel_stops_the_job_with_what_it_has(editor: EditorClient):
    """VS Code cancels from the progress notification; Neovim with the command."""
    editor.set_configuration({"evaluations": 48}, section="optiml")
    editor.workspace_did_change_configuration(types.DidChangeConfigurationParams(settings=None))
    uri = open_document(editor, SAXPY_PATH, SAXPY)
    await eventually(lambda: hover_at(editor, uri, *NAME), what="the parse")
    job = await start_job(editor, "optiml.optimize", uri)
    await eventually(
        lambda: any("evaluations" in (r.message or "") for r in reports(editor, job)[1:]),
        timeout=JOB_TIMEOUT,
        what="the search's first evaluation",
    )
    if editor.preset == "visual-studio-code":
        editor.window_work_done_progress_cancel(
            types.WorkDoneProgressCancelParams(token=f"optiml/job/{job}")
        )
    else:
        assert await execute(editor, "optiml.cancelJob") == {"cancelled": [job]}
    end = (await job_end(editor, job))[-1]
    evaluations = int(end.message.split("cancelled after ")[1].split(" ")[0])
    assert end.message.startswith("saxpy: cancelled after ") and evaluations < 48
    assert await lenses(editor, uri) == []
    assert await execute(editor, "optiml.cancelJob", {"job": job}) == {"cancelled": []}


async def test_a_profile_shows_in_the_hover_and_its_hotspots_until_the_kernel_changes(
    editor: EditorClient,
):
    uri = open_document(editor, SAXPY_PATH, SAXPY)
    (begin, *_, end) = await job_end(editor, await start_job(editor, "optiml.profile", uri))
    assert begin.title == "OptiML: profiling saxpy" and end.message.startswith("saxpy: dram — ")

    hover = await hover_at(editor, uri, *NAME)
    assert "Profile (Nsight Compute, document version 1)" in hover
    assert "DRAM-bound" in hover and "long_scoreboard 62%" in hover

    def hotspots() -> list[types.Diagnostic]:
        return [d for d in diagnostics(editor, uri, "optiml") if d.message.startswith("hotspot")]

    top, second = await eventually(hotspots, what="hotspot diagnostics")
    assert top.message == "hotspot: 62 % of stall samples (long_scoreboard); 58M excess L2 sectors"
    assert top.severity == types.DiagnosticSeverity.Information
    assert top.range == span(16, 8, 31)  # `y[i] = a * x[i] + y[i];`
    (related,) = top.related_information
    assert related.location.range == span(12, 16, 21)  # the kernel's name
    assert second.severity == types.DiagnosticSeverity.Hint and second.range.start.line == 14

    replace(editor, uri, 2, span(0, 0, 0), "\n")  # above the kernel: they move with it
    await eventually(lambda: [d.range.start.line for d in hotspots()] == [17, 15])
    replace(editor, uri, 3, span(17, 8, 8), " ")  # inside the kernel: gone
    await eventually(lambda: not hotspots(), what="the hotspots cleared")
    assert "Profile (Nsight Compute" not in await hover_at(editor, uri, 13, 18)


async def test_one_job_per_kernel_and_bad_requests_get_errors(editor: EditorClient, tmp_path):
    uri = open_document(editor, SAXPY_PATH, SAXPY)
    bad_spec = open_document(editor, tmp_path / "bad.cu", SAXPY.replace("inout", "inoot"))
    await eventually(lambda: hover_at(editor, uri, *NAME), what="the parse")
    for command, args in [
        ("optiml.optimize", ["saxpy"]),
        ("optiml.profile", [{"uri": uri, "version": "1", "kernel": "saxpy"}]),
        ("optiml.acceptProposal", ["p1"]),
        ("optiml.compareProposal", []),
        ("optiml.cancelJob", [{"job": 7}]),
        ("optiml.optimize", [target((tmp_path / "closed.cu").as_uri())]),
    ]:
        with pytest.raises(JsonRpcException) as error:
            await execute(editor, command, *args)
        assert error.value.code == JsonRpcInvalidParams.CODE, command
    assert error.value.message == (
        f"optiml.optimize: {(tmp_path / 'closed.cu').as_uri()} is not open (or not a CUDA file)"
    )

    before = len(editor.messages)
    assert await execute(editor, "optiml.optimize", target(bad_spec)) is None
    assert await execute(editor, "optiml.profile", target(uri, kernel="saxpy2")) is None
    assert await execute(editor, "optiml.openReport", {"proposal": "nope"}) is None
    assert await execute(editor, "optiml.cancelJob") == {"cancelled": []}
    said = [m.message for m in editor.messages[before:]]
    assert said == [
        "OptiML: `saxpy` has no valid @optiml spec; add one or fix its errors first",
        "OptiML: no kernel `saxpy2` in saxpy.cu",
        "OptiML: that proposal is gone (accepted, rejected or replaced by a newer one)",
        "OptiML: no OptiML job is running",
    ]

    # a stale version: the job takes the document as it is now; a second one is refused
    job = await start_job(editor, "optiml.optimize", uri, version=0)
    assert await execute(editor, "optiml.profile", target(uri)) is None
    assert editor.messages[-1].message == (
        "OptiML: `saxpy` is already being optimized; cancel that job first"
    )
    await execute(editor, "optiml.cancelJob", {"job": job})
    await job_end(editor, job)


async def test_a_job_that_raises_ends_and_is_told_once(broken: EditorClient):
    uri = open_document(broken, SAXPY_PATH, SAXPY)
    await eventually(lambda: hover_at(broken, uri, *NAME), what="the parse")
    end = (await job_end(broken, await start_job(broken, "optiml.optimize", uri)))[-1]
    expected = (
        "OptiML: optimizing `saxpy` failed (RuntimeError: the stand-in GPU fell over); "
        "see the server log"
    )
    assert end.message == expected
    assert [m.message for m in broken.messages] == [expected]
    assert "saxpy" in await hover_at(broken, uri, *NAME)  # still answering
    assert await lenses(broken, uri) == []


def test_whole_line_edits_turn_a_text_into_another():
    """Edits at the end of a text without a final newline included."""
    rng = random.Random(1)
    words = ["{", "}", "", "x = 1;", "y[i] = a;", "// c"]
    for _ in range(300):
        a, b = ("\n".join(rng.choice(words) for _ in range(rng.randint(0, 8))) for _ in range(2))
        model = parse(Snapshot("file:///t.cu", 1, a), PositionCodec())
        edits = line_edits(a.split("\n"), b.split("\n"))
        found = [types.TextEdit(range=r, new_text=t) for r, t in text_edits(model, edits)]
        assert apply_text_edits(a, found) == b, (a, b)


@pytest_lsp.fixture(config=ClientServerConfig(server_command=SERVER, client_factory=EditorClient))
async def on_the_gpu(lsp_client: EditorClient):
    await _start(lsp_client, "neovim")
    yield
    await lsp_client.shutdown_session()


@pytest.mark.gpu
async def test_a_profile_job_on_the_gpu(on_the_gpu: EditorClient, tmp_path):
    """`optiml serve` itself: Nsight Compute through the local executor."""
    path = tmp_path / "saxpy.cu"
    path.write_text(SAXPY)
    uri = open_document(on_the_gpu, path, SAXPY)
    (*_, end) = await job_end(on_the_gpu, await start_job(on_the_gpu, "optiml.profile", uri))
    assert end.message.startswith("saxpy: "), end.message
    hover = await hover_at(on_the_gpu, uri, *NAME)
    assert "Profile (Nsight Compute, document version 1)" in hover and "| duration |" in hover
    spots = await eventually(
        lambda: [d for d in diagnostics(on_the_gpu, uri) if d.message.startswith("hotspot")],
        what="hotspot diagnostics",
    )
    assert all(12 <= d.range.start.line <= 17 for d in spots)  # in the kernel
