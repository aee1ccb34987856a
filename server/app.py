"""The language server's wiring: each handler turns LSP params into plain values, asks a feature
module, and turns the answer back. State (documents, compiles, jobs and what they found, settings,
client capabilities) lives on `OptimlServer`; nothing here blocks the event loop or waits for a
job."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Coroutine
from typing import Any

from lsprotocol import types
from pygls.exceptions import (
    FeatureRequestError,
    JsonRpcException,
    JsonRpcInternalError,
    JsonRpcInvalidParams,
)
from pygls.lsp.server import LanguageServer
from pygls.uris import to_fs_path

from optiml.api import __version__, formula_in_comment, llm_configured, prose_in_comment
from server import probe, transport
from server.capabilities import ClientCapabilities, resolve
from server.checks import Checks
from server.code_actions import (
    ADD_SPEC_COMMAND,
    KINDS,
    add_spec_edit,
    code_actions,
    needs_draft,
    spec_arg,
)
from server.diagnostics import diagnostics
from server.documents import PARSE_DELAY_S, Documents, Model, Snapshot, is_cuda
from server.hover import hover
from server.inlay_hints import inlay_hints
from server.jobs import (
    CANCEL_COMMAND,
    DONE,
    GENERATE_COMMAND,
    OPTIMIZE_COMMAND,
    PROFILE_COMMAND,
    ExecutorFactory,
    Jobs,
    Kind,
    Profiles,
    comment_arg,
    job_arg,
    local_executor,
    start,
    target_arg,
)
from server.proposals import (
    ACCEPT_COMMAND,
    COMPARE_COMMAND,
    REJECT_COMMAND,
    REPORT_COMMAND,
    Proposal,
    Proposals,
    code_lenses,
    compare,
    files_in_the_way,
    plan,
    proposal_arg,
    workspace_edit,
    write_files,
)
from server.protocol import Protocol, one_line, server_error
from server.settings import SECTION, Settings, merge

logger = logging.getLogger(__name__)


class OptimlServer(LanguageServer):
    def __init__(self, executor_factory: ExecutorFactory | None = None) -> None:
        super().__init__("optiml", __version__, protocol_cls=Protocol)
        self.caps: ClientCapabilities = resolve(types.ClientCapabilities())
        self.settings = Settings()
        self.documents = Documents()
        self.checks = Checks(slots=os.cpu_count() or 1)
        self.executor_factory: ExecutorFactory = executor_factory or local_executor
        self.jobs = Jobs()
        self.profiles = Profiles()
        self.proposals = Proposals()
        self.loop_lag = probe.LoopLag() if os.environ.get(probe.ENV) else None
        self.early_messages: list[str] = []  # settings errors found before `initialized`
        self._told: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._llm_ready: dict[tuple, bool] = {}
        self.exit_code = 0

    def tell(
        self, message: str, kind: types.MessageType = types.MessageType.Error, once: bool = False
    ) -> None:
        """Show a message; with `once`, only the first time: a problem that recurs on every save
        (no nvcc, a bug) is told once, a bad setting every time it is set."""
        if once and message in self._told:
            return
        self._told.add(message)
        self.window_show_message(types.ShowMessageParams(type=kind, message=message))

    def report_server_error(self, error: Exception, source: Any) -> None:
        """pygls's one place for errors outside a handler's answer. A request's error is in its
        response already (see `server.protocol`), so it is only logged; anything else (a
        notification's handler, a background task, sending) is shown once, in one line, the
        traceback going to the log only."""
        if source is FeatureRequestError:
            logger.debug("answered with an error: %s", one_line(str(error)))
            return
        trace = error.data.get("traceback") if isinstance(error, JsonRpcInternalError) else None
        if isinstance(error, JsonRpcInternalError):  # pygls's wrapping: "KeyError: 'x'"
            message = server_error(error.message)
        else:
            message = server_error(f"{type(error).__name__}: {error}")
        if isinstance(trace, list):
            logger.error("%s\nTraceback (most recent call last):\n%s", message, "".join(trace))
        else:
            logger.error("%s", message, exc_info=error)
        self.tell(message, once=True)

    def start_io(self, stdin: Any = None, stdout: Any = None) -> None:
        """LSP on stdin/stdout, framed by `server.transport` (pygls's reader loses its place for
        good after one bad frame); `exit_code` is what `exit` asked for."""
        self.exit_code = transport.serve_io(self, stdin, stdout)

    def start_tcp(self, host: str, port: int) -> None:
        transport.serve_tcp(self, host, port)

    def snapshot(self, uri: str) -> Snapshot | None:
        """The document as the client last sent it; None once it is closed. (A handler runs after
        the messages that came with it: a `didClose` may already have been handled, and pygls's
        `get_text_document` would then read the file from disk.)"""
        doc = self.protocol.open_document(uri)
        return Snapshot(uri, doc.version or 0, doc.source) if doc is not None else None

    def publish(self, model: Model) -> None:
        check = self.checks.latest(model.snapshot.uri)
        profiles = self.profiles.of(model)
        found = diagnostics(model, check, hints=not self.caps.inlay_hints, profiles=profiles)
        self.text_document_publish_diagnostics(
            types.PublishDiagnosticsParams(
                uri=model.snapshot.uri, diagnostics=found, version=model.snapshot.version
            )
        )

    def republish(self, uri: str) -> None:
        """The diagnostics of the newest parse again (a job found something)."""
        doc = self.documents.get(uri)
        if doc is not None and doc.model is not None:
            self.publish(doc.model)

    def refresh_code_lenses(self) -> None:
        if self.caps.code_lens_refresh:
            self.workspace_code_lens_refresh(None)

    def refresh_inlay_hints(self) -> None:
        if self.caps.inlay_hints and self.caps.inlay_hint_refresh:
            self.workspace_inlay_hint_refresh(None)

    def llm_ready(self, path: str) -> bool:
        """Whether an LLM is configured for a file at `path` (the settings over optiml.toml and
        the environment): prose in a comment can then become a kernel. Kept per folder and
        settings; the environment and optiml.toml are read once."""
        folder = os.path.dirname(path) if path != "<memory>" else os.getcwd()
        key = (folder, tuple(sorted(self.settings.llm_section().items())))
        if key not in self._llm_ready:
            self._llm_ready[key] = llm_configured(self.settings.llm_section() or None, folder)
        return self._llm_ready[key]

    def compile(self, snapshot: Snapshot) -> None:
        """The compile of `snapshot` as a check job (an older one of the document ends). A
        snapshot older than one already compiled or compiling is not: an open's parse of a long
        file may finish after the save of an edit, and must not end the newer compile."""
        latest = self.checks.latest(snapshot.uri)
        if self.jobs.newer_check(snapshot) or (
            latest is not None and latest.snapshot.version > snapshot.version
        ):
            return
        start(self, "check", snapshot)

    async def pull_settings(self) -> None:
        if not self.caps.configuration:
            return
        params = types.ConfigurationParams(items=[types.ConfigurationItem(section=SECTION)])
        try:
            found = await self.workspace_configuration_async(params)
        except JsonRpcException as e:  # the client failed to answer: the settings stay
            logger.warning("workspace/configuration: %s", e)
            return
        self.apply_settings(found[0] if found else None)

    def apply_settings(self, raw: Any) -> None:
        before = self.settings
        self.settings, problems = merge(before, raw)
        for problem in problems:
            self.tell(problem)
        if self.settings.arch != before.arch:
            for outcome in self.checks.outcomes():
                self.compile(outcome.snapshot)

    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run `coro` in the background, its failure reported like a handler's."""
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._finished)
        return task

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (error := task.exception()) is not None:
            self.report_server_error(error, type(error))


