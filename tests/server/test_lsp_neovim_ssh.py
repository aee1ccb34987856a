"""A real editor with the GPU on another machine: headless Neovim runs "Optimize kernel" with the
server's `executor` setting at an `ssh://` URL, through a real OpenSSH sshd on 127.0.0.1 (its host
key checked against a known_hosts the test writes), to an accepted proposal.

Without a GPU the worker at the far end evaluates with the stand-in of tests/remote_stand_in.py
(real compiles, a fixed cost model); on a GPU it is `optiml worker` as a user runs it."""

from __future__ import annotations

import os
import sys

import pytest

from tests.server.test_lsp_neovim import NVIM, check_optimize_session, optimize_in_neovim
from tests.sshd import SSHD, Sshd, worker_command

pytestmark = [
    pytest.mark.skipif(NVIM is None, reason="Neovim 0.10+ not found (the dev extra)"),
    pytest.mark.skipif(
        SSHD is None,
        reason="OpenSSH's sshd is not installed (Debian: apt-get install openssh-server)",
    ),
]


@pytest.fixture
def sshd(tmp_path_factory):
    server = Sshd(tmp_path_factory.mktemp("sshd"))
    yield server
    server.stop()


def optimize_over_ssh(tmp_path, sshd: Sshd, **worker_env: str):
    env = sshd.env(
        OPTIML_REMOTE_COMMAND=worker_command(PATH=os.environ.get("PATH", ""), **worker_env)
    )
    return optimize_in_neovim(
        tmp_path,
        [sys.executable, "-m", "server"],
        540,
        env=env,
        settings={"executor": sshd.url},
    )


def test_neovim_optimizes_over_ssh_with_the_stand_in_at_the_far_end(tmp_path, sshd):
    seen, optimized = optimize_over_ssh(
        tmp_path, sshd, OPTIML_WORKER_EXECUTOR="tests.remote_stand_in:make"
    )
    check_optimize_session(seen, optimized)
    assert "optiml_pack" in seen["accepted"]  # the stand-in's fastest edit: 16-byte accesses


@pytest.mark.gpu
def test_neovim_optimizes_over_ssh_on_the_gpu(tmp_path, sshd):
    seen, optimized = optimize_over_ssh(tmp_path, sshd)
    check_optimize_session(seen, optimized)
