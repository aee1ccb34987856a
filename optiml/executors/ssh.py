"""`ssh://[user@]host[:port]`: jobs run by `optiml worker` on another machine, over SSH (asyncssh).

The connection honours `~/.ssh/config` (or the file `OPTIML_SSH_CONFIG` names: aliases, `User`,
`Port`, `IdentityFile`, `ProxyJump`), the agent and the default keys. Host keys are always verified,
against `~/.ssh/known_hosts` and `/etc/ssh/ssh_known_hosts` (or only the file `OPTIML_KNOWN_HOSTS`
names); a config's `UserKnownHostsFile` is not read, so that no config can turn the check off. The
remote side runs `OPTIML_REMOTE_COMMAND` (default `optiml worker`) through the login shell; its
hello must name this version of OptiML. Only requests and their results cross the connection.

Requests carry ids and are answered in any order, so the search's jobs share the one connection and
the one worker process (which runs one per GPU at a time). A connection lost while requests are in
flight is made again and those requests sent again, up to `RETRIES` times with a pause between
(`RETRY_DELAYS`); then the requests fail with one line (exit 17). A host key that changed meanwhile
or a worker that is no longer there is never retried. Closing the executor ends the worker's stdin:
the worker then kills every process group its jobs started and exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import warnings
from pathlib import Path
from urllib.parse import urlsplit

from pydantic import ValidationError

with warnings.catch_warnings():
    # cryptography 51 deprecates DSA, which asyncssh registers at import: without this, every
    # command would print that warning on stderr, whether or not any DSA key is in use
    warnings.filterwarnings("ignore", message="DSA is deprecated")
    import asyncssh

from optiml import __version__
from optiml.errors import (
    HostKeyNotTrusted,
    RemoteUnreachable,
    RemoteWorkerError,
    UsageError,
    quote,
)
from optiml.executors.protocol import Hello, Request, reported, result_of
from optiml.executors.work import WorkExecutor

DEFAULT_COMMAND = "optiml worker"
DEFAULT_KNOWN_HOSTS = ("~/.ssh/known_hosts", "/etc/ssh/ssh_known_hosts")
RETRIES = 3  # connections made again for a request whose connection was lost
RETRY_DELAYS = (1.0, 3.0, 9.0)  # seconds before each


class _Lost(Exception):
    """The connection (or the worker process) went away with requests in flight."""


def known_hosts_files() -> list[Path]:
    """The files host keys are checked against, the first being where a new key is added."""
    chosen = os.environ.get("OPTIML_KNOWN_HOSTS")
    return (
        [Path(chosen).expanduser()]
        if chosen
        else [Path(p).expanduser() for p in DEFAULT_KNOWN_HOSTS]
    )


class SshExecutor(WorkExecutor):
    def __init__(self, url: str):
        parts = urlsplit(url)
        try:
            port = parts.port
        except ValueError:
            port = -1
        if not parts.hostname or port == -1 or parts.password or parts.path not in ("", "/"):
            raise UsageError(
                f"--executor: `{quote(url, 60)}` is not an SSH address; write "
                "ssh://[user@]host[:port] (a host alias of ~/.ssh/config works)"
            )
        self.url = url
        self.user = parts.username
        self.host = parts.hostname
        self.port = port
        self.command = os.environ.get("OPTIML_REMOTE_COMMAND") or DEFAULT_COMMAND
        self._conn: asyncssh.SSHClientConnection | None = None
        self._proc: asyncssh.SSHClientProcess | None = None
        self._stderr_tail = ""
        self._drain: asyncio.Task | None = None
        self._reader: asyncio.Task | None = None
        self._lock = asyncio.Lock()
        self._pending: dict[int, asyncio.Future[dict]] = {}
        self._ids = itertools.count(1)
        self.connections = 0  # connections made (a lost one made again counts again)
        self.hello: Hello | None = None

    # ---- connecting ---------------------------------------------------------------------

    async def _options(self) -> asyncssh.SSHClientConnectionOptions:
        config = os.environ.get("OPTIML_SSH_CONFIG")
        files = [str(p) for p in known_hosts_files() if p.is_file()]
        return await asyncssh.SSHClientConnectionOptions.construct(
            config=[config] if config else (),
            host=self.host,
            port=self.port or (),
            username=self.user or (),
            known_hosts=files or b"",  # never None: that would turn the check off
        )

    async def _connect(self) -> asyncssh.SSHClientConnection:
        options = await self._options()
        host, port = options.host, options.port  # after ~/.ssh/config's HostName and Port
        where = f"{host}:{port}"
        try:
            return await asyncssh.connect(self.host, self.port or (), options=options)
        except asyncssh.HostKeyNotVerifiable:
            raise HostKeyNotTrusted(self._host_key_advice(host, port)) from None
        except asyncssh.PermissionDenied:
            raise RemoteUnreachable(
                f"{where} refused the SSH login as {options.username}: none of the keys offered "
                "(the agent's, ~/.ssh/id_*, IdentityFile in the ssh config) is accepted there"
            ) from None
        except asyncssh.Error as e:
            raise RemoteUnreachable(f"SSH to {where} failed: {e.reason}") from None
        except (TimeoutError, OSError) as e:
            if isinstance(e, ConnectionRefusedError):
                reason = "connection refused (no SSH server listens on that port)"
            elif isinstance(e, TimeoutError):
                reason = "timed out"
            else:
                reason = (getattr(e, "strerror", None) or str(e) or type(e).__name__).lower()
            raise RemoteUnreachable(f"cannot reach {where} over SSH: {reason}") from None

    def _host_key_advice(self, host: str, port: int) -> str:
        target = known_hosts_files()[0]
        scan = f"ssh-keyscan -p {port} {host}" if port != 22 else f"ssh-keyscan {host}"
        name = f"[{host}]:{port}" if port != 22 else host
        recorded = self._recorded(host, port)
        what = (
            f"the SSH host key of {host}:{port} differs from the one recorded for it"
            if recorded
            else f"the SSH host key of {host}:{port} is not in {target}"
        )
        fix = f"check its fingerprint (`{scan} | ssh-keygen -lf -`) with the machine's owner, then "
        if recorded:
            fix += (
                f"replace the old one: `ssh-keygen -R '{name}' -f {target} && {scan} >> {target}`"
            )
        else:
            fix += f"add it: `{scan} >> {target}`"
        return f"{what}; {fix}"

    def _recorded(self, host: str, port: int) -> bool:
        """Whether a known_hosts file has a key for the host (so a rejected key is a changed one)."""
        for path in known_hosts_files():
            with contextlib.suppress(Exception):
                if (
                    path.is_file()
                    and asyncssh.read_known_hosts(str(path)).match(
                        host, "", port if port != 22 else None
                    )[0]
                ):
                    return True
        return False

    async def _start(self) -> None:
        self._conn = await self._connect()
        where = self._where()
        try:
            self._proc = await self._conn.create_process(self.command, encoding="utf-8")
        except asyncssh.Error as e:
            raise RemoteUnreachable(f"{where} did not start `{self.command}`: {e.reason}") from None
        self._drain = asyncio.ensure_future(self._read_stderr())
        line = await self._proc.stdout.readline()
        if not line:
            status = await self._ended()
            if status == 127 or "not found" in self._stderr_tail:
                raise RemoteWorkerError(
                    f"`{self.command}` is not found on {where} (exit {status}): install OptiML "
                    f"{__version__} there, or set OPTIML_REMOTE_COMMAND to the command that runs "
                    "its worker (e.g. `/path/to/venv/bin/optiml worker`)"
                )
            raise RemoteWorkerError(
                f"`{self.command}` on {where} ended before saying hello (exit {status})"
                + self._last_words()
            )
        with contextlib.suppress(ValueError):
            first = json.loads(line)
            if isinstance(first, dict) and set(first) == {"error"}:
                raise reported(first["error"])  # the worker could not start (its executor)
        try:
            self.hello = Hello.model_validate_json(line)
        except ValidationError:
            raise RemoteWorkerError(
                f"`{self.command}` on {where} does not answer as an OptiML worker: its first line "
                f"is `{quote(line)}` (does a shell start-up file print something?)"
            ) from None
        if self.hello.optiml != __version__:
            raise RemoteWorkerError(
                f"{where} runs OptiML {self.hello.optiml} and this is OptiML {__version__}: "
                "install the same version on both machines"
            )

    async def _read_stderr(self) -> None:
        """Keeps the end of what the worker says on stderr (for messages), so it never blocks."""
        assert self._proc is not None
        with contextlib.suppress(Exception):
            while chunk := await self._proc.stderr.read(4096):
                self._stderr_tail = (self._stderr_tail + chunk)[-2000:]

    async def _ended(self) -> int | None:
        assert self._proc is not None
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._proc.wait_closed(), 10)
        if self._drain is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._drain, 5)
        return self._proc.exit_status

    def _last_words(self) -> str:
        lines = [line for line in self._stderr_tail.splitlines() if line.strip()]
        return f": {quote(lines[-1], 160)}" if lines else ""

    def _where(self) -> str:
        return f"{self.user + '@' if self.user else ''}{self.host}" + (
            f":{self.port}" if self.port else ""
        )

    # ---- running ------------------------------------------------------------------------

    async def run(self, request: Request) -> dict:
        return await self.submit(request)

    async def search_slots(self) -> int:
        async with self._lock:
            await self._ensure()
        assert self.hello is not None
        return self.hello.search_slots

    async def submit(self, request: Request) -> dict:
        """The request's result; a connection lost meanwhile is made again and the request sent
        again (`RETRIES` times), then `RemoteUnreachable`."""
        for attempt in range(RETRIES + 1):
            try:
                return await self._call(request)
            except _Lost as e:
                if attempt == RETRIES:
                    raise RemoteUnreachable(
                        f"lost the connection to {self._where()} {RETRIES + 1} times, the last: "
                        f"{e}; gave up"
                    ) from None
                await asyncio.sleep(RETRY_DELAYS[min(attempt, len(RETRY_DELAYS) - 1)])
        raise AssertionError("unreachable")

    async def _ensure(self) -> None:
        """A connection and a worker that said hello (the caller holds the lock). A connection
        made again that fails to reach the worker counts as lost; a host key or a worker that
        differs now is said as it is."""
        if self._proc is not None:
            return
        again = self.connections > 0
        self.connections += 1
        try:
            await self._start()
        except RemoteUnreachable as e:
            self._reset()
            if again:
                raise _Lost(e.message) from None
            raise
        except BaseException:
            self._reset()
            raise
        self._reader = asyncio.ensure_future(self._read_answers(self._proc))

    async def _call(self, request: Request) -> dict:
        async with self._lock:
            await self._ensure()
            proc = self._proc
            assert proc is not None
            ident = next(self._ids)
            answer: asyncio.Future[dict] = asyncio.get_running_loop().create_future()
            self._pending[ident] = answer
            try:
                proc.stdin.write(request.model_copy(update={"id": ident}).model_dump_json() + "\n")
            except (asyncssh.Error, OSError) as e:
                self._pending.pop(ident, None)
                self._lose(proc, f"{getattr(e, 'reason', None) or e}")
                raise _Lost(f"{getattr(e, 'reason', None) or e}") from None
        try:
            return result_of(await answer)
        except asyncio.CancelledError:
            # the caller (a search) no longer wants it: the worker drops the job
            if self._pending.pop(ident, None) is not None and proc is self._proc:
                with contextlib.suppress(Exception):
                    proc.stdin.write(json.dumps({"command": "cancel", "id": ident}) + "\n")
            raise

    async def _read_answers(self, proc: asyncssh.SSHClientProcess) -> None:
        """Hands each answer to the request with its id, until the worker or connection ends."""
        where = self._where()
        try:
            while line := await proc.stdout.readline():
                reply = _json(line, where)
                answer = self._pending.pop(reply.get("id"), None)  # type: ignore[arg-type]
                if answer is not None and not answer.done():
                    answer.set_result(reply)
            status = await self._ended()
            reason = f"the worker on {where} ended (exit {status})" + self._last_words()
        except asyncio.CancelledError:
            raise
        except RemoteWorkerError as e:
            reason = e.message
        except Exception as e:
            reason = f"{getattr(e, 'reason', None) or e or type(e).__name__}"
        self._lose(proc, reason)

    def _lose(self, proc: asyncssh.SSHClientProcess, reason: str) -> None:
        """The connection of `proc` is gone: its requests in flight fail as lost."""
        if proc is not self._proc:
            return
        pending, self._pending = self._pending, {}
        for answer in pending.values():
            if not answer.done():
                answer.set_exception(_Lost(reason))
        if self._conn is not None:
            self._conn.abort()
        self._reset()

    def _reset(self) -> None:
        if self._drain is not None:
            self._drain.cancel()
        self._proc, self._conn, self._drain, self._reader = None, None, None, None
        self._stderr_tail = ""

    async def close(self) -> None:
        if self._proc is not None:
            with contextlib.suppress(Exception):
                self._proc.stdin.write_eof()
                await asyncio.wait_for(self._proc.wait_closed(), 10)
        for task in (self._drain, self._reader):
            if task is not None:
                task.cancel()
        if self._conn is not None:
            self._conn.close()
            with contextlib.suppress(Exception):
                await self._conn.wait_closed()
        self._reset()


def _json(line: str, where: str) -> dict:
    try:
        reply = json.loads(line)
    except ValueError:
        reply = None
    if not isinstance(reply, dict):
        raise RemoteWorkerError(f"the worker on {where} answered with `{quote(line)}`, not JSON")
    return reply
