"""`optiml generate`'s Mixture-of-Thoughts path end to end, against the local servers that speak
OpenAI's and Anthropic's wire formats, playing recorded answers: experts that disagree, a
reference that loses the vote, an aggregated kernel that fails and is repaired, the budget that
stops a run, a replay with the server stopped; and the bad inputs' exit codes."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from optiml.cli import main
from optiml.generate import generate
from tests.llm.conftest import FakeServer, Received, Reply

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")

NAME = "bias_gelu"
TASK = "fused bias + GELU over the last axis of a [tokens, 4096] float tensor"
GELU = "float x[T, C], b[C]; y[t, c] = 0.5 * (x[t, c] + b[c]) * (1 + erf((x[t, c] + b[c]) * 0.7071067811865476))"
# wrong: the bias is left out of the erf's argument
NO_BIAS = "float x[T, C], b[C]; y[t, c] = 0.5 * (x[t, c] + b[c]) * (1 + erf(x[t, c] * 0.7071067811865476))"
# wrong: another function of the same interface
TANH = "float x[T, C], b[C]; y[t, c] = 0.5 * (x[t, c] + b[c]) * (1 + tanh(x[t, c] + b[c]))"

RIGHT, WRONG_KERNEL, WRONG_REF = (generate(f, NAME) for f in (GELU, NO_BIAS, TANH))

# expert: (kernel, reference) in both rounds
DRAFTS = {
    "memory traffic first": (RIGHT.kernel, RIGHT.reference),
    "parallelism first": (RIGHT.kernel, RIGHT.reference),
    "simplest correct kernel": (RIGHT.kernel, WRONG_REF.reference),  # its reference loses
    "numerics first": (WRONG_KERNEL.kernel, RIGHT.reference),  # its kernel disagrees
}


def answer(received: Received) -> tuple[str, dict]:
    """The recorded answer to a request: which phase and expert, from the prompt's text."""
    text = json.dumps(received.body)
    if "You chair a panel" in text:
        if "it failed its check" in text:
            return "FinalReply", {"kernel": RIGHT.kernel, "notes": "the bias goes into the erf"}
        return "FinalReply", {"kernel": WRONG_KERNEL.kernel, "notes": "merged"}
    for marker, (kernel, reference) in DRAFTS.items():
        if marker in text:
            return "DraftReply", {"kernel": kernel, "reference": reference, "notes": marker}
    raise AssertionError("a request no test answer fits")


def openai_responder(received: Received) -> Reply:
    _, value = answer(received)
    return FakeServer.openai_chat(json.dumps(value), prompt_tokens=2000, completion_tokens=1000)


def anthropic_responder(received: Received) -> Reply:
    schema, value = answer(received)
    return FakeServer.anthropic_message(None, tool_input=value, tool_name=schema)


