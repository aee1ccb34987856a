"""The Anthropic backend through the real `anthropic` SDK against the scripted local server:
messages, structured output by forced tool use, retries, error mapping, cancellation, replay.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from pydantic import BaseModel

from optiml.llm import (
    AuthenticationFailed,
    ContextOverflow,
    InvalidStructuredOutput,
    MissingAPIKey,
    ModelNotFound,
    ProviderUnavailable,
    RateLimited,
    Refused,
    make_client,
)


class Plan(BaseModel):
    steps: list[str]
    risky: bool


PLAN = {"steps": ["tile the loop", "unroll by 4"], "risky": False}
ASK = [
    {"role": "system", "content": "You plan."},
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Plan it."},
]


async def test_messages_request_and_accounting(server, settings_for, env, secret):
    server.push(server.anthropic_message("hi", input_tokens=2000, output_tokens=100))
    settings = settings_for("anthropic", temperature=0.3)
    async with make_client(settings, env=env) as client:
        result = await client.chat(ASK, max_tokens=50, stop=["END"])

    assert result.text == "hi"
    assert result.finish_reason == "stop"
    # claude-sonnet-4-5: $3 in and $15 out per million tokens.
    assert result.cost_usd == pytest.approx((2000 * 3 + 100 * 15) / 1e6)
    sent = server.received[0]
    assert sent.path == "/v1/messages"
    assert secret in sent.headers.get("x-api-key", "") + sent.headers.get("authorization", "")
    assert sent.body["system"] == "You plan.\n\nBe brief."
    assert sent.body["messages"] == [{"role": "user", "content": "Plan it."}]
    assert sent.body["max_tokens"] == 50
    assert sent.body["temperature"] == 0.3
    assert sent.body["stop_sequences"] == ["END"]


async def test_structured_output_is_a_forced_tool_call(server, settings_for, env):
    server.push(
        server.anthropic_message(None, tool_input=PLAN, tool_name="Plan", stop_reason="tool_use")
    )
    async with make_client(settings_for("anthropic"), env=env) as client:
        plan = await client.structured(ASK, Plan)

    assert plan == Plan(**PLAN)
    body = server.received[0].body
    assert body["tool_choice"] == {"type": "tool", "name": "Plan"}
    assert body["tools"][0]["name"] == "Plan"
    assert body["tools"][0]["input_schema"] == Plan.model_json_schema()


async def test_invalid_tool_input_is_repaired_once(server, settings_for, env):
    server.push(
        server.anthropic_message(None, tool_input={"steps": "tile"}, tool_name="Plan"),
        server.anthropic_message(None, tool_input=PLAN, tool_name="Plan"),
    )
    async with make_client(settings_for("anthropic"), env=env) as client:
        assert (await client.structured(ASK, Plan)).steps == PLAN["steps"]

    repair = server.received[1].body["messages"]
    assert [m["role"] for m in repair] == ["user", "assistant", "user"]
    assert "steps" in repair[2]["content"] and "risky" in repair[2]["content"]


async def test_invalid_twice_is_a_typed_error(server, settings_for, env):
    bad = server.anthropic_message("no tool today", stop_reason="max_tokens")
    server.push(bad, server.anthropic_message("still no tool", stop_reason="max_tokens"))
    async with make_client(settings_for("anthropic"), env=env) as client:
        with pytest.raises(InvalidStructuredOutput, match="cut off at max_tokens"):
            await client.structured(ASK, Plan)


async def test_plain_json_in_text_works_in_prompt_mode(server, settings_for, env):
    server.push(server.anthropic_message('Here it is: {"steps": ["a"], "risky": true}'))
    settings = settings_for("anthropic", structured_mode="prompt")
    async with make_client(settings, env=env) as client:
        assert (await client.structured(ASK, Plan)).risky

    body = server.received[0].body
    assert "tools" not in body
    assert "JSON Schema" in body["system"]


async def test_refusal_stop_reason_is_a_typed_error(server, settings_for, env):
    server.push(server.anthropic_message("I can't help with that.", stop_reason="refusal"))
    async with make_client(settings_for("anthropic"), env=env) as client:
        with pytest.raises(Refused, match="can't help"):
            await client.chat(ASK)


async def test_rate_limit_and_overload_are_retried(server, settings_for, env, retry, sleeps):
    server.push(
        server.anthropic_error(
            429,
            "rate_limit_error",
            "Number of request tokens has exceeded your per-minute rate limit",
            headers={"retry-after": "3"},
        ),
        server.anthropic_error(529, "overloaded_error", "Overloaded"),
        server.anthropic_error(500, "api_error", "Internal server error"),
        server.anthropic_message("done"),
    )
    settings = settings_for("anthropic", max_retries=3)
    async with make_client(settings, env=env, retry=retry(settings, draw=0.0)) as client:
        assert (await client.chat(ASK)).text == "done"
    assert sleeps.delays == [3.0, 0.5, 1.0]


async def test_retry_after_as_an_http_date_is_honoured(server, settings_for, env, retry, sleeps):
    later = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 10))
    server.push(
        server.anthropic_error(
            429, "rate_limit_error", "slow down", headers={"retry-after": later}
        ),
        server.anthropic_message("done"),
    )
    settings = settings_for("anthropic")
    async with make_client(settings, env=env, retry=retry(settings)) as client:
        await client.chat(ASK)
    assert 8 <= sleeps.delays[0] <= 10


async def test_rate_limit_after_the_retries_is_a_typed_error(
    server, settings_for, env, retry, sleeps
):
    limited = server.anthropic_error(429, "rate_limit_error", "too many requests")
    server.push(limited, limited)
    settings = settings_for("anthropic", max_retries=1)
    async with make_client(settings, env=env, retry=retry(settings)) as client:
        with pytest.raises(RateLimited, match=r"rate limit reached \(429\).*gave up after 2"):
            await client.chat(ASK)


async def test_bad_key_unknown_model_and_overflow(server, settings_for, env, secret):
    server.push(
        server.anthropic_error(401, "authentication_error", "invalid x-api-key"),
        server.anthropic_error(404, "not_found_error", "model: claude-nope"),
        server.anthropic_error(
            400, "invalid_request_error", "prompt is too long: 215000 tokens > 200000 maximum"
        ),
    )
    async with make_client(settings_for("anthropic", model="claude-nope"), env=env) as client:
        with pytest.raises(AuthenticationFailed, match="invalid x-api-key") as auth:
            await client.chat(ASK)
        with pytest.raises(ModelNotFound, match="model 'claude-nope'"):
            await client.chat(ASK)
        with pytest.raises(ContextOverflow, match="prompt is too long"):
            await client.chat(ASK)
    assert server.hits == 3
    assert secret not in str(auth.value)


async def test_a_timeout_is_retried(server, settings_for, env, retry, sleeps):
    server.push(server.anthropic_message("slow"), server.anthropic_message("quick"))
    server.script[0].hang = True
    # The retry has the whole limit to answer: wide enough for a loaded 2-core machine.
    settings = settings_for("anthropic", timeout_s=1.0, max_retries=1)
    async with make_client(settings, env=env, retry=retry(settings)) as client:
        assert (await client.chat(ASK)).text == "quick"
    assert server.disconnects == 1


async def test_malformed_body_is_a_typed_error(server, settings_for, env, retry):
    server.push(server.raw(200, "not json at all"))
    settings = settings_for("anthropic", max_retries=0)
    async with make_client(settings, env=env, retry=retry(settings)) as client:
        with pytest.raises(ProviderUnavailable, match="cannot be read"):
            await client.chat(ASK)


async def test_cancelling_a_request_closes_its_connection(server, settings_for, env):
    server.push(server.anthropic_message())
    server.script[0].hang = True
    async with make_client(settings_for("anthropic", timeout_s=30), env=env) as client:
        task = asyncio.create_task(client.chat(ASK))
        while server.hits == 0:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        deadline = time.monotonic() + 2
        while server.disconnects == 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
    assert server.disconnects == 1


async def test_replay_needs_no_key_and_no_server(server, settings_for, env):
    server.push(server.anthropic_message(None, tool_input=PLAN, tool_name="Plan"))
    async with make_client(settings_for("anthropic"), env=env) as client:
        await client.structured(ASK, Plan, prompt_id="plan@1")
    server.stop()
    async with make_client(settings_for("anthropic", replay=True), env={}) as replay:
        assert (await replay.structured(ASK, Plan, prompt_id="plan@1")).steps == PLAN["steps"]


async def test_missing_key(settings_for):
    with pytest.raises(MissingAPIKey, match="ANTHROPIC_API_KEY"):
        make_client(settings_for("anthropic"), env={})