def initialize(ls: OptimlServer, params: types.InitializeParams) -> None:
    ls.caps = resolve(params.capabilities)
    ls.documents.codec = ls.workspace.position_codec
    ls.settings, ls.early_messages = merge(ls.settings, params.initialization_options)


async def initialized(ls: OptimlServer, params: types.InitializedParams) -> None:
    for message in ls.early_messages:
        ls.tell(message)
    if ls.loop_lag is not None:
        ls.spawn(ls.loop_lag.run())
    await ls.pull_settings()


async def did_change_configuration(
    ls: OptimlServer, params: types.DidChangeConfigurationParams
) -> None:
    if ls.caps.configuration:
        await ls.pull_settings()
    elif isinstance(params.settings, dict):
        ls.apply_settings(params.settings.get(SECTION))


async def did_open(ls: OptimlServer, params: types.DidOpenTextDocumentParams) -> None:
    snapshot = ls.snapshot(params.text_document.uri)
    if snapshot is None or not is_cuda(snapshot.uri, params.text_document.language_id):
        return
    model = await ls.documents.update(snapshot)
    if model is not None:
        ls.publish(model)
        if model.kernels:
            ls.compile(model.snapshot)


async def did_change(ls: OptimlServer, params: types.DidChangeTextDocumentParams) -> None:
    snapshot = ls.snapshot(params.text_document.uri)
    if ls.documents.get(params.text_document.uri) is None or snapshot is None:
        return
    model = await ls.documents.update(snapshot, delay=PARSE_DELAY_S)
    if model is not None:
        ls.publish(model)


