"""Every exit code the README documents, and every command's documented failures, tested.

First the table itself: the README's exit-code sentence, `optiml --help` and `optiml llm check
--help` list exactly `ExitCode`'s values and the LLM's (`LLMExitCode`), so none can drift from the
code. Then one row per failure: a real `python -m optiml.cli ...` in a process of its own, its exit
code, and its one line on stderr (exactly one that is not blank, no traceback) matched by a regex.

Codes that only a GPU's run gives (9 runtime error, 10 timeout, 11 wrong result, 13 profiling
failed, 15 an `in` buffer modified, 16 below the floor; 8 and 14 from `eval`, 8 and 11 from
`optimize`'s baseline) are tested twice: in process, with the GPU (or the run) stood in for and the
screen, nvcc and the CLI real; and as rows marked `gpu` that produce each for real, run where
there is a GPU. Code 1 (an internal error) is tests/test_cli.py's
`test_an_unexpected_exception_is_an_internal_error_in_one_line`.

The rows of this machine run side by side (each its own process) the first time one is asked
for: some 80 processes of about a second of imports each take over a minute one after another.
"""

from __future__ import annotations

import os
import re
import subprocess
import typing
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from click.testing import CliRunner

import optiml.api
import optiml.harness.evaluate
import optiml.profile.run
from optiml.cli import main
from optiml.errors import ExitCode
from optiml.executors.base import Executor
from optiml.harness.gpu import local_gpus
from optiml.harness.verdict import Status, Verdict
from optiml.llm.errors import LLMExitCode
from tests.sshd import SSHD, Sshd, free_port, keygen
from tests.support import FIXTURES, ROOT, run_optiml, the_one_line

# every row of this module on one xdist worker: the module's rows run side by side once, there
pytestmark = pytest.mark.xdist_group("exit_codes")

README = (ROOT / "README.md").read_text()
SAXPY = FIXTURES / "saxpy.cu"
BROKEN = FIXTURES / "broken"

# What each code means, in words the README's sentence and `--help` both use for it: a code added
# to the enums fails the tests below until the README, --help and this table say what it is.
MEANINGS: dict[int, str] = {
    ExitCode.OK: r"ok",
    ExitCode.INTERNAL: r"internal error",
    ExitCode.USAGE: r"usage",
    ExitCode.FILE: r"file missing",
    ExitCode.NO_KERNEL: r"no such kernel",
    ExitCode.BAD_SPEC: r"bad spec",
    ExitCode.NO_NVCC: r"nvcc",
    ExitCode.NO_GPU: r"GPU",
    ExitCode.COMPILE_ERROR: r"compile error",
    ExitCode.RUNTIME_ERROR: r"runtime error",
    ExitCode.TIMEOUT: r"timeout",
    ExitCode.WRONG_RESULT: r"wrong result",
    ExitCode.NO_NCU: r"ncu",
    ExitCode.PROFILE_FAILED: r"profiling failed",
    ExitCode.FORBIDDEN_CODE: r"forbidden code",
    ExitCode.MODIFIED_INPUT: r"`in` buffer modified",
    ExitCode.BELOW_FLOOR: r"physical floor",
    ExitCode.REMOTE_UNREACHABLE: r"unreachable",
    ExitCode.HOST_KEY_NOT_TRUSTED: r"host key not trusted",
    ExitCode.REMOTE_WORKER: r"`optiml worker`",
    ExitCode.BAD_FORMULA: r"bad formula",
    LLMExitCode.NO_KEY: r"no API key",
    LLMExitCode.AUTH_FAILED: r"key rejected|authentication failed",
    LLMExitCode.UNREACHABLE: r"unreachable",
    LLMExitCode.LLM_ERROR: r"other LLM",
}
ALL_CODES = {int(c) for c in ExitCode} | {int(c) for c in LLMExitCode}


def _without_parentheses(text: str) -> str:
    while (flat := re.sub(r"\([^()]*\)", "", text)) != text:
        text = flat
    return text


def _items(text: str) -> dict[int, str]:
    """`0 ok, 2 usage, ...; 17 ...` as {code: meaning}; what is in parentheses left out."""
    flat = _without_parentheses(" ".join(text.split()))
    return {int(n): m.strip() for n, m in re.findall(r"(?:^|[,;:])\s*(\d+)\s+([^,;:]+)", flat)}


def readme_codes() -> dict[int, str]:
    """The README's sentence: each code and its meaning; the LLM's range as `the LLM's`."""
    start = README.index("Bad input gets one line on stderr and its own exit code:")
    end = README.index("`--arch` takes any", start)
    sentence = README[start:end].split(":", 1)[1]
    codes = _items(sentence)
    for lo, hi in re.findall(r"(\d+)–(\d+) are the LLM's", sentence):
        codes.update({c: "the LLM's" for c in range(int(lo), int(hi) + 1)})
    return codes


