"""The parts with no network: backoff arithmetic, retry-after parsing, the cache, the accounting,
prices, reply parsing and the prompt templates."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from optiml.llm import (
    Accounting,
    BudgetExceeded,
    ChatResult,
    LLMSettings,
    Offline,
    PromptError,
    RetryPolicy,
    Usage,
    load_prompt,
    make_client,
    prompt_names,
)
from optiml.llm.cache import ResponseCache, cache_key
from optiml.llm.prices import price_for
from optiml.llm.prompts import parse_template, prompt_template
from optiml.llm.retry import parse_retry_after
from optiml.llm.structured import ReplyProblem, parse_reply


@settings(max_examples=50, database=None)
@given(
    retry=st.integers(min_value=1, max_value=40),
    draw=st.floats(min_value=0, max_value=1),
    retry_after=st.none() | st.floats(min_value=0, max_value=60),
)
def test_every_wait_is_within_the_documented_bounds(retry, draw, retry_after):
    policy = RetryPolicy(random=lambda: draw)
    low, high = policy.backoff_bounds(retry)
    assert high == min(policy.max_delay_s, policy.base_delay_s * 2 ** (retry - 1))
    assert low == high / 2
    delay = policy.delay(retry, retry_after)
    assert delay is not None
    assert low <= delay <= max(high, retry_after or 0)
    if retry_after is not None:
        assert delay >= retry_after


def test_a_retry_after_beyond_the_limit_gives_no_delay():
    assert RetryPolicy(max_retry_after_s=10).delay(1, 11) is None


@pytest.mark.parametrize(
    ("headers", "seconds"),
    [
        ({"retry-after": "7"}, 7.0),
        ({"retry-after": "0.5"}, 0.5),
        ({"retry-after-ms": "250", "retry-after": "9"}, 0.25),
        ({"retry-after": "Wed, 21 Oct 2015 07:28:10 GMT"}, 10.0),
        ({"retry-after": "soon"}, None),
        ({}, None),
    ],
)
def test_retry_after_headers(headers, seconds):
    now = 1445412480.0  # Wed, 21 Oct 2015 07:28:00 GMT
    assert parse_retry_after(headers, now=lambda: now) == seconds


def test_cache_keys_are_canonical():
    assert cache_key({"a": 1, "b": [1, 2]}) == cache_key({"b": [1, 2], "a": 1})
    assert cache_key({"a": 1}) != cache_key({"a": 2})


def test_cache_round_trip_and_unreadable_entries(tmp_path: Path, secret: str):
    cache = ResponseCache(tmp_path, secrets=[secret])
    result = ChatResult(text="answer", model="m", provider="openai", cost_usd=0.5)
    key = cache_key({"q": 1})
    cache.put(key, {"messages": [{"role": "user", "content": f"my key is {secret}"}]}, result)
    assert cache.get(key).text == "answer"
    assert secret not in cache.path(key).read_text()
    assert json.loads(cache.path(key).read_text())["response"]["cost_usd"] == 0.5

    cache.path(key).write_text("{ torn")
    assert cache.get(key) is None
    assert cache.get(cache_key({"q": 2})) is None


def test_budget_reservations_count_requests_in_flight():
    accounting = Accounting(budget_usd=1.0)
    with accounting.reserve(0.6):
        with (
            pytest.raises(BudgetExceeded, match="\\$0.6000 more in flight"),
            accounting.reserve(0.6),
        ):
            pass
        accounting.settle(Usage(input_tokens=10, output_tokens=5), 0.25)
    with accounting.reserve(0.75):
        accounting.settle(Usage(), 0.75)
    assert accounting.cost_usd == 1.0
    assert accounting.remaining_usd == 0.0
    with pytest.raises(BudgetExceeded), accounting.reserve(0.01):
        pass
    assert accounting.failures == 0  # a refused reservation sent nothing, so nothing failed


def test_a_failed_request_costs_nothing():
    accounting = Accounting(budget_usd=1.0)
    with pytest.raises(RuntimeError), accounting.reserve(0.9):
        raise RuntimeError("connection reset")
    assert (accounting.failures, accounting.cost_usd) == (1, 0.0)
    with accounting.reserve(0.9):
        pass  # the failed request's reservation was released


@pytest.mark.parametrize(
    ("provider", "model", "price"),
    [
        ("openai", "gpt-4o", 2.5),
        ("openai", "gpt-4o-2024-08-06", 2.5),
        ("openai", "gpt-4o-mini", 0.15),
        ("openai", "gpt-5.4-mini", None),  # not priced as gpt-5
        ("anthropic", "claude-sonnet-4-5-20250929", 3.0),
        ("anthropic", "gpt-4o", None),
        ("openai-compatible", "llama-3", None),
    ],
)
def test_price_lookup(provider, model, price):
    found = price_for(provider, model, {})
    assert (found.input if found else None) == price


class Edit(BaseModel):
    title: str
    lines: list[int]


@pytest.mark.parametrize(
    "text",
    [
        '{"title": "t", "lines": [1]}',
        '```json\n{"title": "t", "lines": [1]}\n```',
        'Sure! Here is the edit:\n{"title": "t", "lines": [1]}\nHope it helps.',
    ],
)
def test_replies_parse_with_or_without_wrapping(text):
    assert parse_reply(text, Edit) == Edit(title="t", lines=[1])


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "empty"),
        ('{"title": "t", "lines": [1}', "not valid JSON"),
        ('{"title": "t"}', "lines: Field required"),
        ('["not", "an", "object"]', "(top level)"),
    ],
)
def test_reply_problems_are_stated(text, problem):
    with pytest.raises(ReplyProblem, match=problem.replace("(", r"\(").replace(")", r"\)")):
        parse_reply(text, Edit)


def test_every_shipped_prompt_renders():
    names = prompt_names()
    assert {"edit_proposal", "judge", "aggregator"} <= set(names)
    assert len([n for n in names if n.startswith("expert_")]) >= 3
    for name in names:
        template = prompt_template(name)
        assert template.version and template.description
        rendered = load_prompt(name, **{v: f"<{v} $HOME ${{x}}>" for v in template.variables})
        assert rendered.id == f"{name}@{template.version}"
        assert "$" not in rendered.text.replace("$HOME", "").replace("${x}", "")
        for variable in template.variables:
            assert f"<{variable} $HOME ${{x}}>" in rendered.text
        roles = [m.role for m in rendered.messages()]
        if name.startswith("generate_strategy_"):
            assert roles == ["user"]  # a fragment of an expert's prompt, read as its text
        else:
            assert roles == ["system", "user"]


def test_rendering_needs_exactly_the_variables():
    with pytest.raises(PromptError, match="missing profile"):
        load_prompt("expert_memory", code="x")
    with pytest.raises(PromptError, match="unknown extra"):
        load_prompt("expert_memory", code="x", profile="y", extra="z")
    with pytest.raises(PromptError, match="no prompt named nope"):
        load_prompt("nope")
    with pytest.raises(PromptError, match="not a prompt name"):
        load_prompt("../settings")


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("hello $who", "first line must be `version: N`"),
        ("version: 1\nvariables: who\n\n== user ==\nhi $who\n== user ==\nagain", "appears twice"),
        ("version: 1\nvariables: who\n\nhi $whom", "lists \\['who'\\] but the text uses"),
        ("version: 1\n\n== system ==\nonly a system part", "user section is empty"),
        ("version: 1\n\nstray\n== user ==\nhi", "text before the first"),
        ("version: 1\n\ncosts $5", "neither `\\$\\$` nor `\\$name`"),
    ],
)
def test_malformed_templates_are_refused(text, problem):
    with pytest.raises(PromptError, match=problem):
        parse_template("t", text)


def test_a_template_without_sections_is_all_user():
    template = parse_template("t", "version: 3\nvariables: who\n\nhello $who, that is $$5")
    rendered = template.render(who="you")
    assert (rendered.system, rendered.user, rendered.id) == (None, "hello you, that is $5", "t@3")


async def test_offline_sends_nothing_and_says_so():
    client = make_client(LLMSettings(), env={})
    assert client.offline
    with pytest.raises(Offline):
        await client.chat([{"role": "user", "content": "hi"}])
    await client.aclose()


def test_a_client_can_be_made_outside_an_event_loop(tmp_path: Path):
    settings = LLMSettings(provider="openai", model="gpt-4o", cache_dir=tmp_path)
    client = make_client(settings, env={"OPENAI_API_KEY": "k"})
    asyncio.run(client.aclose())


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://user:secret@127.0.0.1:8000/v1/?api_key=x#top", "http://127.0.0.1:8000/v1"),
        ("http://[::1]:11434/v1", "http://[::1]:11434/v1"),
        ("https://api.anthropic.com", "https://api.anthropic.com"),
    ],
)
def test_urls_are_shown_without_credentials(url, shown):
    from optiml.llm.providers import display_url

    assert display_url(url) == shown
