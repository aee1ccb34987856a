"""The `optiml llm` command group: `optiml llm check` shows the configured provider and model and
proves they work with one tiny request. `run_check` is the same check for the editor.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click
from pydantic import BaseModel

from optiml.llm.client import make_client
from optiml.llm.errors import LLMError
from optiml.llm.providers import display_url
from optiml.llm.settings import DEFAULT_BASE_URLS, load_settings, resolve_api_key

_PROBE = "Reply with the single word: ok"
_PROBE_TOKENS = 16


class CheckReport(BaseModel):
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


async def run_check(
    cli_overrides: Mapping[str, Any] | None = None,
    editor_settings: Mapping[str, Any] | None = None,
    start_dir: Path | None = None,
    *,
    env: Mapping[str, str] | None = None,
) -> CheckReport:
    """Load the settings as a real run would, then send one tiny request past cache and budget."""
    try:
        settings = load_settings(cli_overrides, editor_settings, start_dir, env=env)
    except LLMError as error:
        return CheckReport(error=str(error), exit_code=int(error.exit_code))
    key = resolve_api_key(settings.provider, env)
    base_url = settings.base_url or DEFAULT_BASE_URLS.get(settings.provider)
    report = CheckReport(
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


@click.group("llm")
def llm_group() -> None:
    """Configure and check the LLM provider."""


@llm_group.command("check")
@click.option(
    "--provider", type=click.Choice(["openai", "anthropic", "openai-compatible", "offline"])
)
@click.option("--model", help="Model name, e.g. the one your server serves.")
@click.option("--base-url", help="Endpoint, e.g. http://127.0.0.1:8000/v1 for vLLM.")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), help="Seconds per request.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def check(
    provider: str | None,
    model: str | None,
    base_url: str | None,
    timeout: float | None,
    as_json: bool,
) -> None:
    """Say which provider and model are configured, and make one tiny request.

    Exit codes: 0 works (or offline), 20 no API key, 21 key rejected, 22 provider unreachable or
    timed out, 23 any other LLM or settings error.
    """
    overrides = {"provider": provider, "model": model, "base_url": base_url, "timeout_s": timeout}
    report = asyncio.run(run_check(overrides, start_dir=Path.cwd()))
    if as_json:
        click.echo(json.dumps(report.model_dump(), indent=2))
    else:
        _print(report)
    click.get_current_context().exit(report.exit_code)


def _print(report: CheckReport) -> None:
    if report.provider is not None:
        model = report.model or "-"
        if report.served_model and report.served_model != report.model:
            model += f" (answered as {report.served_model})"
        rows = [
            ("provider", report.provider),
            ("model", model),
            ("base URL", report.base_url or "-"),
            ("API key", f"from ${report.key_source}" if report.key_source else "none"),
        ]
        for label, value in rows:
            click.echo(f"{label:<9} {value}")
    if report.note:
        click.echo(f"{'request':<9} {report.note}")
    elif report.ok:
        cost = "unpriced" if report.cost_usd is None else f"${report.cost_usd:.6f}"
        click.echo(
            f"{'request':<9} ok in {report.latency_s:.2f} s: {report.input_tokens} tokens in, "
            f"{report.output_tokens} out, {cost}"
        )
    if report.error:
        click.echo(f"error: {report.error}", err=True)


# `optiml.cli` registers the group under this name.
llm = llm_group
