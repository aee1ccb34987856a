"""pygls's LanguageServerProtocol, answering what it would drop, crash on or show as a pop-up.
`receive` takes each message `server.transport` has read and checked:

- a request whose params do not parse gets InvalidParams saying what is wrong (pygls drops it,
  leaving the client waiting forever); a notification's are logged and dropped; a response's
  fail the request it answers;
- a request for a method the server does not have gets MethodNotFound; an unknown notification
  (`$/` ones included) is ignored;
- before `initialize`, requests get ServerNotInitialized and notifications are dropped; a second
  `initialize` gets InvalidRequest; from `shutdown` on (its receipt, not its handler's end),
  requests get InvalidRequest and `exit` ends the server with 0; responses to the server's own
  requests are still taken (pygls drops them: issue #605);
- `shutdown` cancels the requests in flight without failing itself (pygls issue #606);
- `didChange` for a document that was never opened is ignored (pygls raises KeyError);
- `workspace/executeCommand` of an unknown command says which commands there are;
- every error response carries one line: no traceback (pygls puts one in an InternalError's
  `data`), nothing longer than `MESSAGE_LIMIT`.

Tracebacks go to the log (`logging`, stderr) only: pygls logs them before answering."""

from __future__ import annotations

import json
import logging
from typing import Any
from urllib.parse import unquote

from cattrs import transform_error
from lsprotocol import types
from pygls.exceptions import (
    JsonRpcException,
    JsonRpcInternalError,
    JsonRpcInvalidParams,
    JsonRpcInvalidRequest,
    JsonRpcMethodNotFound,
    JsonRpcServerNotInitialized,
)
from pygls.protocol import LanguageServerProtocol
from pygls.protocol.language_server import lsp_method
from pygls.workspace import TextDocument

logger = logging.getLogger(__name__)

MESSAGE_LIMIT = 300  # characters of an error message sent to the client


def one_line(text: str, limit: int = MESSAGE_LIMIT) -> str:
    """The first non-blank line of `text`, at most `limit` characters."""
    line = next((s.strip() for s in str(text).splitlines() if s.strip()), "")
    return line if len(line) <= limit else line[: limit - 1] + "…"