def help_codes(*command: str) -> dict[int, str]:
    r = CliRunner().invoke(main, [*command, "--help"], terminal_width=100)
    assert r.exit_code == 0, r.output
    text = r.output.split("Exit codes:", 1)[1].split("Options:", 1)[0]
    return _items(text)


def test_the_readme_documents_exactly_the_codes_the_code_has():
    documented = readme_codes()
    assert set(documented) == ALL_CODES
    assert set(MEANINGS) == ALL_CODES
    for code, meaning in documented.items():
        if code in set(LLMExitCode):
            assert meaning == "the LLM's"  # docs/llm.md says each
        else:
            assert re.search(MEANINGS[code], meaning), (code, meaning)


def test_optiml_help_lists_every_code_with_its_meaning():
    listed = help_codes()
    assert set(listed) == ALL_CODES
    for code, meaning in listed.items():
        assert re.search(MEANINGS[code], meaning), (code, meaning)
    # each command's help has the same list (`optiml llm check --help` the LLM's, below)
    for command in ("check", "eval", "profile", "optimize", "spec", "lift", "generate"):
        assert help_codes(command) == listed


def test_llm_check_help_lists_the_llm_codes():
    listed = help_codes("llm", "check")
    assert set(listed) == {0} | {int(c) for c in LLMExitCode}
    for code in LLMExitCode:
        assert re.search(MEANINGS[code], listed[code]), (code, listed[code])


# ---- one row per failure, each a real `optiml` in a process of its own --------------------------


@dataclass(frozen=True)
class Row:
    """`optiml ARGS` exits `code` with one line on stderr: `prefix` and then what `line` matches
    (from its start). ARGS, the environment and `line` may name the files and servers the rows
    share: {T} (a folder of files written for them), {S} (fixtures/saxpy.cu), {B} (fixtures/broken),
    {url} and {sshd_port} (an sshd's), {port} (one nothing listens on), {llm} (a scripted LLM
    server's URL); in `line` they stand for themselves, escaped."""

    failure: str
    args: tuple[str, ...]
    code: int
    line: str
    env: dict[str, str] = field(default_factory=dict)
    prefix: str = "optiml: error: "
    sshd: bool = False  # needs the sshd
    no_gpu: bool = False  # the failure is that this machine has no GPU

    @property
    def id(self) -> str:
        return f"{self.code}-{self.args[0]}-{self.failure}"

    def skip_reason(self) -> str | None:
        if self.sshd and SSHD is None:
            return "OpenSSH's sshd is not installed (Debian: apt-get install openssh-server)"
        if self.no_gpu and local_gpus():
            return "this machine has a GPU; the row is about one without"
        return None


def R(failure: str, args: str | list[str], code: int, line: str, **kw) -> Row:
    return Row(failure, tuple(args.split() if isinstance(args, str) else args), code, line, **kw)


NO_NVCC = {"OPTIML_NVCC": "/nonexistent/bin/nvcc"}
FAKE_NCU = {"OPTIML_NCU": "{T}/failing-ncu"}
FORMULA = "float x[N]; y[i] = x[i]"
ACCEPTS = r"nvcc [\d.]+ accepts sm_\d+"
NOT_A_TARGET = r"--arch: `banana` is not a GPU target; " + ACCEPTS
NOT_NVCCS = r"--arch: nvcc [\d.]+ cannot compile for `sm_10`; " + ACCEPTS
NO_GPU = r"no NVIDIA GPU found: `optiml {cmd}` runs kernels and needs one"
NATIVE = r"--arch native takes the local GPU's architecture, and NVML finds no NVIDIA GPU here"
UNREACHABLE = r"cannot reach 127\.0\.0\.1:{port} over SSH: connection refused"
UNKNOWN_KEY = r"the SSH host key of 127\.0\.0\.1:{sshd_port} is not in {T}/known_hosts_empty"
CHANGED_KEY = r"the SSH host key of .*127\.0\.0\.1.*{sshd_port}.* differs from the one recorded"
NO_WORKER = r"`optiml-is-not-installed-here worker` is not found on"
OLD_WORKER = r".*@127\.0\.0\.1:{sshd_port} runs OptiML 0\.0\.1 and this is OptiML "
NO_LLM_KEY = r"no API key for openai: set OPTIML_LLM_API_KEY or OPENAI_API_KEY$"
LLM = ["--policy", "llm", "--provider", "openai", "--model", "gpt-4o"]

