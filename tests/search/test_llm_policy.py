"""The LLM policy and the LLM judge's review against the scripted OpenAI and Anthropic servers of
tests/llm: recorded edits become candidates or recorded rejections (nvcc compiles each for real),
a server error is retried, a recorded run replays with the server gone, the review's three verdicts,
and a missing provider is one line. No GPU and no real network."""

from __future__ import annotations

import json
import random

import pytest

from optiml.api import OptimizeRequest
from optiml.cuda.source import SourceFile
from optiml.llm import ConfigError, LLMExitCode, MissingAPIKey, ReplayMiss, make_client
from optiml.search.judge import judge
from optiml.search.llm_policy import (
    AnswerLog,
    DiffError,
    EditProposals,
    EditRejected,
    JudgeReview,
    LLMPolicy,
    ProposedEdit,
    apply_unified_diff,
    check_edit,
    make_llm_policy,
    make_llm_review,
    merge_flags,
)
from optiml.search.policy import NodeView
from optiml.search.trajectory import Measurement, ProfileSummary
from optiml.search.variant import Variant
from tests.llm import conftest as llm
from tests.support import FIXTURES

# The scripted server and its fixtures, as tests/llm uses them (the key-leak check included).
server = llm.server
sleeps = llm.sleeps
env = llm.env
settings_for = llm.settings_for
retry = llm.retry
secret = llm.secret
_no_key_leaks = llm._no_key_leaks
_no_tls_trust_store = llm._no_tls_trust_store

SAXPY = FIXTURES / "saxpy.cu"
TEXT = SAXPY.read_text()
ARCH = "sm_90"

SPEC = """/* @optiml
 *   args:   a = 2.5, x: in float[n], y: inout float[n]
 *   launch: grid = cdiv(n, 256), block = 256
 *   sizes:  n = 1 << 26, 1000003
 */"""

VECTORIZED = (
    SPEC
    + """
__global__ void saxpy(int n, float a, const float* __restrict__ x, float* __restrict__ y)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    bool aligned = ((reinterpret_cast<unsigned long long>(x) |
                     reinterpret_cast<unsigned long long>(y)) & 15) == 0;
    int n4 = aligned ? n / 4 : 0;
    if (i < n4) {
        float4 xv = reinterpret_cast<const float4*>(x)[i];
        float4 yv = reinterpret_cast<float4*>(y)[i];
        yv.x = a * xv.x + yv.x;
        yv.y = a * xv.y + yv.y;
        yv.z = a * xv.z + yv.z;
        yv.w = a * xv.w + yv.w;
        reinterpret_cast<float4*>(y)[i] = yv;
    }
    for (int j = 4 * n4 + i; j < n && j >= 4 * n4; j += gridDim.x * blockDim.x)
        y[j] = a * x[j] + y[j];
}"""
)

GRID_STRIDE_DIFF = """--- a/saxpy.cu
+++ b/saxpy.cu
@@ -7,5 +7,4 @@
 {
-    int i = blockIdx.x * blockDim.x + threadIdx.x;
-    if (i < n)
-        y[i] = a * x[i] + y[i];
+    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x)
+        y[i] = a * x[i] + y[i];
 }
"""

BROKEN = """__global__ void saxpy(int n, float a, const float* x, float* y)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        y[i] = a * x[i] + y[i] * undefined_scale;
}"""


def edit(title: str, **fields) -> dict:
    base = {
        "title": title,
        "bottleneck": "dram",
        "code": None,
        "diff": None,
        "grid": None,
        "block": None,
        "smem": None,
        "flags": [],
        "why": "fewer, wider memory transactions",
        "risk": "misaligned pointers",
    }
    return {**base, **fields}


THREE = {
    "edits": [
        edit("float4 loads and stores with a scalar tail", code=VECTORIZED),
        edit(
            "grid-stride loop over a bounded grid",
            bottleneck="launch",
            diff=GRID_STRIDE_DIFF,
            grid="min(cdiv(n, 256), 1056)",
        ),
        edit("scale by a constant that does not exist", code=BROKEN),
    ]
}

WRONG_PARAMS = {
    "edits": [
        edit(
            "an extra stride parameter",
            code=BROKEN.replace("float* y)", "float* y, int stride)").replace(
                " * undefined_scale", ""
            ),
        ),
        edit("double precision a", code=BROKEN.replace("float a", "double a")),
    ]
}


