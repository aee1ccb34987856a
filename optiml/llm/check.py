"""`optiml llm check` as a library: which provider and model the settings name, and one tiny
request past cache and budget; the report names where the key came from, never the key."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from optiml.llm.client import make_client
from optiml.llm.errors import LLMError
from optiml.llm.providers import display_url
from optiml.llm.settings import DEFAULT_BASE_URLS, load_settings, resolve_api_key

_PROBE = "Reply with the single word: ok"
_PROBE_TOKENS = 16


class LLMCheckReport(BaseModel):
    """What `llm check` found; it names where the key came from, never the key."""

    provider: str | None = None
    model: str | None = None
    served_model: str | None = None
    base_url: str | None = None
    key_source: str | None = None
    ok: bool = False
    latency_s: float | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    cost_usd: float | None = None
    reply: str | None = None
    note: str | None = None
    error: str | None = None
    exit_code: int = 0


async def check_llm(
    cli_overrides: Mapping[str, Any] | None = None,
    editor_settings: Mapping[str, Any] | None = None,
    start_dir: Path | None = None,
    *,
    env: Mapping[str, str] | None = None,
) -> LLMCheckReport:
    """Load the settings as a real run would, then send one tiny request past cache and budget."""
    try:
        settings = load_settings(cli_overrides, editor_settings, start_dir, env=env)
    except LLMError as error:
        return LLMCheckReport(error=str(error), exit_code=int(error.exit_code))
    key = resolve_api_key(settings.provider, env)
    base_url = settings.base_url or DEFAULT_BASE_URLS.get(settings.provider)
    report = LLMCheckReport(
        provider=settings.provider,
        model=settings.model,
        base_url=display_url(base_url) if base_url else None,
        key_source=key.source if key else None,
    )
    if settings.provider == "offline":
        return report.model_copy(
            update={"ok": True, "note": "offline: no LLM requests are made (built-in policy)"}
        )
    # A check must reach the provider, now, once: no cache, no replay, no retries, no budget.
    probe = settings.model_copy(
        update={"cache": False, "replay": False, "max_retries": 0, "budget_usd": None}
    )
    try:
        async with make_client(probe, env=env) as client:
            result = await client.chat(
                [{"role": "user", "content": _PROBE}], max_tokens=_PROBE_TOKENS
            )
    except LLMError as error:
        return report.model_copy(update={"error": str(error), "exit_code": int(error.exit_code)})
    return report.model_copy(
        update={
            "ok": True,
            "served_model": result.model,
            "latency_s": round(result.latency_s, 3),
            "input_tokens": result.usage.input_tokens,
            "output_tokens": result.usage.output_tokens,
            "cost_usd": result.cost_usd,
            "reply": result.text.strip()[:40],
        }
    )