async def did_save(ls: OptimlServer, params: types.DidSaveTextDocumentParams) -> None:
    model = await ls.documents.model(params.text_document.uri)
    if model is not None and model.kernels:
        ls.compile(model.snapshot)


def did_close(ls: OptimlServer, params: types.DidCloseTextDocumentParams) -> None:
    ls.jobs.cancel_checks(params.text_document.uri)
    ls.checks.forget(params.text_document.uri)
    if ls.documents.close(params.text_document.uri) is not None:
        ls.text_document_publish_diagnostics(
            types.PublishDiagnosticsParams(uri=params.text_document.uri, diagnostics=[])
        )


async def code_action(
    ls: OptimlServer, params: types.CodeActionParams
) -> list[types.CodeAction | types.Command] | None:
    model = await ls.documents.current(params.text_document.uri)
    if model is None:
        return None
    llm = ls.llm_ready(model.snapshot.path)
    args = (model, params.range, params.context.only, ls.caps, llm)
    if needs_draft(model, params.range, params.context.only, ls.caps):
        return await asyncio.to_thread(code_actions, *args)  # a draft compiles: off the loop
    return code_actions(*args)


async def resolve_code_action(ls: OptimlServer, action: types.CodeAction) -> types.CodeAction:
    """ "Add OptiML spec", picked: its edit, drafted now (off the event loop: a draft compiles)
    against the version the action was offered for; without one if the kernel changed since."""
    try:
        uri, version, kernel = spec_arg(tuple(action.data or ()))
    except JsonRpcInvalidParams:
        return action
    model = await ls.documents.model(uri)
    found = [k for k in model.kernels if k.name == kernel] if model is not None else []
    if model is None or model.snapshot.version != version or not found:
        ls.tell(f"OptiML: `{kernel}` changed since the action was offered; ask for it again")
        return action
    action.edit = await asyncio.to_thread(add_spec_edit, model, found[0], ls.caps)
    return action


async def add_spec(ls: OptimlServer, *args: Any) -> None:
    """The `optiml.addSpec` command `[uri, version, kernel]`, for clients that cannot apply a code
    action's edit."""
    uri, version, kernel = spec_arg(args)
    model = await ls.documents.model(uri)
    if model is None:
        raise JsonRpcInvalidParams(f"{ADD_SPEC_COMMAND}: {uri} is not open (or not a CUDA file)")
    found = [k for k in model.kernels if k.name == kernel]
    if model.snapshot.version != version or not found:
        ls.tell(f"OptiML: `{kernel}` changed since the action was offered; ask for it again")
        return
    edit = await asyncio.to_thread(add_spec_edit, model, found[0], ls.caps)  # it compiles
    if edit is not None:
        label = f"Add OptiML spec for {kernel}"
        params = types.ApplyWorkspaceEditParams(edit=edit, label=label)
        try:
            await ls.workspace_apply_edit_async(params)
        except JsonRpcException as e:
            ls.tell(
                f"OptiML: the editor did not add the spec for `{kernel}`: {one_line(e.message)}"
            )