def reply(server, provider: str, payload: dict):
    """The scripted answer of a structured call, in the provider's own wire format."""
    if provider == "anthropic":
        name = "JudgeReview" if "verdict" in payload else "EditProposals"
        return server.anthropic_message(None, tool_input=payload, tool_name=name)
    return server.openai_chat(json.dumps(payload))


def request_for(text: str = TEXT, **kw) -> NodeView:
    return NodeView(variant=Variant(text), path=str(SAXPY), kernel="saxpy", **kw)


PROVIDERS = pytest.mark.parametrize("provider", ["openai", "anthropic"])


@PROVIDERS
async def test_valid_edits_become_candidates_and_a_broken_one_is_rejected(
    server, settings_for, env, provider
):
    server.push(reply(server, provider, THREE))
    async with make_client(settings_for(provider), env=env) as client:
        policy = LLMPolicy(client, arch=ARCH)
        found = await policy.propose(request_for(), 3, random.Random(0))
        assert policy.cost_usd == client.accounting.cost_usd > 0

    assert [c.edit.summary for c in found] == [
        "float4 loads and stores with a scalar tail",
        "grid-stride loop over a bounded grid",
    ]
    assert found[0].prior > found[1].prior > 0
    for c in found:
        assert (c.edit.transform, c.edit.origin) == ("llm", "llm")
        assert c.edit.digest and c.edit.key == f"llm:{c.edit.digest}"
        assert c.variant.flags == ("-O3",)
        assert "run_saxpy" in c.variant.text  # the rest of the file is the user's
    assert found[0].edit.params["bottleneck"] == "dram"
    assert "float4" in found[0].variant.text and SPEC in found[0].variant.text
    grid_stride = found[1].variant.text
    assert "i += blockDim.x * gridDim.x" in grid_stride
    assert "launch: grid = min(cdiv(n, 256), 1056), block = 256" in grid_stride
    assert "sizes:  n = 1 << 26, 1000003" in grid_stride  # the rest of the spec is unchanged

    [rejected] = policy.rejected
    assert rejected["title"] == "scale by a constant that does not exist"
    assert rejected["stage"] == "compile"
    assert 'identifier "undefined_scale" is undefined' in rejected["reason"]

    # What the model was shown: the kernel with its spec, the profile, the catalog, how many.
    sent = json.dumps(server.received[0].body)
    assert "__global__ void saxpy(int n, float a, const float* x, float* y)" in sent
    assert "@optiml" in sent and "not profiled" in sent
    assert "Propose 3 diverse edits" in sent
    assert "vectorize" in sent  # a catalog transformation that applies to saxpy
    assert "EditProposals" in sent


@PROVIDERS
async def test_a_changed_parameter_list_is_rejected_before_compiling(
    server, settings_for, env, provider
):
    server.push(reply(server, provider, WRONG_PARAMS))
    async with make_client(settings_for(provider), env=env) as client:
        policy = LLMPolicy(client, arch=ARCH)
        assert await policy.propose(request_for(), 2, random.Random(0)) == []
    assert [(r["stage"], r["title"]) for r in policy.rejected] == [
        ("signature", "an extra stride parameter"),
        ("signature", "double precision a"),
    ]
    assert "it has 5 parameters, not 4" in policy.rejected[0]["reason"]
    assert "`double a` was `float a`" in policy.rejected[1]["reason"]


@PROVIDERS
async def test_a_server_error_is_retried_and_the_edits_arrive(
    server, settings_for, env, retry, sleeps, provider
):
    error = (
        server.anthropic_error(500, "api_error", "Internal server error")
        if provider == "anthropic"
        else server.openai_error(500, "The server had an error", type="server_error")
    )
    server.push(error, reply(server, provider, THREE))
    settings = settings_for(provider)
    async with make_client(settings, env=env, retry=retry(settings)) as client:
        policy = LLMPolicy(client, arch=ARCH)
        found = await policy.propose(request_for(), 3, random.Random(0))
    assert len(found) == 2 and server.hits == 2 and len(sleeps.delays) == 1
    assert client.accounting.retries == 1


