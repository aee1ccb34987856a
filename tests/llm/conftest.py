"""A scripted HTTP server on 127.0.0.1 that speaks OpenAI's and Anthropic's wire formats.

Tests point the real SDK clients at it, script its replies (including errors in the providers' own
shapes), and inspect what it received. No test here touches the real network.
"""

from __future__ import annotations

import json
import logging
import os
import select
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from optiml.llm import LLMSettings, RetryPolicy

SECRET = "sk-test-THIS-KEY-MUST-NEVER-LEAK-0123456789"


@dataclass
class Reply:
    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0  # answer after this long, unless the client hangs up first
    hang: bool = False  # never answer; wait for the client to hang up


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


class FakeServer:
    def __init__(self) -> None:
        self.received: list[Received] = []
        self.script: deque[Reply] = deque()
        # Where set, answers every request from what it received (for requests sent at once, in
        # any order); otherwise the script's replies go out in turn.
        self.responder: Callable[[Received], Reply] | None = None
        self.disconnects = 0
        self.active = 0
        self.max_active = 0
        self._lock = threading.Lock()
        self._http = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._http.daemon_threads = True
        self._thread = threading.Thread(
            target=self._http.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        )
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._http.server_port}"

    @property
    def hits(self) -> int:
        return len(self.received)

    def push(self, *replies: Reply) -> None:
        self.script.extend(replies)

    def stop(self) -> None:
        self._http.shutdown()
        self._http.server_close()

    def _next(self, received: Received) -> Reply:
        if self.responder is not None:
            return self.responder(received)
        with self._lock:
            if self.script:
                return self.script.popleft()
        return Reply(
            500, {"error": {"message": "the test scripted no reply", "type": "server_error"}}
        )

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body go out as two writes

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                headers = {k.lower(): v for k, v in self.headers.items()}
                received = Received(self.path, headers, body)
                with server._lock:
                    server.received.append(received)
                    server.active += 1
                    server.max_active = max(server.max_active, server.active)
                try:
                    reply = server._next(received)
                    wait = 10.0 if reply.hang else reply.delay_s
                    if self._client_hung_up(wait):
                        with server._lock:
                            server.disconnects += 1
                        return
                    self._send(reply)
                finally:
                    with server._lock:
                        server.active -= 1

            def _client_hung_up(self, seconds: float) -> bool:
                deadline = time.monotonic() + seconds
                while (left := deadline - time.monotonic()) > 0:
                    readable, _, _ = select.select([self.connection], [], [], min(left, 0.02))
                    if readable and self.connection.recv(1, socket.MSG_PEEK) == b"":
                        return True
                return False

            def _send(self, reply: Reply) -> None:
                if isinstance(reply.body, bytes | str):
                    data = reply.body.encode() if isinstance(reply.body, str) else reply.body
                else:
                    data = json.dumps(reply.body).encode()
                self.send_response(reply.status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler

    @staticmethod
    def raw(status: int, body: str, **reply: Any) -> Reply:
        return Reply(status, body, **reply)

    # Replies in OpenAI's chat-completions format.

    @staticmethod
    def openai_chat(
        text: str | None = "ok",
        *,
        prompt_tokens: int = 10,
        completion_tokens: int = 5,
        model: str = "gpt-test",
        finish_reason: str = "stop",
        refusal: str | None = None,
        tool_args: str | None = None,
        usage: bool = True,
    ) -> Reply:
        message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": refusal}
        if tool_args is not None:
            message["content"] = None
            message["tool_calls"] = [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "Verdict", "arguments": tool_args},
                }
            ]
        body: dict[str, Any] = {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1700000000,
            "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        }
        if usage:
            body["usage"] = {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            }
        return Reply(200, body)

    @staticmethod
    def openai_error(
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> Reply:
        error = {"message": message, "type": type, "param": param, "code": code}
        return Reply(status, {"error": error}, headers or {})

    # Replies in Anthropic's messages format.

    @staticmethod
    def anthropic_message(
        text: str | None = "ok",
        *,
        tool_input: dict[str, Any] | None = None,
        tool_name: str = "Verdict",
        stop_reason: str = "end_turn",
        input_tokens: int = 12,
        output_tokens: int = 6,
        model: str = "claude-test",
    ) -> Reply:
        content: list[dict[str, Any]] = []
        if text is not None:
            content.append({"type": "text", "text": text})
        if tool_input is not None:
            content.append(
                {"type": "tool_use", "id": "toolu_1", "name": tool_name, "input": tool_input}
            )
        body = {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": None,
            "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens},
        }
        return Reply(200, body)

    @staticmethod
    def anthropic_error(
        status: int, type: str, message: str, *, headers: dict[str, str] | None = None
    ) -> Reply:
        body = {"type": "error", "error": {"type": type, "message": message}}
        return Reply(status, body, headers or {})


@pytest.fixture
def server() -> Iterator[FakeServer]:
    fake = FakeServer()
    yield fake
    fake.stop()


class Sleeps:
    """An injected sleep: records each delay and returns at once, so backoff costs no time."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


@pytest.fixture
def sleeps() -> Sleeps:
    return Sleeps()


@pytest.fixture
def env() -> dict[str, str]:
    return {"OPENAI_API_KEY": SECRET, "ANTHROPIC_API_KEY": SECRET, "OPTIML_LLM_API_KEY": SECRET}


@pytest.fixture
def settings_for(server: FakeServer, tmp_path: Path):
    """Settings aimed at the fake server; keyword arguments override any field."""

    def build(provider: str = "openai", **overrides: Any) -> LLMSettings:
        base_url = server.url + ("" if provider == "anthropic" else "/v1")
        values: dict[str, Any] = {
            "provider": provider,
            "model": "claude-sonnet-4-5" if provider == "anthropic" else "gpt-4o-mini",
            "base_url": base_url,
            "timeout_s": 2.0,
            "cache_dir": tmp_path / "cache",
            **overrides,
        }
        return LLMSettings(**values)

    return build


@pytest.fixture
def retry(sleeps: Sleeps):
    """A retry policy with the injected sleep and a fixed random draw (mid-range jitter)."""

    def build(settings: LLMSettings, draw: float = 0.5) -> RetryPolicy:
        return RetryPolicy.from_settings(settings, sleep=sleeps, random=lambda: draw)

    return build


@pytest.fixture(autouse=True, scope="module")
def _no_tls_trust_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The fake server speaks plain HTTP, so no test needs CA certificates; an empty trust store
    makes each SDK client's TLS context instant instead of ~40 ms of reading the CA bundle.
    Module scope, so that the environment is restored before any other folder's tests run."""
    saved = {name: os.environ.get(name) for name in ("SSL_CERT_FILE", "SSL_CERT_DIR")}
    os.environ.pop("SSL_CERT_FILE", None)
    os.environ["SSL_CERT_DIR"] = str(tmp_path_factory.mktemp("no-certificates"))
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture
def closed_port() -> int:
    """A local port nothing listens on: bound once for a free number, then released."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def secret() -> str:
    return SECRET


@pytest.fixture(autouse=True)
def _no_key_leaks(caplog: pytest.LogCaptureFixture, tmp_path: Path) -> Iterator[None]:
    """Every test captures every logger at DEBUG (the SDKs' too) and, afterwards, checks that the
    key is in no log record and in no file the test wrote (the cache lives under tmp_path)."""
    caplog.set_level(logging.DEBUG)
    yield
    formatter = logging.Formatter()
    for when in ("setup", "call"):
        for record in caplog.get_records(when):
            text = record.getMessage()
            if record.exc_info:
                text += formatter.formatException(record.exc_info)
            assert SECRET not in text, f"key leaked into the log: {record.name}"
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert SECRET not in path.read_text(encoding="utf-8", errors="replace"), path