ROWS: list[Row] = [
    # 2: usage
    R("arch-banana", "check {S} --arch banana", 2, NOT_A_TARGET),
    R("arch-nvcc-lacks", "eval {S} -k saxpy --arch sm_10", 2, NOT_NVCCS),
    R("arch-nvcc-lacks", "profile {S} -k saxpy --arch sm_10", 2, NOT_NVCCS),
    R("arch-banana", "optimize {S} -k saxpy --arch banana", 2, NOT_A_TARGET),
    R("arch-nvcc-lacks", ["generate", FORMULA, "--arch", "sm_10", "--out", "{T}/g-arch"], 2, NOT_NVCCS),
    R("gpus", "optimize {S} -k saxpy --gpus x", 2, r"--gpus takes `all` or GPU indices like `0,1`, not `x`$"),
    R("budget", "optimize {S} -k saxpy --budget 0", 2, r"Invalid value for '--budget': 0 is not in the range x>=1; see `"),
    R("timeout", "eval {S} -k saxpy --timeout 0", 2, r"Invalid value for '--timeout'"),
    R("executor-scheme", "check {S} --executor ftp://host", 2, r"--executor: `ftp://host` names no executor; use one of `local`, `ssh`, `ray`"),
    R("executor-port", "eval {S} -k saxpy --executor ssh://host:notaport", 2, r"--executor: `ssh://host:notaport` is not an SSH address"),
    R("executor-twice", "optimize {S} -k saxpy --executor local,local", 2, r"--executor names `local,local`: each executor once$"),
    R("executor-scheme", ["generate", FORMULA, "--out", "{T}/g-executor", "--executor", "ftp://host"], 2, r"--executor: `ftp://host` names no executor"),
    R("remote-arch", "profile {S} -k saxpy --executor ssh://127.0.0.1:{port} --arch sm_90", 2, r"--arch and --clock-control apply to `--executor local`"),
    R("include-dir", "check {S} -I /nonexistent/include", 2, r"-I /nonexistent/include: no such directory$"),
    R("compile-commands", "check {S} --compile-commands {T}/db/compile_commands.json", 2, r"{T}/db/compile_commands\.json:1:2: not JSON"),
    R("no-formula", "generate", 2, r"missing FORMULA \(or --from-torch TASK\.py\); see `"),
    R("no-kernel-option", "spec {S}", 2, r"Missing option '--kernel' / '-k'; see `"),
    R("no-kernel-option", "lift {S}", 2, r"Missing option '--kernel' / '-k'; see `"),
    R("stdio-and-tcp", "serve --stdio --tcp 2087", 2, r"--stdio and --tcp exclude each other; see `"),
    R("extra-argument", "worker extra", 2, r"Got unexpected extra argument \(extra\); see `"),
    R("timeout", "llm check --timeout 0", 2, r"Invalid value for '--timeout'"),
    R("no-command", "nonsense", 2, r"No such command 'nonsense'; see `"),
    # 3: a file missing, or a folder
    R("missing", "check {T}/nope.cu", 3, r"no such file: {T}/nope\.cu$"),
    R("folder", "eval {T}/folder -k saxpy", 3, r"{T}/folder is a directory, not a \.cu file$"),
    R("missing-candidate", "eval {S} -k saxpy --candidate {T}/nope.cu", 3, r"no such file: {T}/nope\.cu$"),
    R("missing", "profile {T}/nope.cu -k saxpy", 3, r"no such file: {T}/nope\.cu$"),
    R("folder", "optimize {T}/folder -k saxpy", 3, r"{T}/folder is a directory, not a \.cu file$"),
    R("missing", "spec {T}/nope.cu -k saxpy", 3, r"no such file: {T}/nope\.cu$"),
    R("folder", "lift {T}/folder -k saxpy", 3, r"{T}/folder is a directory, not a \.cu file$"),
    R("missing-line-file", "generate {T}/nope.cu --line 1", 3, r"{T}/nope\.cu: no such file \(with --line, FORMULA is a \.cu file\)$"),
    R("missing-torch-file", "generate --from-torch {T}/nope.py", 3, r"no such file: {T}/nope\.py \(--from-torch reads a PyTorch module\)$"),
    # 4: no such kernel, or an empty file
    R("misspelt", "check {S} -k saxpi", 4, r"no kernel `saxpi` in {S}; did you mean `saxpy`\?$"),
    R("empty-file", "check {T}/empty.cu", 4, r"no kernel in {T}/empty\.cu: it defines no __global__ function$"),
    R("empty-file", "eval {T}/empty.cu -k saxpy", 4, r"no kernel in {T}/empty\.cu"),
    R("not-in-candidate", "eval {S} -k saxpy --candidate {FIXTURES}/softmax.cu", 4, r"no kernel `saxpy` in {FIXTURES}/softmax\.cu; kernels here: softmax_rows$"),
    R("misspelt", "profile {S} -k saxpi", 4, r"no kernel `saxpi` in {S}; did you mean `saxpy`\?$"),
    R("empty-file", "optimize {T}/empty.cu -k saxpy", 4, r"no kernel in {T}/empty\.cu"),
    R("misspelt", "spec {S} -k saxpi", 4, r"no kernel `saxpi` in {S}"),
    R("empty-file", "lift {T}/empty.cu -k saxpy", 4, r"no kernel in {T}/empty\.cu"),
    # 5: a bad spec, at its line and column; `check`'s table lists each issue as it is
    R("bad-type", "check {T}/badspec.cu --arch sm_90", 5, r"{T}/badspec\.cu:9:48: spec error: unknown element type `flaot`; use one of: ", prefix=""),
    R("bad-type-json", "check {T}/badspec.cu --arch sm_90 --json", 5, r"{T}/badspec\.cu:9:48: unknown element type `flaot`"),
    R("bad-type", "eval {T}/badspec.cu -k saxpy", 5, r"{T}/badspec\.cu:9:48: unknown element type `flaot`"),
    R("bad-type", "profile {T}/badspec.cu -k saxpy", 5, r"{T}/badspec\.cu:9:48: unknown element type `flaot`"),
    R("bad-type", "optimize {T}/badspec.cu -k saxpy", 5, r"{T}/badspec\.cu:9:48: unknown element type `flaot`"),
    R("bad-type", "lift {T}/badspec.cu -k saxpy", 5, r"{T}/badspec\.cu:9:48: unknown element type `flaot`"),
    # 6: no nvcc
    R("no-nvcc", "check {S}", 6, r"nvcc not found: OPTIML_NVCC=/nonexistent/bin/nvcc is not a file$", env=NO_NVCC),
    R("no-nvcc", "eval {S} -k saxpy", 6, r"nvcc not found: OPTIML_NVCC=", env=NO_NVCC),
    R("no-nvcc", "profile {S} -k saxpy", 6, r"nvcc not found: OPTIML_NVCC=", env=NO_NVCC),
    R("no-nvcc", "optimize {S} -k saxpy", 6, r"nvcc not found: OPTIML_NVCC=", env=NO_NVCC),
    R("no-nvcc", ["generate", FORMULA, "--out", "{T}/g-nvcc"], 6, r"nvcc not found: OPTIML_NVCC=", env=NO_NVCC),
    # 7: no GPU
    R("no-gpu", "eval {S} -k saxpy", 7, NO_GPU.format(cmd="eval"), no_gpu=True),
    R("no-gpu", "profile {S} -k saxpy", 7, NO_GPU.format(cmd="profile"), env=FAKE_NCU, no_gpu=True),
    R("no-gpu", "optimize {S} -k saxpy", 7, NO_GPU.format(cmd="optimize"), no_gpu=True),
    R("gpus-not-there", "optimize {S} -k saxpy --gpus 99", 7, r"--gpus: no GPU 99 on this machine"),
    R("arch-native", "check {S} --arch native", 7, NATIVE, no_gpu=True),
    R("arch-native", "eval {S} -k saxpy --arch native --json", 7, NATIVE, no_gpu=True),
    # 8: a compile error (`eval`, `profile` and `optimize` compile on a GPU: below)
    R("compile-error", "check {B}/compile_error.cu", 8, r'{B}/compile_error\.cu:16:\d+: error: identifier "idx" is undefined$', prefix=""),
    R("compile-error-json", "check {B}/compile_error.cu --json", 8, r'{B}/compile_error\.cu:16:\d+: identifier "idx" is undefined$'),
    # 12: no ncu
    R("no-ncu", "profile {S} -k saxpy", 12, r"ncu \(Nsight Compute\) not found: OPTIML_NCU=/nonexistent/ncu is not a file$", env={"OPTIML_NCU": "/nonexistent/ncu"}),
    # 17, 18, 19: the machine of --executor
    R("refused", "check {S} --executor ssh://127.0.0.1:{port}", 17, UNREACHABLE),
    R("refused", "eval {S} -k saxpy --executor ssh://127.0.0.1:{port}", 17, UNREACHABLE),
    R("refused", "profile {S} -k saxpy --executor ssh://127.0.0.1:{port}", 17, UNREACHABLE),
    R("refused", "optimize {S} -k saxpy --executor ssh://127.0.0.1:{port}", 17, UNREACHABLE),
    R("refused", ["generate", FORMULA, "--out", "{T}/g17", "--json", "--executor", "ssh://127.0.0.1:{port}"], 17, UNREACHABLE),
    R("unknown-key", "check {S} --executor {url}", 18, UNKNOWN_KEY, env={"OPTIML_KNOWN_HOSTS": "{T}/known_hosts_empty"}, sshd=True),
    R("changed-key", "eval {S} -k saxpy --executor {url}", 18, CHANGED_KEY, env={"OPTIML_KNOWN_HOSTS": "{T}/known_hosts_other"}, sshd=True),
    R("unknown-key", "optimize {S} -k saxpy --executor {url}", 18, UNKNOWN_KEY, env={"OPTIML_KNOWN_HOSTS": "{T}/known_hosts_empty"}, sshd=True),
    R("no-worker", "check {S} --executor {url}", 19, NO_WORKER, env={"OPTIML_REMOTE_COMMAND": "optiml-is-not-installed-here worker"}, sshd=True),
    R("other-version", "eval {S} -k saxpy --executor {url}", 19, OLD_WORKER, env={"OPTIML_REMOTE_COMMAND": "sh {T}/old-worker.sh"}, sshd=True),
    R("no-worker", "profile {S} -k saxpy --executor {url}", 19, NO_WORKER, env={"OPTIML_REMOTE_COMMAND": "optiml-is-not-installed-here worker"}, sshd=True),
    R("no-worker", "optimize {S} -k saxpy --executor {url}", 19, NO_WORKER, env={"OPTIML_REMOTE_COMMAND": "optiml-is-not-installed-here worker"}, sshd=True),
    # 20-23: the LLM's (`llm check` says `error: ...`, as docs/llm.md has it)
    R("no-key", "llm check --provider openai --model gpt-4o", 20, NO_LLM_KEY, prefix="error: "),
    R("key-rejected", "llm check --provider openai --model gpt-4o --base-url {llm}/v1", 21, r".*\(401\)", env={"OPENAI_API_KEY": "sk-test-not-a-real-key-0123456789"}, prefix="error: "),
    R("unreachable", "llm check --provider openai --model gpt-4o --base-url http://127.0.0.1:{port}/v1 --timeout 5", 22, r"cannot reach", env={"OPENAI_API_KEY": "sk-test-not-a-real-key-0123456789"}, prefix="error: "),
    R("bad-setting", "llm check", 23, r"invalid LLM setting `timeout_s`", env={"OPTIML_LLM_PROVIDER": "openai", "OPTIML_LLM_TIMEOUT_S": "0"}, prefix="error: "),
    R("llm-no-key", ["optimize", "{S}", "-k", "saxpy", *LLM], 20, NO_LLM_KEY),
    R("llm-no-model", "optimize {S} -k saxpy --policy llm --provider openai-compatible", 23, r"invalid LLM settings: no model is configured for provider openai-compatible"),
    R("prose-llm-no-key", ["generate", "fused bias and GELU over a bf16 tensor", "--out", "{T}/g-prose-key"], 20, NO_LLM_KEY, env={"OPTIML_LLM_PROVIDER": "openai", "OPTIML_LLM_MODEL": "gpt-4o"}),
    # 24: a bad formula (and prose with no LLM configured)
    R("ends-early", ["generate", FORMULA + " +", "--out", "{T}/g-ends"], 24, r"<formula>:1:26: the formula ends too early; expected "),
    R("unknown-function", ["generate", "float x[N]; y[i] = foo(x[i])", "--out", "{T}/g-function"], 24, r"<formula>:1:20: unknown function `foo`; functions: exp, "),
    R("prose-no-llm", ["generate", "fused bias and GELU over a bf16 tensor", "--out", "{T}/g-prose"], 24, r"<formula>:1:\d+: .*read as a task in prose, it needs an LLM and none is configured"),
    R("in-a-comment", "generate {T}/formula.cu --line 2", 24, r"{T}/formula\.cu:2:29: the formula ends too early"),
    # 0: a file that is not UTF-8 is read, with one warning
    R("not-utf8", "check {T}/latin1.cu --arch sm_90", 0, r"{T}/latin1\.cu is not UTF-8 \(byte 0xe9 at offset 6 does not decode\): read with U\+FFFD in place of each such byte$", prefix="optiml: warning: "),
    R("not-utf8", "lift {T}/latin1.cu -k saxpy", 0, r"{T}/latin1\.cu is not UTF-8 \(byte 0xe9", prefix="optiml: warning: "),
]  # fmt: skip