async def hover_(ls: OptimlServer, params: types.HoverParams) -> types.Hover | None:
    model = await ls.documents.current(params.text_document.uri)
    if model is None:
        return None
    check = ls.checks.latest(params.text_document.uri)
    return hover(model, check, params.position, ls.caps.hover_markdown, ls.profiles, ls.proposals)


# ---- jobs ---------------------------------------------------------------------------------------


async def start_job(ls: OptimlServer, kind: Kind, command: str, args: tuple) -> dict | None:
    """`optiml.optimize` / `optiml.profile` `[{uri, version, kernel}]`: a job on the document as
    it is now (the kernel must still be there with a valid spec); answers `{job}` at once."""
    target = target_arg(command, args)
    model = await ls.documents.model(target.uri)
    name = f"`{target.kernel}`"
    if model is None:
        raise JsonRpcInvalidParams(f"{command}: {target.uri} is not open (or not a CUDA file)")
    if model.kernel(target.kernel) is None:
        ls.tell(f"OptiML: no kernel {name} in {model.snapshot.name}", types.MessageType.Warning)
        return None
    if target.kernel not in model.specs:
        ls.tell(
            f"OptiML: {name} has no valid @optiml spec; add one or fix its errors first",
            types.MessageType.Warning,
        )
        return None
    if (busy := ls.jobs.busy(target.uri, target.kernel)) is not None:
        ls.tell(
            f"OptiML: {name} is already being {DONE[busy.kind]}; cancel that job first",
            types.MessageType.Info,
        )
        return None
    return {"job": start(ls, kind, model.snapshot, target.kernel).id}


async def generate(ls: OptimlServer, *args: Any) -> dict | None:
    """`optiml.generate` `[{uri, version, line}]`: a job that writes the kernel of the formula in
    the comment at `line` (0-based) of that version; answers `{job}` at once."""
    target = comment_arg(GENERATE_COMMAND, args)
    model = await ls.documents.model(target.uri)
    if model is None:
        raise JsonRpcInvalidParams(
            f"{GENERATE_COMMAND}: {target.uri} is not open (or not a CUDA file)"
        )
    if model.snapshot.version != target.version:
        ls.tell("OptiML: the file changed since the action was offered; ask for it again")
        return None
    if model.snapshot.path == "<memory>":  # an untitled buffer: nowhere to put the reference
        ls.tell(
            "OptiML: save the file first: a generated kernel's NumPy reference goes next to it",
            types.MessageType.Warning,
        )
        return None
    text, path = model.snapshot.text, model.snapshot.path
    if formula_in_comment(text, path, target.line) is None and not (
        prose_in_comment(text, target.line) is not None and ls.llm_ready(path)
    ):
        ls.tell(
            f"OptiML: line {target.line + 1} of {model.snapshot.name} is not in a comment with a "
            "formula (e.g. `// float x[N]; y[i] = max(x[i], 0)`), nor in one in prose with an "
            "LLM configured",
            types.MessageType.Warning,
        )
        return None
    if (busy := ls.jobs.busy(target.uri, "", target.line)) is not None:
        ls.tell(
            f"OptiML: a kernel is already being generated from {busy.subject}; cancel that job first",
            types.MessageType.Info,
        )
        return None
    return {"job": start(ls, "generate", model.snapshot, line=target.line).id}


async def optimize(ls: OptimlServer, *args: Any) -> dict | None:
    return await start_job(ls, "optimize", OPTIMIZE_COMMAND, args)


async def profile(ls: OptimlServer, *args: Any) -> dict | None:
    return await start_job(ls, "profile", PROFILE_COMMAND, args)