@PROVIDERS
async def test_replay_gives_the_same_candidates_with_the_server_gone(
    server, settings_for, env, provider, tmp_path
):
    server.push(reply(server, provider, THREE))
    log = AnswerLog(tmp_path / "cache" / "by-code")
    async with make_client(settings_for(provider), env=env) as client:
        recorded = await LLMPolicy(client, arch=ARCH, log=log).propose(
            request_for(), 3, random.Random(0)
        )
    server.stop()

    async with make_client(settings_for(provider, replay=True), env={}) as client:
        policy = LLMPolicy(client, arch=ARCH, log=log)
        replayed = await policy.propose(request_for(), 3, random.Random(0))
        assert client.accounting.cache_hits == 1
    assert replayed == recorded
    assert [r["stage"] for r in policy.rejected] == ["compile"]

    # Another run measures the same code a little differently: its prompt is not in the cache,
    # and the policy's record of the answer for that code replays it.
    profile = ProfileSummary(bottleneck="dram", explanation="DRAM bound", dram_tbps=3.9)
    async with make_client(settings_for(provider, replay=True), env={}) as client:
        policy = LLMPolicy(client, arch=ARCH, log=log)
        again = await policy.propose(
            request_for(profile=profile, speedup=1.01), 3, random.Random(0)
        )
        assert client.accounting.cache_hits == 0
    assert again == recorded

    # A variant never recorded: nothing to propose, recorded, and no crash.
    other = TEXT.replace("y[i] = a * x[i] + y[i];", "y[i] = y[i] + a * x[i];")
    async with make_client(settings_for(provider, replay=True), env={}) as client:
        policy = LLMPolicy(client, arch=ARCH, log=log)
        assert await policy.propose(request_for(other), 3, random.Random(0)) == []
    [miss] = policy.rejected
    assert miss["stage"] == "request" and "no recorded response" in miss["reason"]


async def test_the_pool_answers_widening_before_the_model_is_asked_again(server, settings_for, env):
    server.push(reply(server, "openai", THREE), reply(server, "openai", THREE))
    async with make_client(settings_for(), env=env) as client:
        policy = LLMPolicy(client, arch=ARCH)
        first = await policy.propose(request_for(), 1, random.Random(0))
        assert len(first) == 2 and server.hits == 1
        tried = {first[0].edit.key}
        second = await policy.propose(request_for(tried=tried), 1, random.Random(0))
        assert [c.edit.key for c in second] == [first[1].edit.key] and server.hits == 1
        # Every pooled edit tried: the model is asked again, told what it already proposed.
        tried = {c.edit.key for c in first}
        assert await policy.propose(request_for(tried=tried), 1, random.Random(0)) == []
        assert server.hits == 2
    again = json.dumps(server.received[1].body)
    assert "Already proposed for this exact code" in again
    assert "float4 loads and stores with a scalar tail" in again
    assert "scale by a constant that does not exist: compile:" in again
    assert [r["stage"] for r in policy.rejected] == ["compile", "duplicate", "duplicate", "compile"]


@PROVIDERS
async def test_provider_failures_do_not_end_the_search(server, settings_for, env, provider):
    denied = (
        server.anthropic_error(401, "authentication_error", "invalid x-api-key")
        if provider == "anthropic"
        else server.openai_error(401, "Incorrect API key provided", code="invalid_api_key")
    )
    server.push(denied)
    async with make_client(settings_for(provider), env=env) as client:
        policy = LLMPolicy(client, arch=ARCH)
        assert await policy.propose(request_for(), 3, random.Random(0)) == []
        # A rejected key is final: later nodes do not ask again.
        assert await policy.propose(request_for(TEXT + "\n"), 3, random.Random(0)) == []
    assert server.hits == 1 and policy.disabled
    assert [r["stage"] for r in policy.rejected] == ["request"]


async def test_a_budget_stop_is_recorded_not_raised(server, settings_for, env):
    async with make_client(settings_for(budget_usd=0.0000001), env=env) as client:
        policy = LLMPolicy(client, arch=ARCH)
        assert await policy.propose(request_for(), 3, random.Random(0)) == []
    assert server.hits == 0
    assert "budget" in policy.rejected[0]["reason"]


# ---- the checks, without a server ----------------------------------------------------------------


def proposed(**fields) -> ProposedEdit:
    return ProposedEdit.model_validate(edit("t", **fields))


def rejection(**fields) -> EditRejected:
    with pytest.raises(EditRejected) as caught:
        check_edit(proposed(**fields), Variant(TEXT), str(SAXPY), "saxpy", ARCH)
    return caught.value