FORBIDDEN = '\n#include <cstdlib>\nstatic int sneak = std::system("true");\n'
WRITES_X = """
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { y[i] = a * x[i] + y[i]; const_cast<float*>(x)[i] = 0.0f; }
"""


def saxpy_with_body(body: str) -> str:
    text = SAXPY.read_text()
    start = text.index("{", text.index("__global__ void saxpy"))
    end = text.index("}", start)
    return text[:start] + "{" + body + text[end:]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    """The files the rows name as {T}/...: written once."""
    t = tmp_path_factory.mktemp("exit-codes")
    (t / "folder").mkdir()
    (t / "empty.cu").write_text("")
    (t / "badspec.cu").write_text(SAXPY.read_text().replace("inout float[n]", "inout flaot[n]"))
    (t / "latin1.cu").write_bytes(b"// caf\xe9 (Latin-1)\n" + SAXPY.read_bytes())
    (t / "db").mkdir()
    (t / "db" / "compile_commands.json").write_text("{not json\n")
    (t / "formula.cu").write_text(f"#include <cuda_runtime.h>\n// {FORMULA} +\n")
    (t / "forbidden.cu").write_text(SAXPY.read_text() + FORBIDDEN)
    (t / "writes_x.cu").write_text(saxpy_with_body(WRITES_X))
    (t / "old-worker.sh").write_text('echo \'{"optiml": "0.0.1", "gpus": []}\'\ncat > /dev/null\n')
    (t / "known_hosts_empty").write_text("")
    (t / "ssh_config").write_text("")
    ncu = t / "failing-ncu"  # an ncu that cannot profile anything
    ncu.write_text("#!/bin/sh\necho '==ERROR== a stand-in ncu that profiles nothing' >&2\nexit 1\n")
    ncu.chmod(0o755)
    return t