_VARIABLES = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPTIML_LLM_API_KEY")


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in list(os.environ):
        if name in _VARIABLES or name.startswith("OPTIML_LLM_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


def run(*args: str, **env: str):
    result = CliRunner().invoke(main, ["generate", *args, "--no-optimize"], env=env)
    return result.exit_code, result.stdout, result.stderr


def openai_env(server: FakeServer, tmp_path: Path, secret: str, **more: str) -> dict[str, str]:
    return {
        "OPTIML_LLM_PROVIDER": "openai",
        "OPTIML_LLM_MODEL": "gpt-4o-mini",
        "OPTIML_LLM_BASE_URL": server.url + "/v1",
        "OPTIML_LLM_CACHE_DIR": str(tmp_path / "cache"),
        "OPTIML_LLM_MAX_RETRIES": "0",
        "OPTIML_LLM_MAX_TOKENS": "1000",
        "OPENAI_API_KEY": secret,
        **more,
    }


def test_prose_is_drafted_voted_aggregated_repaired_and_replayed(server, tmp_path, secret):
    server.responder = openai_responder
    env = openai_env(server, tmp_path, secret)
    code, _, err = run(TASK, "--out", "gelu", "--name", NAME, **env)
    assert code == 0, err
    t = json.loads((tmp_path / "gelu" / "trajectory.json").read_text())
    assert [r["phase"] for r in t["rounds"]] == ["draft", "revise", "aggregate", "repair"]
    m = t["matrix"]
    labels = ["memory", "parallelism", "simple", "numerics"]
    assert m["kernels"] == labels and m["references"] == labels
    # the numerics kernel disagrees with every right reference; the simple reference with all
    assert m["agrees"] == [
        [True, True, False, True],
        [True, True, False, True],
        [True, True, False, True],
        [False, False, False, False],
    ]
    assert m["votes"] == {"memory": 3, "parallelism": 3, "simple": 0, "numerics": 3}
    assert t["oracle"] == "memory" and "tied with parallelism, numerics" in m["why"]
    assert "y[" in m["details"][3][0] and "outside rtol" in m["details"][3][0]
    aggregate, repair = t["rounds"][2]["entries"][0], t["rounds"][3]["entries"][0]
    assert not aggregate["agrees"] and "outside rtol" in aggregate["verdict"]
    assert repair["agrees"] and repair["verdict"] == "agrees"
    assert t["outcome"] == "verified" and t["accounting"]["requests"] == 10
    assert t["rounds"][0]["cost"]["requests"] == 4 and t["rounds"][0]["cost"]["cost_usd"] > 0
    final = (tmp_path / "gelu" / f"{NAME}.cu").read_text()
    assert "erf((x[" in final and f"reference: {NAME}_ref.py:{NAME}" in final
    assert (tmp_path / "gelu" / f"{NAME}_ref.py").read_text() == RIGHT.reference
    assert "oracle: memory" in err and "CPU check" in err

    # the same run from the recorded answers, with the server stopped
    hits = server.hits
    server.stop()
    code, _, err = run(TASK, "--out", "again", "--name", NAME, "--replay", **env)
    assert code == 0, err
    r = json.loads((tmp_path / "again" / "trajectory.json").read_text())
    assert r["matrix"]["agrees"] == m["agrees"] and r["oracle"] == t["oracle"]
    assert [x["phase"] for x in r["rounds"]] == [x["phase"] for x in t["rounds"]]
    assert (tmp_path / "again" / f"{NAME}.cu").read_text() == final
    assert r["accounting"]["requests"] == 0 and r["accounting"]["cache_hits"] == 10
    assert server.hits == hits


def test_the_budget_stops_the_run_with_one_line_and_keeps_what_was_done(server, tmp_path, secret):
    server.responder = openai_responder
    env = openai_env(server, tmp_path, secret, OPTIML_LLM_BUDGET_USD="0.004")
    code, _, err = run(TASK, "--out", "gelu", "--name", NAME, **env)
    assert code == 23, err
    line = err.strip()
    assert "\n" not in line and "budget of $0.0040 would be exceeded" in line
    t = json.loads((tmp_path / "gelu" / "trajectory.json").read_text())
    assert t["outcome"] == "stopped" and "budget" in t["stopped"]
    assert t["rounds"][0]["phase"] == "draft" and len(t["rounds"][0]["entries"]) == 4
    assert t["accounting"]["cost_usd"] <= 0.004
    assert not (tmp_path / "gelu" / f"{NAME}.cu").exists()


def test_anthropic_experts_on_a_formula_the_formulas_reference_has_the_final_say(
    server, tmp_path, secret
):
    """Both experts write the wrong reference (tanh): it wins their vote, but the formula's
    float64 reference decides, and the right kernel passes against it."""
    wrong = {"kernel": RIGHT.kernel, "reference": WRONG_REF.reference, "notes": "tanh"}

    def responder(received: Received) -> Reply:
        schema, value = answer(received)
        return FakeServer.anthropic_message(
            None, tool_input=wrong if schema == "DraftReply" else value, tool_name=schema
        )

    server.responder = responder
    env = {
        "OPTIML_LLM_PROVIDER": "anthropic",
        "OPTIML_LLM_MODEL": "claude-sonnet-4-5",
        "OPTIML_LLM_BASE_URL": server.url,
        "OPTIML_LLM_CACHE_DIR": str(tmp_path / "cache"),
        "ANTHROPIC_API_KEY": secret,
    }
    code, _, err = run(GELU, "--mot", "--experts", "2", "--out", "f", "--name", NAME, **env)
    assert code == 0, err
    t = json.loads((tmp_path / "f" / "trajectory.json").read_text())
    m = t["matrix"]
    assert m["references"] == ["memory", "parallelism", "formula"]
    assert m["votes"] == {"memory": 0, "parallelism": 0, "formula": 2}
    assert t["oracle"] == "formula" and "final say" in m["why"]
    assert [r["phase"] for r in t["rounds"]] == ["draft", "revise", "aggregate", "repair"]
    assert server.received[0].path == "/v1/messages"


# ---- bad input --------------------------------------------------------------------------------


def test_prose_without_a_provider_is_one_line_saying_what_works_offline():
    code, out, err = run(TASK)
    assert code == 24
    line = err.strip()
    assert "\n" not in line and "read as a task in prose, it needs an LLM" in line
    assert "index notation" in line and "OPTIML_LLM_PROVIDER" in line
    assert not list(Path.cwd().iterdir())  # nothing written


def test_no_key_exits_20(server, tmp_path, secret):
    env = openai_env(server, tmp_path, secret)
    del env["OPENAI_API_KEY"]
    code, _, err = run(TASK, **env)
    assert code == 20 and "no API key for openai" in err
    assert server.hits == 0


def test_a_rejected_key_exits_21_and_an_unreachable_provider_22(
    server, tmp_path, secret, closed_port
):
    server.responder = lambda _: FakeServer.openai_error(401, "bad key", type="invalid_api_key")
    code, _, err = run(TASK, "--out", "a", **openai_env(server, tmp_path, secret))
    assert code == 21, err
    assert json.loads((tmp_path / "a" / "trajectory.json").read_text())["outcome"] == "stopped"
    env = openai_env(
        server, tmp_path, secret, OPTIML_LLM_BASE_URL=f"http://127.0.0.1:{closed_port}/v1"
    )
    code, _, err = run(TASK, "--out", "b", **env)
    assert code == 22, err
    assert secret not in err


@pytest.mark.gpu
def test_on_a_gpu_the_harness_decides_the_final_kernel(server, tmp_path, secret):
    """Where a GPU is present, the final kernel passes the CPU check and then the GPU harness
    against the oracle; the wrong aggregated kernel already fails the CPU check."""
    server.responder = openai_responder
    code, _, err = run(TASK, "--out", "g", "--name", NAME, **openai_env(server, tmp_path, secret))
    assert code == 0, err
    t = json.loads((tmp_path / "g" / "trajectory.json").read_text())
    repair = t["rounds"][3]["entries"][0]
    assert repair["agrees"] and repair["verdict"].startswith("GPU harness: ok"), repair
    assert "the GPU harness decides" in t["check"]
