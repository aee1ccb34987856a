"""The language server's wiring: each handler turns LSP params into plain values, asks a feature
module, and turns the answer back. State (documents, compiles, settings, client capabilities) lives
on `OptimlServer`; nothing here blocks the event loop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import uuid
from collections.abc import AsyncIterator, Coroutine
from typing import Any

from lsprotocol import types
from pygls.exceptions import JsonRpcException, JsonRpcInvalidParams
from pygls.lsp.server import LanguageServer
from pygls.protocol import LanguageServerProtocol

from optiml import __version__
from server import probe
from server.capabilities import ClientCapabilities, resolve
from server.checks import Checks
from server.code_actions import ADD_SPEC_COMMAND, KIND, add_spec_edit, code_actions
from server.diagnostics import diagnostics
from server.documents import Documents, Model, Snapshot, is_cuda
from server.hover import hover
from server.inlay_hints import inlay_hints
from server.settings import SECTION, Settings, merge

logger = logging.getLogger(__name__)


class Protocol(LanguageServerProtocol):
    """pygls drops a request whose params do not parse without answering it, which leaves the
    client waiting forever; this answers it with the error."""

    def structure_message(self, data: dict[str, Any]) -> Any:
        try:
            return super().structure_message(data)
        except JsonRpcException as e:
            if "id" not in data or "method" not in data:
                raise
            cause = f": {e.__cause__}" if e.__cause__ else ""
            error = JsonRpcInvalidParams(f"invalid params for {data['method']}{cause}")
            self._send_response(data["id"], error=error.to_response_error())
            return None

    def handle_message(self, message: Any) -> None:
        if message is not None:  # None: a request already answered with an error
            super().handle_message(message)


class OptimlServer(LanguageServer):
    def __init__(self) -> None:
        super().__init__("optiml", __version__, protocol_cls=Protocol)
        self.caps: ClientCapabilities = resolve(types.ClientCapabilities())
        self.settings = Settings()
        self.documents = Documents()
        self.checks = Checks(slots=os.cpu_count() or 1)
        self.loop_lag = probe.LoopLag() if os.environ.get(probe.ENV) else None
        self.early_messages: list[str] = []  # settings errors found before `initialized`
        self._told: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()

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
        logger.error("%s: %s", source.__name__, error)
        message = f"OptiML server error ({type(error).__name__}): {error}; see the server log"
        self.tell(message, once=True)

    def snapshot(self, uri: str) -> Snapshot:
        doc = self.workspace.get_text_document(uri)
        return Snapshot(uri, doc.version or 0, doc.source)

    def publish(self, model: Model) -> None:
        check = self.documents.check(model.snapshot.uri)
        found = diagnostics(model, check, hints=not self.caps.inlay_hints)
        self.text_document_publish_diagnostics(
            types.PublishDiagnosticsParams(
                uri=model.snapshot.uri, diagnostics=found, version=model.snapshot.version
            )
        )

    async def compile(self, snapshot: Snapshot) -> None:
        async with self._progress(f"OptiML: compiling {snapshot.name}"):
            outcome = await self.checks.run(snapshot, self.settings.arch)
        doc = self.documents.get(snapshot.uri)
        if outcome is None or doc is None:
            return  # superseded, or closed meanwhile
        doc.check = outcome
        if outcome.error is not None:
            kind = types.MessageType.Warning if outcome.tool_missing else types.MessageType.Error
            self.tell(f"OptiML: {outcome.error}", kind, once=True)
        if doc.model is not None:
            self.publish(doc.model)
        if self.caps.inlay_hints and self.caps.inlay_hint_refresh:
            self.workspace_inlay_hint_refresh(None)

    async def pull_settings(self) -> None:
        if not self.caps.configuration:
            return
        params = types.ConfigurationParams(items=[types.ConfigurationItem(section=SECTION)])
        found = await self.workspace_configuration_async(params)
        self.apply_settings(found[0] if found else None)

    def apply_settings(self, raw: Any) -> None:
        before = self.settings
        self.settings, problems = merge(before, raw)
        for problem in problems:
            self.tell(problem)
        if self.settings.arch != before.arch:
            for doc in self.documents:
                if doc.check is not None:
                    self.spawn(self.compile(doc.check.snapshot))

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run `coro` in the background, its failure reported like a handler's."""
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (error := task.exception()) is not None:
            self.report_server_error(error, type(error))

    @contextlib.asynccontextmanager
    async def _progress(self, title: str) -> AsyncIterator[None]:
        token = f"optiml/{uuid.uuid4()}"
        shown = self.caps.work_done_progress
        if shown:
            try:
                await self.work_done_progress.create_async(token)
            except JsonRpcException:
                shown = False
        if shown:
            self.work_done_progress.begin(token, types.WorkDoneProgressBegin(title=title))
        try:
            yield
        finally:
            if shown:
                self.work_done_progress.end(token, types.WorkDoneProgressEnd())
                self.work_done_progress.tokens.pop(token, None)


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
    if not is_cuda(params.text_document.uri, params.text_document.language_id):
        return
    model = await ls.documents.update(ls.snapshot(params.text_document.uri))
    if model is not None:
        ls.publish(model)
        if model.kernels:
            await ls.compile(model.snapshot)