def base_env(t: Path) -> dict[str, str]:
    """This machine's environment without the user's LLM settings, SSH agent, config and known
    hosts, with this checkout first on the path (the rows run in {T}, not here)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("OPTIML_LLM_")
        and k not in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "SSH_AUTH_SOCK")
        and k != "PYTHONDONTWRITEBYTECODE"
    }
    # the rows' compiled bytecode kept for the rows after them (a third of each one's time), in {T}
    env["PYTHONPYCACHEPREFIX"] = str(t / "pycache")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env["OPTIML_SSH_CONFIG"] = str(t / "ssh_config")
    env["OPTIML_KNOWN_HOSTS"] = str(t / "known_hosts_empty")
    return env


def selected_rows(request, rows: list[Row]) -> list[Row]:
    """The rows of `rows` whose tests this session runs (all, unless -k or a node id says)."""
    ids = {
        item.callspec.params["row"].id
        for item in request.session.items
        if item.module is request.module
        and hasattr(item, "callspec")
        and isinstance(item.callspec.params.get("row"), Row)
    }
    return [r for r in rows if r.id in ids and r.skip_reason() is None]


@dataclass
class Ran:
    names: dict[str, str]  # what {T}, {S}, {url}... stand for
    processes: dict[str, subprocess.CompletedProcess]  # by row id


@pytest.fixture(scope="module")
def ran(request, files) -> Ran:
    """Every selected row's process, run side by side."""
    from tests.llm.conftest import FakeServer

    rows = selected_rows(request, ROWS)
    names = {"T": str(files), "S": str(SAXPY), "B": str(BROKEN), "FIXTURES": str(FIXTURES)}
    names["port"] = str(free_port())  # nothing listens there
    sshd = None
    if any(r.sshd for r in rows):
        (files / "sshd").mkdir()
        sshd = Sshd(files / "sshd")
    llm = FakeServer()
    llm.responder = lambda _: FakeServer.openai_error(
        401, "Incorrect API key provided", code="invalid_api_key"
    )
    names["llm"] = llm.url
    if sshd is not None:
        (files / "known_hosts_other").write_text(
            f"[127.0.0.1]:{sshd.port} {keygen(files / 'other_host_key')}\n"
        )
        names.update(url=sshd.url, sshd_port=str(sshd.port))

    def run(row: Row) -> subprocess.CompletedProcess:
        env = base_env(files)
        if row.sshd:
            env.update(sshd.env())
        env.update({k: v.format(**names) for k, v in row.env.items()})
        args = [a.format(**names) for a in row.args]
        return run_optiml(*args, env=env, cwd=files, timeout=180)

    try:
        # one process first, which leaves the bytecode of what every row imports in {T}/pycache
        run_optiml("--version", env=base_env(files), cwd=files).check_returncode()
        with ThreadPoolExecutor(max_workers=4) as pool:
            processes = dict(zip([r.id for r in rows], pool.map(run, rows), strict=True))
    finally:
        llm.stop()
        if sshd is not None:
            sshd.stop()
    return Ran(names, processes)