def test_the_checks_say_which_stage_failed():
    assert rejection().stage == "apply"  # neither code nor diff
    assert rejection(code=VECTORIZED, diff=GRID_STRIDE_DIFF).stage == "apply"
    bad_context = GRID_STRIDE_DIFF.replace(" {\n-", " {  // moved\n-")
    assert rejection(diff=bad_context).stage == "apply"
    assert rejection(code=BROKEN.replace("if (i < n)", "if (i < n")).stage == "parse"
    assert rejection(code=BROKEN.replace("void saxpy", "void saxpy2")).stage == "signature"
    lost_const = BROKEN.replace("const float* x", "float* x").replace(" * undefined_scale", "")
    assert "lost `const`" in rejection(code=lost_const).reason
    contract = VECTORIZED.replace("1000003", "1000")
    assert "beyond its launch" in rejection(code=contract).reason
    assert rejection(code=VECTORIZED, grid="cdiv(n, m)").stage == "spec"
    assert rejection(code=VECTORIZED, flags=["-Xcompiler=-fno-strict-aliasing"]).stage == "flags"
    assert rejection(code=SPEC + "\n" + TEXT.split("*/\n", 1)[1].split("\n\n//")[0]).stage == (
        "unchanged"
    )


def test_accepted_forms_of_the_same_change():
    launch_in_comment = VECTORIZED.replace("grid = cdiv(n, 256)", "grid = cdiv(n, 1024)")
    a = check_edit(proposed(code=launch_in_comment), Variant(TEXT), str(SAXPY), "saxpy", ARCH)
    b = check_edit(
        proposed(code=VECTORIZED, grid="cdiv(n, 1024)"), Variant(TEXT), str(SAXPY), "saxpy", ARCH
    )
    no_comment = VECTORIZED.split("*/\n", 1)[1]
    c = check_edit(
        proposed(code=f"```cuda\n{no_comment}\n```", grid="cdiv(n, 1024)"),
        Variant(TEXT),
        str(SAXPY),
        "saxpy",
        ARCH,
    )
    assert a == b == c
    assert "grid = cdiv(n, 1024), block = 256" in a.text
    flags = check_edit(
        proposed(code=VECTORIZED, flags=["--use_fast_math", "-maxrregcount=64"]),
        Variant(TEXT),
        str(SAXPY),
        "saxpy",
        ARCH,
    ).flags
    assert flags == ("-O3", "-use_fast_math", "-maxrregcount=64")
    assert merge_flags(("-O3", "-ftz=false"), ["-ftz=true"]) == ("-O3", "-ftz=true")


def test_the_diff_applier_is_strict_about_content():
    text = "a\nb\nc\nd\ne"
    assert apply_unified_diff(text, "@@ -2,2 +2,2 @@\n b\n-c\n+C\n") == "a\nb\nC\nd\ne"
    # Wrong line numbers are forgiven when the lines match one place only.
    assert apply_unified_diff(text, "@@ -40,1 +40,1 @@\n-e\n+E") == "a\nb\nc\nd\nE"
    assert apply_unified_diff(text, "@@ -1,1 +1,2 @@\n a\n+a2\n@@ -5 +6 @@\n-e\n") == (
        "a\na2\nb\nc\nd"
    )
    with pytest.raises(DiffError, match="does not apply"):
        apply_unified_diff(text, "@@ -2,1 +2,1 @@\n-x\n+y\n")
    with pytest.raises(DiffError, match="several|2 places"):
        apply_unified_diff("x\ny\nx", "@@ -9 +9 @@\n-x\n+z\n")
    with pytest.raises(DiffError, match="not part of a hunk"):
        apply_unified_diff(text, "just some prose")
    with pytest.raises(DiffError, match="no @@ hunks"):
        apply_unified_diff(text, "--- a/k.cu\n+++ b/k.cu\n")
    with pytest.raises(DiffError, match="more than one file"):
        apply_unified_diff(text, "--- a\n+++ a\n@@ -1 +1 @@\n-a\n+b\n--- b\n+++ b\n@@ -1 +1 @@\n")


# ---- the judge's review ---------------------------------------------------------------------------