def shown(args: Any, limit: int = 120) -> str:
    """What a client sent, as JSON on one line of at most `limit` characters: for messages that
    say what was expected and what came."""
    text = json.dumps(list(args), ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def server_error(text: str) -> str:
    """An unexpected exception, as the client sees it: `KeyError: 'x'` (pygls's form) →
    `OptiML server error (KeyError): 'x'; see the server log`."""
    line = one_line(text, MESSAGE_LIMIT - 60)
    kind, sep, detail = line.partition(": ")
    kind = kind.rpartition(".")[2]  # `pygls.exceptions.JsonRpcInternalError`
    if sep and kind.isidentifier():
        return f"OptiML server error ({kind}): {detail}; see the server log"
    return f"OptiML server error: {line}; see the server log"


def _params_problem(data: dict[str, Any]) -> str | None:
    """The shape pygls's converter would bend rather than reject: `workspace/executeCommand`'s
    `command` coerced to a string, its `arguments` string split into characters."""
    if data.get("method") != types.WORKSPACE_EXECUTE_COMMAND:
        return None
    params = data.get("params")
    if not isinstance(params, dict) or not isinstance(params.get("command"), str):
        return "workspace/executeCommand takes {command: string, arguments?: array}"
    if not isinstance(params.get("arguments", []), list | None):
        return f"the arguments of {params['command']} must be an array"
    return None


class Protocol(LanguageServerProtocol):
    def __init__(self, server: Any, converter: Any) -> None:
        super().__init__(server, converter)
        self.initialize_seen = False

    # ---- receiving --------------------------------------------------------------------------

    def receive(self, data: dict[str, Any]) -> None:
        """One JSON-RPC message (its shape checked by `server.transport`): refused, structured and
        handled, or answered with why not."""
        method = data.get("method")
        refusal = self._refusal(method) if method is not None else None
        if refusal is not None:
            if "id" in data:
                logger.info("request %r refused: %s", method, refusal.message)
                self.reply_error(data["id"], refusal)
            else:
                logger.debug("notification %r ignored: %s", method, refusal.message)
            return
        message = self.structure_message(data)
        if message is None:
            return
        if method == types.INITIALIZE:
            self.initialize_seen = True
        self.handle_message(message)
        if method == types.SHUTDOWN:
            # From now on (not once its handler is done, as in pygls): requests that follow it
            # are refused, and `exit` ends the server with 0, as the spec has it.
            self._shutdown = True

    def _refusal(self, method: str) -> JsonRpcException | None:
        """Why a message for `method` is not handled now, or None."""
        if method == types.EXIT:
            return None
        if method == types.INITIALIZE and self.initialize_seen:
            return JsonRpcInvalidRequest("initialize was already sent")
        if not self.initialize_seen and method != types.INITIALIZE:
            return JsonRpcServerNotInitialized(f"{method} before initialize")
        if self._shutdown:
            return JsonRpcInvalidRequest(f"{method} after shutdown: only exit is accepted now")
        if not self._known(method):
            return JsonRpcMethodNotFound(f"no method {one_line(method, 100)}")
        return None

    def structure_message(self, data: dict[str, Any]) -> Any:
        """The typed message; None when it cannot be read: a request is then answered with
        InvalidParams, a notification dropped, a response fails the request it answers."""
        problem = _params_problem(data) if "id" in data else None
        if problem is not None:
            self.reply_error(data["id"], JsonRpcInvalidParams(problem))
            return None
        try:
            return super().structure_message(data)
        except JsonRpcException as e:
            cause = e.__cause__
            detail = "; ".join(transform_error(cause)[:3]) if cause is not None else e.message
        method = data.get("method")
        if method is None:  # a response of the client's, to one of the server's requests
            future = self._request_futures.pop(data["id"], None)
            logger.warning("unreadable response to request %r: %s", data["id"], detail)
            if future is not None and not future.done():
                future.set_exception(JsonRpcInvalidParams(f"unreadable response: {detail}"))
        elif "id" in data:
            error = JsonRpcInvalidParams(f"invalid params for {method}: {detail}")
            self.reply_error(data["id"], error)
        else:
            logger.warning("dropped %s: invalid params: %s", method, detail)
        return None

    def handle_message(self, message: Any) -> None:
        if self._shutdown and getattr(message, "method", None) is None:
            # A response to one of the server's requests still settles it after shutdown (pygls
            # drops it, and whatever awaits it waits forever: pygls issue #605).
            future = self._request_futures.get(message.id)
            if future is None or future.done():  # cancelled by the shutdown
                self._request_futures.pop(message.id, None)
                logger.debug("response to %r after shutdown: its request was cancelled", message.id)
                return
            error = getattr(message, "error", None)
            result = None if error is not None else getattr(message, "result", None)
            self._handle_response(message.id, result, error)
            return
        super().handle_message(message)

    def _known(self, method: str) -> bool:
        return (
            method == types.CANCEL_REQUEST
            or method in self.fm.builtin_features
            or method in self.fm.features
        )

    def open_document(self, uri: str) -> TextDocument | None:
        """The document as the client last sent it, if it is open (pygls keys them unquoted)."""
        return self.workspace.text_documents.get(unquote(uri))

    # ---- answering --------------------------------------------------------------------------

    def reply_error(self, msg_id: Any, error: JsonRpcException) -> None:
        """An error response; to a message whose id could not be read, with `"id": null` (which
        lsprotocol's types would leave out)."""
        if msg_id is not None:
            self._send_response(msg_id, error=error.to_response_error())
            return
        body = {"code": error.code, "message": one_line(error.message)}
        self._send_data({"jsonrpc": self.VERSION, "id": None, "error": body})

    def abandon(self) -> None:
        """The connection is over (`exit`, or the client went away): nothing more is sent, and
        the requests in flight are cancelled before their tasks are (pygls would otherwise resume
        a cancelled handler's generator and log a CancelledError for each)."""
        self.writer = None
        for future in list(self._request_futures.values()):
            future.cancel()

    def _send_data(self, data: Any) -> None:
        if self.writer is None:  # the connection is over: what tasks still say goes nowhere
            logger.debug("not sent, the connection is closed: %.200r", data)
            return
        super()._send_data(data)

    def _send_response(
        self, msg_id: Any, result: Any = None, error: types.ResponseError | None = None
    ) -> None:
        """Every response goes out here: an error's message made one line (an unexpected
        exception's as `server_error`), its traceback (pygls's `data`) left in the log."""
        if error is not None:
            message = error.message
            if error.code == JsonRpcInternalError.CODE:
                message = server_error(message)
            data = error.data
            if isinstance(data, dict) and "traceback" in data:
                data = None
            error = types.ResponseError(code=error.code, message=one_line(message), data=data)
        super()._send_response(msg_id, result=result, error=error)

    # ---- built-in features ------------------------------------------------------------------

    @lsp_method(types.TEXT_DOCUMENT_DID_CHANGE)
    def lsp_text_document__did_change(self, params: types.DidChangeTextDocumentParams) -> Any:
        """pygls's, for documents that are open; a change to any other is ignored."""
        if self.open_document(params.text_document.uri) is None:
            logger.debug("didChange for %s, which is not open: ignored", params.text_document.uri)
            return
        yield from super().lsp_text_document__did_change(params)

    @lsp_method(types.SHUTDOWN)
    def lsp_shutdown(self, *args: Any) -> Any:
        """pygls's, cancelling the requests in flight from a copy of their table: a generator
        handler's future, cancelled, is answered at once and leaves the table, which pygls
        iterates itself and so fails with RuntimeError (pygls issue #606)."""
        if (user_handler := self.fm.features.get(types.SHUTDOWN)) is not None:
            yield user_handler, args, None
        current_id = self.msg_id
        for msg_id, future in list(self._request_futures.items()):
            if msg_id != current_id and not future.done():
                future.cancel()
        self._shutdown = True

    @lsp_method(types.WORKSPACE_EXECUTE_COMMAND)
    def lsp_workspace__execute_command(self, params: types.ExecuteCommandParams) -> Any:
        """pygls's, with an unknown command answered by the list of known ones."""
        if params.command not in self.fm.commands:
            known = ", ".join(sorted(self.fm.commands))
            raise JsonRpcInvalidParams(
                f"no command {one_line(params.command, 80)!r}; the commands are {known}"
            )
        return (yield from super().lsp_workspace__execute_command(params))
