"""A real OpenSSH server for tests: `sshd` on 127.0.0.1 with a host key, a user key, a known_hosts
and an ssh config made for it; the remote command is this Python's `-m optiml.cli worker`."""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from tests.support import ROOT

SSHD = shutil.which("sshd", path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")


def keygen(path: Path) -> str:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "optiml-test", "-f", str(path)],
        check=True,
    )
    return path.with_suffix(".pub").read_text().strip()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_command(**env: str) -> str:
    """The remote command: this checkout's worker (and this process's PYTHONPATH after it), with
    the session's compile cache (tests/conftest.py) and `env`."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {"OPTIML_CACHE_DIR": os.environ["OPTIML_CACHE_DIR"], "PYTHONPATH": path, **env}
    assigned = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    return (
        f"cd {shlex.quote(str(ROOT))} && exec env {assigned} "
        f"{shlex.quote(sys.executable)} -m optiml.cli worker"
    )


class Sshd:
    def __init__(self, root: Path):
        self.root = root
        self.port = free_port()
        self.user = (
            os.environ.get("USER")
            or subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()
        )
        self.host_key = keygen(root / "host_key")
        keygen(root / "user_key")
        config = root / "sshd_config"
        config.write_text(
            f"Port {self.port}\n"
            "ListenAddress 127.0.0.1\n"
            f"HostKey {root / 'host_key'}\n"
            f"PidFile {root / 'sshd.pid'}\n"
            f"AuthorizedKeysFile {root / 'user_key.pub'}\n"
            "StrictModes no\n"
            "PermitRootLogin yes\n"
            "PubkeyAuthentication yes\n"
            "PasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\n"
            "UsePAM no\n"
        )
        if os.geteuid() == 0:  # sshd as root wants its privilege-separation folder
            Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        self.log = open(root / "sshd.log", "w")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(
            [SSHD, "-D", "-e", "-f", str(config)], stdout=self.log, stderr=subprocess.STDOUT
        )
        self._wait_ready()
        self.known_hosts = root / "known_hosts"
        self.known_hosts.write_text(f"[127.0.0.1]:{self.port} {self.host_key}\n")
        self.ssh_config = root / "ssh_config"
        self.ssh_config.write_text(
            f"Host *\n  IdentityFile {root / 'user_key'}\n  IdentitiesOnly yes\n"
        )

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sshd exited: {(self.root / 'sshd.log').read_text()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                    if s.recv(64).startswith(b"SSH-"):
                        return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("sshd did not start listening in 20 s")

    @property
    def url(self) -> str:
        return f"ssh://{self.user}@127.0.0.1:{self.port}"

    def env(self, **overrides: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != "SSH_AUTH_SOCK"}
        env.update(
            OPTIML_SSH_CONFIG=str(self.ssh_config),
            OPTIML_KNOWN_HOSTS=str(self.known_hosts),
            OPTIML_REMOTE_COMMAND=worker_command(),
        )
        env.update(overrides)
        return env

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()

    def connection_processes(self) -> list[int]:
        """The server's processes for its connections (its children)."""
        found = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == self.proc.pid:
                found.append(int(stat.parent.name))
        return found