def cancel_job(ls: OptimlServer, *args: Any) -> dict:
    """`optiml.cancelJob` `[{job}]`, or no arguments for every optimize and profile job."""
    job_id = job_arg(args)
    cancelled = ls.jobs.cancel(job_id)
    if not cancelled:
        what = (
            "no OptiML job is running" if job_id is None else f"no OptiML job {job_id} is running"
        )
        ls.tell(f"OptiML: {what}", types.MessageType.Info)
    return {"cancelled": cancelled}


def progress_cancelled(ls: OptimlServer, params: types.WorkDoneProgressCancelParams) -> None:
    ls.jobs.cancel_token(params.token)


# ---- proposals ----------------------------------------------------------------------------------


def _proposal(ls: OptimlServer, command: str, args: tuple) -> Proposal | None:
    found = ls.proposals.get(proposal_arg(command, args))
    if found is None:
        ls.tell(
            "OptiML: that proposal is gone (accepted, rejected or replaced by a newer one)",
            types.MessageType.Warning,
        )
    return found


async def code_lens(ls: OptimlServer, params: types.CodeLensParams) -> list[types.CodeLens] | None:
    proposals = ls.proposals.of(params.text_document.uri)
    if not proposals:
        return None
    model = await ls.documents.model(params.text_document.uri)
    return code_lenses(proposals, model) if model is not None else None


async def accept_proposal(ls: OptimlServer, *args: Any) -> dict | None:
    """`workspace/applyEdit` with the proposal, against the document's version now; the proposal
    goes once applied."""
    p = _proposal(ls, ACCEPT_COMMAND, args)
    if p is None:
        return None
    model = await ls.documents.model(p.snapshot.uri)
    if model is None:
        ls.tell(f"OptiML: open {p.file_name} to accept its proposal", types.MessageType.Warning)
        return None
    edits = plan(p, model)
    if isinstance(edits, str):
        ls.tell(edits, types.MessageType.Warning)
        return {"applied": False}
    if in_the_way := files_in_the_way(p):
        names = ", ".join(f.name for f in in_the_way)
        ls.tell(
            f"OptiML: {names} exists now, and the proposal for `{p.kernel}` would create it; "
            "move it away or generate the kernel again",
            types.MessageType.Warning,
        )
        return {"applied": False}
    edit = workspace_edit(p, model, edits, ls.caps)
    params = types.ApplyWorkspaceEditParams(edit=edit, label=p.label)
    try:
        result = await ls.workspace_apply_edit_async(params)
    except JsonRpcException as e:  # the client could not even answer
        result = types.ApplyWorkspaceEditResult(applied=False, failure_reason=one_line(e.message))
    if result is None or not result.applied:
        failed = result.failure_reason if result is not None else None
        reason = f": {one_line(failed)}" if failed else ""
        ls.tell(
            f"OptiML: the editor did not apply the proposal for `{p.kernel}`{reason}; it is kept",
            types.MessageType.Info,
        )
        return {"applied": False}
    ls.proposals.drop(p.id)
    ls.refresh_code_lenses()
    if p.files and not ls.caps.creates_files:  # the edit could not carry them
        try:
            write_files(p)
        except OSError as e:
            ls.tell(f"OptiML: could not create the reference of `{p.kernel}`: {e}")
            return {"applied": True}
        names = ", ".join(name for name, _ in p.files)
        ls.tell(f"OptiML: created {names} next to {p.file_name}", types.MessageType.Info)
    return {"applied": True}


def reject_proposal(ls: OptimlServer, *args: Any) -> None:
    p = _proposal(ls, REJECT_COMMAND, args)
    if p is not None:
        ls.proposals.drop(p.id)
        ls.refresh_code_lenses()


async def compare_proposal(ls: OptimlServer, *args: Any) -> dict | None:
    """`{original, variant, title}`; a client that does not open the diff itself (no
    `experimental.optiml.diff`) is shown the variant's file."""
    p = _proposal(ls, COMPARE_COMMAND, args)
    if p is None:
        return None
    try:
        found = compare(p)
    except OSError as e:
        ls.tell(f"OptiML: could not write the proposal for `{p.kernel}`: {e}")
        return None
    if not ls.caps.opens_diff:
        await _show(ls, found["variant"], external=False)
    return found