def assert_row(row: Row, p: subprocess.CompletedProcess, names: dict[str, str]) -> None:
    where = f"optiml {' '.join(row.args)}: exit {p.returncode}\nstderr: {p.stderr}"
    assert p.returncode == row.code, where
    line = the_one_line(p.stderr)
    assert line.startswith(row.prefix), where
    pattern = row.line.format(**{k: re.escape(v) for k, v in names.items()})
    assert re.match(pattern, line.removeprefix(row.prefix)), f"{pattern!r}\n{where}"


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_each_failure_is_its_exit_code_and_one_line(row, ran):
    if why := row.skip_reason():
        pytest.skip(why)
    assert_row(row, ran.processes[row.id], ran.names)


# ---- on a GPU, for real ---------------------------------------------------------------------------

GPU_ROWS: list[Row] = [
    R("compile-error", "eval {B}/compile_error.cu -k leaky_relu --json", 8, r'compile_error leaky_relu: {B}/compile_error\.cu:16:\d+: error: identifier "idx" is undefined'),
    R("compile-error", "profile {B}/compile_error.cu -k leaky_relu", 8, r"the kernel does not compile: {B}/compile_error\.cu:16:", env=FAKE_NCU),
    R("compile-error", "optimize {B}/compile_error.cu -k leaky_relu --budget 1 --no-sanitize --out {T}/o8", 8, r"the input itself does not pass its checks: {B}/compile_error\.cu:16:"),
    R("out-of-bounds", "eval {B}/out_of_bounds.cu -k shift_left --no-time --json", 9, r"runtime_error shift_left: "),
    R("infinite-loop", "eval {B}/infinite_loop.cu -k wait_and_scale --timeout 10 --no-time --json", 10, r"timeout wait_and_scale: "),
    R("wrong-formula", "eval {B}/wrong_result.cu -k moving_avg3_smem --no-time --json", 11, r"wrong_result moving_avg3_smem: "),
    R("wrong-formula", "optimize {B}/wrong_result.cu -k moving_avg3_smem --budget 1 --no-sanitize --out {T}/o11", 11, r"the input itself does not pass its checks: "),
    R("ncu-fails", "profile {S} -k saxpy", 13, r"ncu could not profile the kernel: a stand-in ncu that profiles nothing$", env=FAKE_NCU),
    R("host-code", "eval {S} -k saxpy --candidate {T}/forbidden.cu --json", 14, r"forbidden_code saxpy: {T}/forbidden\.cu:\d+:\d+: "),
    R("writes-x", "eval {S} -k saxpy --candidate {T}/writes_x.cu --json", 15, r"modified_input saxpy: .*`x`"),
]  # fmt: skip
# 16 (below the physical floor) needs a kernel faster than its own memory traffic allows, which
# the checks before it catch first: the in-process rows below and tests/test_floor.py test it.


