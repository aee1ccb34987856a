"""`optiml llm`: configure and check the LLM provider."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import click

from optiml.api import LLMCheckReport, check_llm


@click.group("llm")
def llm_group() -> None:
    """Configure and check the LLM provider."""


@llm_group.command("check")
@click.option(
    "--provider",
    type=click.Choice(["openai", "anthropic", "openai-compatible", "offline"]),
    help="LLM provider (default: OPTIML_LLM_PROVIDER, else optiml.toml or pyproject.toml, else "
    "offline; see docs/llm.md).",
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
    report = asyncio.run(check_llm(overrides, start_dir=Path.cwd()))
    if as_json:
        click.echo(json.dumps(report.model_dump(), indent=2))
    else:
        _print(report)
    click.get_current_context().exit(report.exit_code)


def _print(report: LLMCheckReport) -> None:
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