async def open_report(ls: OptimlServer, *args: Any) -> dict | None:
    """`{report}`; a client that does not open it itself (no `experimental.optiml.openReport`) is
    asked to show it in the browser."""
    p = _proposal(ls, REPORT_COMMAND, args)
    if p is None:
        return None
    if p.report is None or not p.report.is_file():
        ls.tell(f"OptiML: the report of `{p.kernel}` is gone from {p.folder}")
        return None
    found = {"report": p.report.as_uri()}
    if not ls.caps.opens_report:
        await _show(ls, found["report"], external=True)
    return found


async def _show(ls: OptimlServer, uri: str, external: bool) -> None:
    shown = False
    if ls.caps.show_document:
        params = types.ShowDocumentParams(uri=uri, external=external, take_focus=True)
        try:
            result = await ls.window_show_document_async(params)
            shown = result is not None and result.success
        except JsonRpcException as e:
            logger.warning("window/showDocument %s: %s", uri, e)
    if not shown:
        ls.tell(f"OptiML: see {to_fs_path(uri) or uri}", types.MessageType.Info)


async def inlay_hint(ls: OptimlServer, params: types.InlayHintParams) -> list[types.InlayHint]:
    model = await ls.documents.current(params.text_document.uri)
    check = ls.checks.latest(params.text_document.uri)
    if model is None or check is None:
        return []
    return inlay_hints(model, check, params.range)


async def shutdown(ls: OptimlServer, params: None) -> None:
    await ls.jobs.stop()


def loop_lag(ls: OptimlServer, params: Any) -> dict[str, float]:
    return ls.loop_lag.take() if ls.loop_lag is not None else {}


def make_server(executor_factory: ExecutorFactory | None = None) -> OptimlServer:
    """The server; `executor_factory(settings)` gives the executor of each job (default: this
    machine's GPUs, `LocalExecutor`)."""
    ls = OptimlServer(executor_factory)
    ls.feature(types.INITIALIZE)(initialize)
    ls.feature(types.INITIALIZED)(initialized)
    ls.feature(types.WORKSPACE_DID_CHANGE_CONFIGURATION)(did_change_configuration)
    ls.feature(types.TEXT_DOCUMENT_DID_OPEN)(did_open)
    ls.feature(types.TEXT_DOCUMENT_DID_CHANGE)(did_change)
    ls.feature(types.TEXT_DOCUMENT_DID_SAVE)(did_save)
    ls.feature(types.TEXT_DOCUMENT_DID_CLOSE)(did_close)
    ls.feature(types.CODE_ACTION_RESOLVE)(resolve_code_action)
    ls.feature(
        types.TEXT_DOCUMENT_CODE_ACTION,
        types.CodeActionOptions(code_action_kinds=KINDS, resolve_provider=True),
    )(code_action)
    ls.command(ADD_SPEC_COMMAND)(add_spec)
    ls.command(OPTIMIZE_COMMAND)(optimize)
    ls.command(PROFILE_COMMAND)(profile)
    ls.command(CANCEL_COMMAND)(cancel_job)
    ls.feature(types.WINDOW_WORK_DONE_PROGRESS_CANCEL)(progress_cancelled)
    ls.feature(types.TEXT_DOCUMENT_CODE_LENS, types.CodeLensOptions(resolve_provider=False))(
        code_lens
    )
    ls.command(ACCEPT_COMMAND)(accept_proposal)
    ls.command(GENERATE_COMMAND)(generate)
    ls.command(REJECT_COMMAND)(reject_proposal)
    ls.command(COMPARE_COMMAND)(compare_proposal)
    ls.command(REPORT_COMMAND)(open_report)
    ls.feature(types.TEXT_DOCUMENT_HOVER)(hover_)
    ls.feature(types.TEXT_DOCUMENT_INLAY_HINT)(inlay_hint)
    ls.feature(types.SHUTDOWN)(shutdown)
    if ls.loop_lag is not None:
        ls.feature(probe.METHOD)(loop_lag)
    return ls