@pytest.mark.gpu
@pytest.mark.parametrize("row", GPU_ROWS, ids=[r.id for r in GPU_ROWS])
def test_each_failure_of_a_run_on_the_gpu_is_its_exit_code_and_one_line(row, files):
    names = {"T": str(files), "S": str(SAXPY), "B": str(BROKEN), "FIXTURES": str(FIXTURES)}
    env = {**base_env(files), **{k: v.format(**names) for k, v in row.env.items()}}
    p = run_optiml(*(a.format(**names) for a in row.args), env=env, cwd=files, timeout=600)
    assert_row(row, p, names)


# ---- in process: the verdict's status is the exit code --------------------------------------------

STATUS_CODES = {
    "ok": 0,
    "compile_error": 8,
    "runtime_error": 9,
    "timeout": 10,
    "wrong_result": 11,
    "forbidden_code": 14,
    "modified_input": 15,
    "below_floor": 16,
}


def verdict(status: str, message: str = "what the check found") -> Verdict:
    return Verdict(
        status=status,
        message=message,
        file=str(SAXPY),
        kernel="saxpy",
        reference=f"saxpy in {SAXPY}",
        arch="sm_90",
        nvcc_version="13.0.88",
        date="2026-12-04T00:00:00+00:00",
    )


def invoke(*args: str):
    r = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert "Traceback" not in r.output
    return r


def test_every_status_has_its_code():
    assert set(typing.get_args(Status)) == set(STATUS_CODES)
    assert set(STATUS_CODES.values()) - {0} <= {int(c) for c in ExitCode}


@pytest.mark.parametrize("status", STATUS_CODES)
def test_eval_exits_with_its_verdicts_code(status, monkeypatch):
    monkeypatch.setattr(optiml.harness.evaluate, "find_toolkit", lambda: None)
    monkeypatch.setattr(optiml.harness.evaluate, "require_gpu", lambda command: None)
    monkeypatch.setattr(optiml.harness.evaluate, "evaluate", lambda *a, **kw: verdict(status))
    r = invoke("eval", str(SAXPY), "-k", "saxpy", "--json")
    assert r.exit_code == STATUS_CODES[status]
    if status == "ok":
        assert r.stderr == ""
    else:  # the details in the JSON; one line on stderr, as `check --json` has it
        assert the_one_line(r.stderr) == f"optiml: error: {status} saxpy: what the check found"
    r = invoke("eval", str(SAXPY), "-k", "saxpy")
    assert r.exit_code == STATUS_CODES[status]
    assert r.stdout.startswith(f"{status} saxpy: what the check found\n")