async def did_change(ls: OptimlServer, params: types.DidChangeTextDocumentParams) -> None:
    if ls.documents.get(params.text_document.uri) is None:
        return
    model = await ls.documents.update(ls.snapshot(params.text_document.uri))
    if model is not None:
        ls.publish(model)


async def did_save(ls: OptimlServer, params: types.DidSaveTextDocumentParams) -> None:
    model = await ls.documents.model(params.text_document.uri)
    if model is not None and model.kernels:
        await ls.compile(model.snapshot)


def did_close(ls: OptimlServer, params: types.DidCloseTextDocumentParams) -> None:
    ls.checks.cancel(params.text_document.uri)
    if ls.documents.close(params.text_document.uri) is not None:
        ls.text_document_publish_diagnostics(
            types.PublishDiagnosticsParams(uri=params.text_document.uri, diagnostics=[])
        )


async def code_action(
    ls: OptimlServer, params: types.CodeActionParams
) -> list[types.CodeAction | types.Command] | None:
    model = await ls.documents.model(params.text_document.uri)
    if model is None:
        return None
    return code_actions(model, params.range, params.context.only, ls.caps)


async def add_spec(ls: OptimlServer, uri: str, version: int, kernel: str) -> None:
    """The `optiml.addSpec` command, for clients that cannot apply a code action's edit."""
    model = await ls.documents.model(uri)
    found = [k for k in model.kernels if k.name == kernel] if model else []
    if model is None or model.snapshot.version != version or not found:
        ls.tell(f"OptiML: `{kernel}` changed since the action was offered; ask for it again")
        return
    edit = add_spec_edit(model, found[0], ls.caps)
    if edit is not None:
        label = f"Add OptiML spec for {kernel}"
        await ls.workspace_apply_edit_async(types.ApplyWorkspaceEditParams(edit=edit, label=label))


async def hover_(ls: OptimlServer, params: types.HoverParams) -> types.Hover | None:
    model = await ls.documents.model(params.text_document.uri)
    if model is None:
        return None
    check = ls.documents.check(params.text_document.uri)
    return hover(model, check, params.position, ls.caps.hover_markdown)


async def inlay_hint(ls: OptimlServer, params: types.InlayHintParams) -> list[types.InlayHint]:
    model = await ls.documents.model(params.text_document.uri)
    check = ls.documents.check(params.text_document.uri)
    if model is None or check is None:
        return []
    return inlay_hints(model, check, params.range)


async def shutdown(ls: OptimlServer, params: None) -> None:
    await ls.checks.stop()


def loop_lag(ls: OptimlServer, params: Any) -> dict[str, float]:
    return ls.loop_lag.take() if ls.loop_lag is not None else {}


def make_server() -> OptimlServer:
    ls = OptimlServer()
    ls.feature(types.INITIALIZE)(initialize)
    ls.feature(types.INITIALIZED)(initialized)
    ls.feature(types.WORKSPACE_DID_CHANGE_CONFIGURATION)(did_change_configuration)
    ls.feature(types.TEXT_DOCUMENT_DID_OPEN)(did_open)
    ls.feature(types.TEXT_DOCUMENT_DID_CHANGE)(did_change)
    ls.feature(types.TEXT_DOCUMENT_DID_SAVE)(did_save)
    ls.feature(types.TEXT_DOCUMENT_DID_CLOSE)(did_close)
    ls.feature(types.TEXT_DOCUMENT_CODE_ACTION, types.CodeActionOptions(code_action_kinds=[KIND]))(
        code_action
    )
    ls.command(ADD_SPEC_COMMAND)(add_spec)
    ls.feature(types.TEXT_DOCUMENT_HOVER)(hover_)
    ls.feature(types.TEXT_DOCUMENT_INLAY_HINT)(inlay_hint)
    ls.feature(types.SHUTDOWN)(shutdown)
    if ls.loop_lag is not None:
        ls.feature(probe.METHOD)(loop_lag)
    return ls
