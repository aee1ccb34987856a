"""The OpenAI backend through the real `openai` SDK against the scripted local server: chat,
structured output in each mode, retries and their waits, error mapping, cache, budget, cancellation.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from pydantic import BaseModel, Field

from optiml.llm import (
    Accounting,
    AuthenticationFailed,
    BudgetExceeded,
    ContextOverflow,
    InvalidStructuredOutput,
    LLMError,
    MissingAPIKey,
    ModelNotFound,
    ProviderUnavailable,
    RateLimited,
    Refused,
    ReplayMiss,
    RequestRejected,
    RequestTimeout,
    make_client,
)


class Verdict(BaseModel):
    accept: bool
    reasons: list[str]
    confidence: float = Field(ge=0, le=1)


VERDICT = {"accept": True, "reasons": ["coalesced loads"], "confidence": 0.9}
ASK = [{"role": "system", "content": "You judge."}, {"role": "user", "content": "Judge this."}]


async def test_chat_sends_the_request_and_accounts_tokens_and_cost(
    server, settings_for, env, secret
):
    server.push(server.openai_chat("hello there", prompt_tokens=1000, completion_tokens=500))
    async with make_client(settings_for(temperature=0.2), env=env) as client:
        result = await client.chat(ASK, max_tokens=64)

    assert result.text == "hello there"
    assert (result.usage.input_tokens, result.usage.output_tokens) == (1000, 500)
    # gpt-4o-mini: $0.15 in and $0.60 out per million tokens.
    assert result.cost_usd == pytest.approx((1000 * 0.15 + 500 * 0.60) / 1e6)
    assert not result.cached
    sent = server.received[0]
    assert sent.path == "/v1/chat/completions"
    assert sent.headers["authorization"] == f"Bearer {secret}"
    assert sent.body["messages"] == ASK
    assert sent.body["max_completion_tokens"] == 64
    assert sent.body["temperature"] == 0.2
    numbers = client.accounting.as_dict()
    assert numbers["cost_usd"] == pytest.approx(result.cost_usd)
    del numbers["cost_usd"]
    assert numbers == {
        "requests": 1,
        "cache_hits": 0,
        "retries": 0,
        "failures": 0,
        "input_tokens": 1000,
        "output_tokens": 500,
        "unpriced_requests": 0,
        "budget_usd": None,
    }


async def test_structured_output_uses_a_strict_json_schema(server, settings_for, env):
    server.push(server.openai_chat(json.dumps(VERDICT)))
    async with make_client(settings_for(), env=env) as client:
        verdict = await client.structured(ASK, Verdict)

    assert verdict == Verdict(**VERDICT)
    response_format = server.received[0].body["response_format"]
    assert response_format["type"] == "json_schema"
    assert response_format["json_schema"]["name"] == "Verdict"
    assert response_format["json_schema"]["strict"] is True
    schema = response_format["json_schema"]["schema"]
    assert schema["additionalProperties"] is False
    assert set(schema["required"]) == {"accept", "reasons", "confidence"}


async def test_structured_output_by_forced_tool_call(server, settings_for, env):
    server.push(server.openai_chat(tool_args=json.dumps(VERDICT), finish_reason="tool_calls"))
    async with make_client(settings_for(structured_mode="tool"), env=env) as client:
        verdict = await client.structured(ASK, Verdict)

    assert verdict.accept is True
    body = server.received[0].body
    assert body["tool_choice"] == {"type": "function", "function": {"name": "Verdict"}}
    assert body["tools"][0]["function"]["parameters"]["additionalProperties"] is False
    assert "response_format" not in body


async def test_invalid_output_gets_one_repair_round(server, settings_for, env):
    server.push(
        server.openai_chat('{"accept": true, "reasons": ["x"], "confidence": 7'),  # malformed JSON
        server.openai_chat(json.dumps(VERDICT)),
    )
    async with make_client(settings_for(), env=env) as client:
        verdict = await client.structured(ASK, Verdict)

    assert verdict.confidence == 0.9
    repair = server.received[1].body["messages"]
    assert repair[:2] == ASK
    assert repair[2]["role"] == "assistant"
    assert "not valid JSON" in repair[3]["content"]


async def test_output_still_invalid_after_repair_is_a_typed_error(server, settings_for, env):
    bad = json.dumps(VERDICT | {"confidence": 7})
    server.push(server.openai_chat(bad), server.openai_chat(bad))
    async with make_client(settings_for(), env=env) as client:
        with pytest.raises(InvalidStructuredOutput, match="confidence") as caught:
            await client.structured(ASK, Verdict)

    assert server.hits == 2
    assert "\n" not in str(caught.value)
    assert "less than or equal to 1" in server.received[1].body["messages"][-1]["content"]


async def test_refusal_is_a_typed_error_and_not_repaired(server, settings_for, env):
    server.push(server.openai_chat(None, refusal="I can't help with that."))
    async with make_client(settings_for(), env=env) as client:
        with pytest.raises(Refused, match="can't help"):
            await client.structured(ASK, Verdict)
    assert server.hits == 1


async def test_compatible_server_falls_back_from_json_schema_to_json_mode(
    server, settings_for, env
):
    server.push(
        server.openai_error(400, "response_format.type json_schema is not supported"),
        server.openai_chat("```json\n" + json.dumps(VERDICT) + "\n```"),
        server.openai_chat(json.dumps(VERDICT)),
    )
    settings = settings_for("openai-compatible", model="qwen-coder")
    async with make_client(settings, env={}) as client:
        assert (await client.structured(ASK, Verdict)).accept
        assert (await client.structured(ASK + [ASK[1]], Verdict)).accept

    first, second, third = (r.body for r in server.received)
    assert first["response_format"]["type"] == "json_schema"
    assert first["max_tokens"] == 2048  # compatible servers get the classic parameter
    assert second["response_format"] == {"type": "json_object"}
    assert "JSON Schema" in second["messages"][0]["content"]
    assert third["response_format"] == {"type": "json_object"}  # the fallback is remembered
    assert server.received[0].headers["authorization"] == "Bearer no-key"


async def test_compatible_server_never_gets_the_openai_key(server, settings_for, secret):
    server.push(server.openai_chat())
    settings = settings_for("openai-compatible", model="llama")
    async with make_client(settings, env={"OPENAI_API_KEY": secret}) as client:
        await client.chat(ASK)
    assert secret not in server.received[0].headers["authorization"]


async def test_missing_usage_is_estimated(server, settings_for, env):
    server.push(server.openai_chat("x" * 300, usage=False))
    async with make_client(settings_for(), env=env) as client:
        result = await client.chat(ASK)
    assert result.usage.estimated
    assert result.usage.output_tokens == 100


async def test_rate_limit_waits_as_long_as_retry_after_says(
    server, settings_for, env, retry, sleeps
):
    limited = server.openai_error(
        429,
        "Rate limit reached for gpt-4o-mini on tokens per min. Please try again in 2s.",
        type="tokens",
        code="rate_limit_exceeded",
        headers={"retry-after": "2"},
    )
    server.push(limited, server.openai_error(429, "slow down", headers={"retry-after-ms": "1500"}))
    server.push(server.openai_chat("finally"))
    settings = settings_for()
    async with make_client(settings, env=env, retry=retry(settings)) as client:
        result = await client.chat(ASK)

    assert result.text == "finally"
    assert server.hits == 3
    # Retry 1: backoff in [0.25, 0.5] but the server asked for 2 s; retry 2: 1.5 s asked.
    assert sleeps.delays == [2.0, 1.5]
    assert client.accounting.retries == 2
    assert client.accounting.requests == 1


async def test_server_errors_back_off_exponentially_within_bounds(
    server, settings_for, env, retry, sleeps
):
    failure = server.openai_error(500, "The server had an error", type="server_error")
    server.push(failure, failure, failure, server.openai_chat())
    settings = settings_for(max_retries=3)
    policy = retry(settings, draw=1.0)
    async with make_client(settings, env=env, retry=policy) as client:
        await client.chat(ASK)

    assert server.hits == 4
    for retry_number, delay in enumerate(sleeps.delays, start=1):
        low, high = policy.backoff_bounds(retry_number)
        assert low <= delay <= high
    assert sleeps.delays == [0.5, 1.0, 2.0]  # draw 1.0 is the top of each range


async def test_giving_up_after_the_retries_says_so(server, settings_for, env, retry, sleeps):
    failure = server.openai_error(503, "overloaded", type="server_error")
    server.push(failure, failure, failure)
    settings = settings_for(max_retries=2)
    async with make_client(settings, env=env, retry=retry(settings, draw=0.0)) as client:
        with pytest.raises(ProviderUnavailable, match=r"\(503\).*gave up after 3 attempts"):
            await client.chat(ASK)
    assert sleeps.delays == [0.25, 0.5]  # draw 0.0 is the bottom of each range
    assert client.accounting.failures == 1


async def test_retry_after_beyond_the_limit_is_not_waited_for(
    server, settings_for, env, retry, sleeps
):
    server.push(server.openai_error(429, "try tomorrow", headers={"retry-after": "3600"}))
    settings = settings_for(max_retry_wait_s=30)
    async with make_client(settings, env=env, retry=retry(settings)) as client:
        with pytest.raises(RateLimited, match="3600 s") as caught:
            await client.chat(ASK)
    assert caught.value.retry_after == 3600
    assert sleeps.delays == []


async def test_exhausted_quota_is_not_retried(server, settings_for, env, retry, sleeps):
    server.push(
        server.openai_error(
            429,
            "You exceeded your current quota, please check your plan and billing details.",
            type="insufficient_quota",
            code="insufficient_quota",
        )
    )
    settings = settings_for()
    async with make_client(settings, env=env, retry=retry(settings)) as client:
        with pytest.raises(RateLimited, match="quota is exhausted"):
            await client.chat(ASK)
    assert server.hits == 1


async def test_x_should_retry_false_is_obeyed(server, settings_for, env, retry, sleeps):
    server.push(server.openai_error(500, "broken", headers={"x-should-retry": "false"}))
    settings = settings_for()
    async with make_client(settings, env=env, retry=retry(settings)) as client:
        with pytest.raises(ProviderUnavailable):
            await client.chat(ASK)
    assert server.hits == 1


async def test_a_slow_server_times_out_and_is_retried(server, settings_for, env, retry, sleeps):
    server.push(server.openai_chat("late"), server.openai_chat("on time"))
    server.script[0].delay_s = 10.0
    # The retry has the whole limit to answer: wide enough for a loaded 2-core machine.
    settings = settings_for(timeout_s=1.0, max_retries=1)
    started = time.monotonic()
    async with make_client(settings, env=env, retry=retry(settings)) as client:
        result = await client.chat(ASK)
    assert result.text == "on time"
    assert time.monotonic() - started < 5.0
    assert len(sleeps.delays) == 1


async def test_timeout_after_the_retries_is_a_typed_error(server, settings_for, env, retry):
    server.push(server.openai_chat(), server.openai_chat())
    for reply in server.script:
        reply.hang = True
    settings = settings_for(timeout_s=0.1, max_retries=1)
    async with make_client(settings, env=env, retry=retry(settings)) as client:
        with pytest.raises(RequestTimeout, match="did not answer within 0.1 s"):
            await client.chat(ASK)


async def test_a_malformed_response_body_is_retried(server, settings_for, env, retry, sleeps):
    server.push(server.raw(200, '{"id": "chatcmpl-1", "choices": [ {oops'), server.openai_chat())
    settings = settings_for()
    async with make_client(settings, env=env, retry=retry(settings)) as client:
        assert (await client.chat(ASK)).text == "ok"
    assert server.hits == 2


async def test_an_unreachable_server_is_retried_then_reported(
    settings_for, env, retry, sleeps, closed_port
):
    url = f"http://127.0.0.1:{closed_port}/v1"
    settings = settings_for(base_url=url, max_retries=2)
    async with make_client(settings, env=env, retry=retry(settings)) as client:
        with pytest.raises(ProviderUnavailable, match=f"cannot reach openai at {url}"):
            await client.chat(ASK)
    assert len(sleeps.delays) == 2


async def test_a_bad_key_is_reported_without_the_key(server, settings_for, secret, retry):
    # OpenAI echoes a masked key; a careless server might echo all of it.
    server.push(
        server.openai_error(
            401,
            f"Incorrect API key provided: {secret}. You can find your API key at "
            "https://platform.openai.com/account/api-keys.",
            code="invalid_api_key",
        )
    )
    settings = settings_for()
    env = {"OPENAI_API_KEY": secret}
    async with make_client(settings, env=env, retry=retry(settings)) as client:
        with pytest.raises(AuthenticationFailed) as caught:
            await client.chat(ASK)

    message = str(caught.value)
    assert message.startswith("openai at http://127.0.0.1:")
    assert "rejected the API key from $OPENAI_API_KEY (401)" in message
    assert secret not in message
    assert secret not in repr(caught.value)
    assert caught.value.__cause__ is None and caught.value.__suppress_context__
    assert server.hits == 1  # a bad key is not retried


async def test_no_error_repeats_a_key_the_server_echoes(server, settings_for, secret, retry):
    statuses = (400, 403, 404, 409, 422, 429, 500, 503)
    for status in statuses:
        server.push(server.openai_error(status, f"model gpt-x says: your key {secret} is odd"))
    settings = settings_for(max_retries=0)
    errors = []
    env = {"OPENAI_API_KEY": secret}
    async with make_client(settings, env=env, retry=retry(settings)) as client:
        for _ in statuses:
            with pytest.raises(LLMError) as caught:
                await client.chat(ASK)
            errors.append(caught.value)
    assert [type(e).__name__ for e in errors] == [
        "RequestRejected",
        "AuthenticationFailed",
        "ModelNotFound",
        "ProviderUnavailable",
        "RequestRejected",
        "RateLimited",
        "ProviderUnavailable",
        "ProviderUnavailable",
    ]
    for error in errors:
        assert secret not in str(error) and secret not in repr(error)
        assert "[redacted]" in str(error)


async def test_an_unknown_model_is_reported(server, settings_for, env):
    server.push(
        server.openai_error(
            404,
            "The model `gpt-nope` does not exist or you do not have access to it.",
            code="model_not_found",
        )
    )
    async with make_client(settings_for(model="gpt-nope"), env=env) as client:
        with pytest.raises(ModelNotFound, match="model 'gpt-nope' is not available"):
            await client.chat(ASK)


async def test_a_wrong_path_is_not_called_an_unknown_model(server, settings_for, env):
    server.push(server.raw(404, "<html>Not Found</html>"))
    async with make_client(settings_for(), env=env) as client:
        with pytest.raises(RequestRejected, match="check the base URL"):
            await client.chat(ASK)


@pytest.mark.parametrize(
    "reply",
    [
        # OpenAI
        {
            "error": {
                "message": "This model's maximum context length is 128000 tokens. However, your "
                "messages resulted in 130000 tokens. Please reduce the length of the messages.",
                "type": "invalid_request_error",
                "param": "messages",
                "code": "context_length_exceeded",
            }
        },
        # vLLM
        {
            "object": "error",
            "message": "This model's maximum context length is 4096 tokens. However, you "
            "requested 5000 tokens. Please reduce the length of the messages or completion.",
            "type": "BadRequestError",
            "param": None,
            "code": 400,
        },
        # llama.cpp server
        {
            "error": {
                "code": 400,
                "message": "the request exceeds the available context size, try increasing it",
                "type": "exceed_context_size_error",
                "n_prompt_tokens": 5000,
                "n_ctx": 4096,
            }
        },
    ],
    ids=["openai", "vllm", "llama.cpp"],
)
async def test_context_overflow_is_recognised(server, settings_for, env, reply):
    server.push(server.raw(400, json.dumps(reply)))
    async with make_client(settings_for(), env=env) as client:
        with pytest.raises(ContextOverflow, match="context window of gpt-4o-mini"):
            await client.chat(ASK)
    assert server.hits == 1


async def test_missing_key_is_reported_before_any_request(settings_for):
    with pytest.raises(MissingAPIKey, match="set OPTIML_LLM_API_KEY or OPENAI_API_KEY"):
        make_client(settings_for(), env={})


async def test_second_identical_request_is_a_cache_hit(server, settings_for, env, secret, tmp_path):
    server.push(server.openai_chat("cached answer", prompt_tokens=100, completion_tokens=10))
    settings = settings_for()
    async with make_client(settings, env=env) as client:
        first = await client.chat(ASK, prompt_id="judge@1")
        second = await client.chat(ASK, prompt_id="judge@1")

    assert server.hits == 1
    assert (second.text, second.cached, second.cost_usd) == ("cached answer", True, 0.0)
    assert second.key == first.key
    assert client.accounting.cache_hits == 1
    assert client.accounting.requests == 1
    entries = list((tmp_path / "cache").rglob("*.json"))
    assert [entry.stem for entry in entries] == [first.key]
    assert "authorization" not in entries[0].read_text().lower()


async def test_a_new_client_reads_the_cache_a_previous_one_wrote(server, settings_for, env):
    server.push(server.openai_chat("remembered"))
    settings = settings_for()
    async with make_client(settings, env=env) as client:
        await client.chat(ASK)
    async with make_client(settings, env=env) as client:
        assert (await client.chat(ASK)).cached
    assert server.hits == 1


@pytest.mark.parametrize(
    "change",
    [
        {"prompt_id": "judge@2"},
        {"temperature": 0.7},
        {"max_tokens": 99},
        {"messages": ASK[:1] + [{"role": "user", "content": "Judge that."}]},
    ],
)
async def test_anything_that_changes_the_answer_changes_the_key(server, settings_for, env, change):
    server.push(server.openai_chat("one"), server.openai_chat("two"))
    async with make_client(settings_for(), env=env) as client:
        await client.chat(ASK, prompt_id="judge@1")
        kwargs = {"prompt_id": "judge@1", **change}
        messages = kwargs.pop("messages", ASK)
        assert not (await client.chat(messages, **kwargs)).cached
    assert server.hits == 2


async def test_identical_concurrent_requests_are_paid_once(server, settings_for, env):
    server.push(server.openai_chat("shared", completion_tokens=3))
    server.script[0].delay_s = 0.05
    async with make_client(settings_for(), env=env) as client:
        results = await asyncio.gather(*(client.chat(ASK) for _ in range(3)))
    assert server.hits == 1
    assert sorted(r.cached for r in results) == [False, True, True]


async def test_cache_can_be_bypassed_per_call_and_records_the_fresh_answer(
    server, settings_for, env
):
    server.push(server.openai_chat("a"), server.openai_chat("b"))
    async with make_client(settings_for(), env=env) as client:
        await client.chat(ASK)
        assert (await client.chat(ASK, use_cache=False)).text == "b"
        assert (await client.chat(ASK)).text == "b"
    assert server.hits == 2


async def test_replay_serves_recorded_answers_with_the_server_gone(server, settings_for, env):
    server.push(server.openai_chat(json.dumps(VERDICT)), server.openai_chat("plain"))
    async with make_client(settings_for(), env=env) as client:
        await client.structured(ASK, Verdict, prompt_id="judge@1")
        await client.chat(ASK)
    server.stop()

    async with make_client(settings_for(replay=True), env={}) as replay:
        assert await replay.structured(ASK, Verdict, prompt_id="judge@1") == Verdict(**VERDICT)
        assert (await replay.chat(ASK)).text == "plain"
        with pytest.raises(ReplayMiss, match="run without --replay"):
            await replay.chat([{"role": "user", "content": "never asked"}])
    assert replay.accounting.cache_hits == 2
    assert replay.accounting.requests == 0


async def test_budget_stops_a_request_before_it_is_sent(server, settings_for, env):
    # gpt-4o: $2.50 in, $10 out per million; 2048 output tokens alone may cost about $0.02.
    server.push(server.openai_chat(prompt_tokens=1000, completion_tokens=1000))
    settings = settings_for(model="gpt-4o", budget_usd=0.03)
    async with make_client(settings, env=env) as client:
        await client.chat(ASK)  # costs $0.0125
        with pytest.raises(BudgetExceeded, match="budget of \\$0.0300 would be exceeded"):
            await client.chat(ASK + [ASK[1]])
    assert server.hits == 1
    assert client.accounting.cost_usd == pytest.approx(0.0125)


async def test_a_shared_accounting_budgets_the_whole_job(server, settings_for, env):
    job = Accounting(budget_usd=0.001)
    async with make_client(settings_for(model="gpt-4o"), env=env, accounting=job) as client:
        with pytest.raises(BudgetExceeded):
            await client.chat(ASK)
    assert server.hits == 0


async def test_cached_answers_are_free_even_over_budget(server, settings_for, env):
    server.push(server.openai_chat())
    async with make_client(settings_for(), env=env) as client:
        await client.chat(ASK)
    async with make_client(settings_for(budget_usd=0.0), env=env) as client:
        assert (await client.chat(ASK)).cached


async def test_budget_without_a_price_is_a_config_error(settings_for, env):
    from optiml.llm import ConfigError

    with pytest.raises(ConfigError, match="price of gpt-9 is unknown"):
        make_client(settings_for(model="gpt-9", budget_usd=1.0), env=env)


async def test_user_prices_override_the_table(server, settings_for, env):
    from optiml.llm import Price

    server.push(server.openai_chat(prompt_tokens=1_000_000, completion_tokens=0))
    settings = settings_for(model="gpt-9", prices={"gpt-9": Price(input=3.0, output=4.0)})
    async with make_client(settings, env=env) as client:
        assert (await client.chat(ASK)).cost_usd == pytest.approx(3.0)


async def test_concurrency_is_limited_per_provider(server, settings_for, env):
    for index in range(6):
        server.push(server.openai_chat(f"answer {index}"))
        server.script[-1].delay_s = 0.04
    settings = settings_for(max_concurrency=2)
    async with make_client(settings, env=env) as one, make_client(settings, env=env) as two:
        await asyncio.gather(
            *(
                client.chat([{"role": "user", "content": f"q{i}"}])
                for i, client in enumerate([one, two] * 3)
            )
        )
    assert server.hits == 6
    assert server.max_active == 2


async def test_cancelling_a_request_closes_its_connection(server, settings_for, env):
    server.push(server.openai_chat())
    server.script[0].hang = True
    async with make_client(settings_for(timeout_s=30), env=env) as client:
        task = asyncio.create_task(client.chat(ASK))
        while server.hits == 0:
            await asyncio.sleep(0.01)
        started = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert time.monotonic() - started < 0.5
        deadline = time.monotonic() + 2
        while server.disconnects == 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
    assert server.disconnects == 1
    assert client.accounting.failures == 1
    assert client.accounting.requests == 0