class FailingInput(Executor):
    """An executor on which the input itself gets `status`."""

    def __init__(self, status: str):
        self.status = status

    @property
    def slots(self) -> int:
        return 1

    async def evaluate(self, job, options, *, pinned=False) -> Verdict:
        return verdict(self.status, "y[3] is 1, expected 2")

    async def profile(self, job, *, full=False):
        raise AssertionError("a failed input is not profiled")

    async def sanitize(self, job, tool, sizes=None):
        raise AssertionError("a failed input is not sanitized")


@pytest.mark.parametrize("status", [s for s in STATUS_CODES if s != "ok"])
def test_optimize_of_an_input_that_fails_its_own_checks_exits_with_its_verdicts_code(
    status, monkeypatch, tmp_path
):
    monkeypatch.setattr(optiml.api, "find_toolkit", lambda: None)
    monkeypatch.setattr(optiml.api, "_search_executor", lambda url, gpus: FailingInput(status))
    r = invoke("optimize", str(SAXPY), "-k", "saxpy", "--out", str(tmp_path))
    assert r.exit_code == STATUS_CODES[status]
    assert the_one_line(r.stderr) == (
        "optiml: error: the input itself does not pass its checks: y[3] is 1, expected 2"
    )


# ---- in process, with only the GPU stood in for: the screen, nvcc and ncu's failure are real -----


@pytest.fixture
def no_gpu_needed(monkeypatch):
    """`eval` and `profile` past their GPU check; the runner is never started."""
    monkeypatch.setattr(optiml.harness.evaluate, "require_gpu", lambda command: None)
    monkeypatch.setattr(optiml.profile.run, "require_gpu", lambda command: None)
    monkeypatch.setattr(optiml.harness.evaluate, "runner_binary", lambda: Path("/bin/false"))


def test_a_candidate_with_host_code_is_refused_by_the_screen_before_anything_runs(
    files, no_gpu_needed
):
    r = invoke("eval", str(SAXPY), "-k", "saxpy", "--candidate", str(files / "forbidden.cu"))
    assert r.exit_code == 14
    assert r.stdout.startswith(f"forbidden_code saxpy: {files / 'forbidden.cu'}:")
    r = invoke(
        "eval", str(SAXPY), "-k", "saxpy", "--candidate", str(files / "forbidden.cu"), "--json"
    )
    assert r.exit_code == 14
    assert the_one_line(r.stderr).startswith(
        f"optiml: error: forbidden_code saxpy: {files / 'forbidden.cu'}:"
    )


def test_eval_of_a_kernel_that_does_not_compile_exits_8(no_gpu_needed):
    f = BROKEN / "compile_error.cu"
    r = invoke("eval", str(f), "-k", "leaky_relu", "--json")
    assert r.exit_code == 8
    assert re.fullmatch(
        rf"optiml: error: compile_error leaky_relu: {re.escape(str(f))}:16:\d+: error: "
        'identifier "idx" is undefined',
        the_one_line(r.stderr),
    )


def test_profile_of_a_kernel_that_does_not_compile_exits_8(files, no_gpu_needed, monkeypatch):
    monkeypatch.setenv("OPTIML_NCU", str(files / "failing-ncu"))
    f = BROKEN / "compile_error.cu"
    r = invoke("profile", str(f), "-k", "leaky_relu")
    assert r.exit_code == 8
    assert the_one_line(r.stderr).startswith(f"optiml: error: the kernel does not compile: {f}:16:")


def test_a_profile_that_ncu_cannot_take_exits_13(files, no_gpu_needed, monkeypatch):
    monkeypatch.setenv("OPTIML_NCU", str(files / "failing-ncu"))
    r = invoke("profile", str(SAXPY), "-k", "saxpy", "--arch", "sm_90")
    assert r.exit_code == 13
    assert the_one_line(r.stderr) == (
        "optiml: error: ncu could not profile the kernel: a stand-in ncu that profiles nothing"
    )


# ---- every code and every command has its rows ----------------------------------------------------


def test_every_documented_code_and_every_command_has_a_row():
    tested = {r.code for r in ROWS + GPU_ROWS} | set(STATUS_CODES.values())
    tested.add(int(ExitCode.INTERNAL))  # tests/test_cli.py: an unexpected exception
    assert tested == set(readme_codes())
    assert {r.args[0] for r in ROWS} >= set(main.commands)
    assert len({r.id for r in ROWS}) == len(ROWS)
    assert len({r.id for r in GPU_ROWS}) == len(GPU_ROWS)