def measurement(speedup: float, profile: ProfileSummary | None = None) -> Measurement:
    return Measurement(
        status="ok",
        message="correct at every size and seed",
        speedup=speedup,
        candidate_ms=1.0 / speedup,
        reference_ms=1.0,
        candidate_iqr_ms=0.001,
        reference_iqr_ms=0.001,
        registers=16,
        profile=profile,
    )


@PROVIDERS
async def test_the_review_gives_accept_reject_or_uncertain(server, settings_for, env, provider):
    verdicts = [
        {"verdict": "accept", "reasons": ["same arithmetic, wider loads"], "risks": []},
        {"verdict": "reject", "reasons": ["reads past n"], "risks": ["odd sizes"]},
        {"verdict": "uncertain", "reasons": ["alignment not shown"], "risks": ["offsets"]},
    ]
    server.push(*(reply(server, provider, v) for v in verdicts))
    candidate = Variant(TEXT.replace("if (i < n)", "if (i < n && n > 0)"))
    profile = ProfileSummary(bottleneck="dram", explanation="DRAM bound", dram_tbps=4.1)
    async with make_client(settings_for(provider), env=env) as client:
        review = make_llm_review(client, TEXT, str(SAXPY), "saxpy")
        got = [await review(candidate, measurement(s, profile)) for s in (1.9, 1.8, 1.7)]
    assert [g["accept"] for g in got] == [True, False, None]
    assert got[1]["reason"] == "reject: reads past n" and got[1]["risks"] == ["odd sizes"]
    assert got[2]["verdict"] == "uncertain"
    sent = json.dumps(server.received[0].body)
    assert "+    if (i < n && n > 0)" in sent.replace("\\n", "\n")  # the diff
    assert "speedup 1.900x" in sent and "DRAM 4.10 TB/s" in sent  # the evidence
    assert "1000003" in sent  # the sizes the checks covered
    assert "JudgeReview" in sent


async def test_a_replayed_review_does_not_depend_on_the_timings(
    server, settings_for, env, tmp_path
):
    server.push(reply(server, "openai", {"verdict": "reject", "reasons": ["r"], "risks": []}))
    log = AnswerLog(tmp_path / "cache" / "by-code")
    candidate = Variant(TEXT.replace("if (i < n)", "if (i < n && n > 0)"))
    async with make_client(settings_for(), env=env) as client:
        first = await make_llm_review(client, TEXT, str(SAXPY), "saxpy", log=log)(
            candidate, measurement(1.9)
        )
    server.stop()
    async with make_client(settings_for(replay=True), env={}) as client:
        review = make_llm_review(client, TEXT, str(SAXPY), "saxpy", log=log)
        assert await review(candidate, measurement(1.87)) == first
        with pytest.raises(ReplayMiss):
            await review(Variant(TEXT + "\n"), measurement(1.87))


class Stub:
    """An executor whose every evaluation passes, for the judge's own logic."""

    async def evaluate(self, job, options, **kw):
        from optiml.harness.verdict import Verdict

        return Verdict(
            status="ok",
            message="correct",
            file=str(SAXPY),
            kernel="saxpy",
            reference="self",
            arch=ARCH,
            nvcc_version="13.0",
            date="2026-01-01",
        )


@pytest.mark.parametrize(("accept", "accepted"), [(True, True), (False, False), (None, True)])
async def test_an_uncertain_review_is_recorded_and_rejects_nothing(accept, accepted):
    from optiml.executors.base import Job
    from optiml.harness.evaluate import EvalOptions
    from optiml.spec import parse_spec

    source = SourceFile(TEXT, str(SAXPY))
    kernel = source.kernel("saxpy")
    job = Job(source, kernel, parse_spec(source, kernel), candidate=source)

    async def review():
        return {"accept": accept, "reason": "because"}

    verdict = await judge(
        Stub(), job, EvalOptions(), measurement(1.5), sanitize=False, llm_review=review
    )
    assert verdict.accepted is accepted
    assert verdict.llm == {"accept": accept, "reason": "because"}
    assert ("LLM review" in [c.name for c in verdict.checks]) is (accept is not None)


# ---- construction ---------------------------------------------------------------------------------


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    for name in list(__import__("os").environ):
        if name.startswith("OPTIML_LLM_") or name in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("OPTIML_LLM_CACHE_DIR", str(tmp_path / "cache"))
    return monkeypatch


