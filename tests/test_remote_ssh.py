"""`--executor ssh://...` against a real OpenSSH server: this test starts `sshd` on 127.0.0.1 with a
host key, a user key, a known_hosts and an ssh config it makes, and the remote command is this
Python's `-m optiml.cli worker`. The `optiml` command runs in a subprocess, as a user runs it."""

from __future__ import annotations

import json
import subprocess

import pytest

from optiml import __version__
from optiml.harness.gpu import local_gpus
from tests.sshd import SSHD, Sshd, free_port, keygen
from tests.support import FIXTURES, the_one_line
from tests.support import run_optiml as optiml

pytestmark = pytest.mark.skipif(
    SSHD is None, reason="OpenSSH's sshd is not installed (Debian: apt-get install openssh-server)"
)

SAXPY = str(FIXTURES / "saxpy.cu")


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    server = Sshd(tmp_path_factory.mktemp("sshd"))
    yield server
    server.stop()


def one_error_line(p: subprocess.CompletedProcess) -> str:
    line = the_one_line(p.stderr)
    assert line.startswith("optiml: error: "), line
    assert "Traceback" not in p.stdout
    return line.removeprefix("optiml: error: ")


@pytest.mark.parametrize("json_flag", [["--json"], []], ids=["json", "table"])
def test_check_over_ssh_prints_what_a_local_check_prints(sshd, json_flag):
    local = optiml("check", SAXPY, *json_flag, "--arch", "sm_90")
    remote = optiml(
        "check", SAXPY, *json_flag, "--arch", "sm_90", "--executor", sshd.url, env=sshd.env()
    )
    assert local.returncode == 0, local.stderr
    assert (remote.returncode, remote.stdout, remote.stderr) == (0, local.stdout, local.stderr)
    if json_flag:
        assert json.loads(remote.stdout)["kernels"][0]["kernel"] == "saxpy"


def test_an_error_over_ssh_is_the_error_a_local_run_gives(sshd, tmp_path):
    """A kernel that does not compile: exit 8 and the compiler's line, naming the user's file."""
    f = tmp_path / "k.cu"
    f.write_text((FIXTURES / "saxpy.cu").read_text().replace("y[i] =", "y[i] = undefined_name +"))
    local = optiml("check", str(f), "--json")
    remote = optiml("check", str(f), "--json", "--executor", sshd.url, env=sshd.env())
    assert local.returncode == 8
    assert (remote.returncode, remote.stdout, remote.stderr) == (8, local.stdout, local.stderr)
    assert one_error_line(remote).startswith(f"{f}:")
    # no kernel of that name: the worker's error, with its exit code, as one line
    remote = optiml("check", SAXPY, "-k", "saxpi", "--executor", sshd.url, env=sshd.env())
    assert remote.returncode == 4
    assert "did you mean `saxpy`?" in one_error_line(remote)


@pytest.mark.skipif(bool(local_gpus()), reason="compares the no-GPU line; this machine has a GPU")
def test_eval_over_ssh_without_a_gpu_there_says_what_it_says_here(sshd):
    local = optiml("eval", SAXPY, "-k", "saxpy", "--json")
    remote = optiml("eval", SAXPY, "-k", "saxpy", "--json", "--executor", sshd.url, env=sshd.env())
    assert local.returncode == 7  # this machine has no GPU, nor has the one sshd runs on
    assert (remote.returncode, remote.stdout, remote.stderr) == (7, local.stdout, local.stderr)


def test_an_unknown_host_key_is_one_line_that_says_how_to_accept_it(sshd, tmp_path):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    p = optiml("check", SAXPY, "--executor", sshd.url, env=sshd.env(OPTIML_KNOWN_HOSTS=str(empty)))
    assert p.returncode == 18
    line = one_error_line(p)
    assert f"the SSH host key of 127.0.0.1:{sshd.port} is not in {empty}" in line
    assert f"ssh-keyscan -p {sshd.port} 127.0.0.1 >> {empty}" in line


def test_a_changed_host_key_is_one_line_and_no_connection(sshd, tmp_path):
    other = keygen(tmp_path / "other_host_key")
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{sshd.port} {other}\n")
    p = optiml("check", SAXPY, "--executor", sshd.url, env=sshd.env(OPTIML_KNOWN_HOSTS=str(known)))
    assert p.returncode == 18
    line = one_error_line(p)
    assert "differs from the one recorded for it" in line
    assert f"ssh-keygen -R '[127.0.0.1]:{sshd.port}'" in line


def test_a_refused_connection_is_one_line(sshd):
    port = free_port()  # nothing listens there
    p = optiml("check", SAXPY, "--executor", f"ssh://127.0.0.1:{port}", env=sshd.env())
    assert p.returncode == 17
    assert one_error_line(p) == (
        f"cannot reach 127.0.0.1:{port} over SSH: connection refused (no SSH server listens on "
        "that port)"
    )


def test_a_missing_remote_optiml_is_one_line(sshd):
    env = sshd.env(OPTIML_REMOTE_COMMAND="optiml-is-not-installed-here worker")
    p = optiml("check", SAXPY, "--executor", sshd.url, env=env)
    assert p.returncode == 19
    line = one_error_line(p)
    assert "`optiml-is-not-installed-here worker` is not found on" in line
    assert "(exit 127)" in line and "OPTIML_REMOTE_COMMAND" in line


def test_another_version_on_the_remote_is_one_line(sshd, tmp_path):
    fake = tmp_path / "old-worker.sh"
    fake.write_text('echo \'{"optiml": "0.0.1", "gpus": []}\'\ncat > /dev/null\n')
    env = sshd.env(OPTIML_REMOTE_COMMAND=f"sh {fake}")
    p = optiml("check", SAXPY, "--executor", sshd.url, env=env)
    assert p.returncode == 19
    assert one_error_line(p) == (
        f"{sshd.user}@127.0.0.1:{sshd.port} runs OptiML 0.0.1 and this is OptiML {__version__}: "
        "install the same version on both machines"
    )


def test_a_bad_executor_url_is_a_usage_error():
    p = optiml("check", SAXPY, "--executor", "ftp://host")
    assert p.returncode == 2
    assert one_error_line(p).startswith("--executor: `ftp://host` names no executor")
    p = optiml("check", SAXPY, "--executor", "ssh://host:notaport")
    assert p.returncode == 2
    assert "is not an SSH address" in one_error_line(p)