def llm_request(**overrides) -> OptimizeRequest:
    values = {"provider": None, "model": None, "base_url": None, "replay": None, **overrides}
    return OptimizeRequest(file=SAXPY, kernel="saxpy", policy="llm", llm_overrides=values)


@pytest.mark.parametrize("provider", [None, "offline"])
def test_no_provider_is_a_one_line_error(clean_env, tmp_path, provider):
    with pytest.raises(ConfigError) as caught:
        make_llm_policy(llm_request(provider=provider), tmp_path)
    message = str(caught.value)
    assert "\n" not in message and "--provider" in message
    assert caught.value.exit_code == LLMExitCode.LLM_ERROR


def test_a_missing_key_is_raised_before_the_search(clean_env, tmp_path):
    with pytest.raises(MissingAPIKey) as caught:
        make_llm_policy(llm_request(provider="openai", model="gpt-4o-mini"), tmp_path)
    assert caught.value.exit_code == LLMExitCode.NO_KEY


async def test_make_llm_policy_builds_a_policy_that_works(clean_env, tmp_path, server, secret):
    clean_env.setenv("ANTHROPIC_API_KEY", secret)
    server.push(reply(server, "anthropic", THREE))
    policy, review, client = make_llm_policy(
        llm_request(provider="anthropic", model="claude-sonnet-4-5", base_url=server.url),
        tmp_path,
    )
    try:
        assert policy.name == "llm" and callable(review)
        assert client.settings.cache_dir == tmp_path / "cache"
        policy.arch = ARCH
        found = await policy.propose(request_for(), 3, random.Random(0))
        assert len(found) == 2
    finally:
        await client.aclose()
    assert list((tmp_path / "cache" / "by-code").rglob("*.json"))


def test_the_schemas_are_what_the_prompts_describe():
    assert set(ProposedEdit.model_fields) == {
        "title",
        "bottleneck",
        "code",
        "diff",
        "grid",
        "block",
        "smem",
        "flags",
        "why",
        "risk",
    }
    assert EditProposals.model_validate(THREE).edits[1].grid == "min(cdiv(n, 256), 1056)"
    assert JudgeReview.model_validate({"verdict": "uncertain", "reasons": [], "risks": []})


# ---- end to end ---------------------------------------------------------------------------------


class Answering(llm.FakeServer):
    """Answers every edit request with the three edits, and every review with an accept."""

    def _next(self, received: llm.Received) -> llm.Reply:
        if "JudgeReview" in json.dumps(received.body):
            return reply(self, "openai", {"verdict": "accept", "reasons": ["ok"], "risks": []})
        return reply(self, "openai", THREE)


@pytest.fixture
def answering():
    fake = Answering()
    yield fake
    fake.stop()


async def test_optimize_with_the_llm_policy_and_review(answering, env, retry, tmp_path):
    from optiml.llm import LLMSettings
    from optiml.search.optimize import OptimizeOptions, optimize
    from tests.search.test_optimize import StandInExecutor

    settings = LLMSettings(
        provider="openai",
        model="gpt-4o-mini",
        base_url=answering.url + "/v1",
        cache_dir=tmp_path / "cache",
    )
    async with make_client(settings, env=env, retry=retry(settings)) as client:
        policy = LLMPolicy(client, arch=ARCH)
        outcome = await optimize(
            SAXPY,
            "saxpy",
            StandInExecutor(),
            OptimizeOptions(budget=6, arch=ARCH),
            policy=policy,
            llm_review=make_llm_review(client, TEXT, str(SAXPY), "saxpy"),
        )
    t = outcome.trajectory
    assert t.policy == "llm" and t.llm_cost_usd == client.accounting.cost_usd > 0
    llm_nodes = [n for n in t.nodes if n.edit is not None]
    assert llm_nodes and all(n.edit.origin == "llm" for n in llm_nodes)
    assert {n.edit.summary for n in llm_nodes} >= {"grid-stride loop over a bounded grid"}
    assert t.rejected == policy.rejected and {r["stage"] for r in t.rejected} >= {"compile"}
    assert t.winner is not None and t.judge is not None and t.judge.accepted
    assert t.judge.llm["verdict"] == "accept"
    assert any(c.name == "LLM review" and c.ok for c in t.judge.checks)
    review = json.dumps(answering.received[-1].body)
    assert "JudgeReview" in review and "DRAM 3.40 TB/s" in review  # the search's profile
