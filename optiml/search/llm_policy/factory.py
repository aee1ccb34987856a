"""The LLM policy and the LLM judge's review made from an `OptimizeRequest` and the LLM
settings it resolves (command line, editor, `optiml.toml`, environment)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from optiml.cuda.source import SourceFile
from optiml.llm import (
    ConfigError,
    LLMClient,
    LLMSettings,
    load_settings,
    make_client,
    resolve_api_key,
)
from optiml.search.llm_policy.policy import LLMPolicy
from optiml.search.llm_policy.record import AnswerLog
from optiml.search.llm_policy.review import make_llm_review
from optiml.search.request import OptimizeRequest
from optiml.search.trajectory import Measurement
from optiml.search.variant import Variant


def llm_settings(request: OptimizeRequest) -> LLMSettings:
    overrides = {k: v for k, v in (request.llm_overrides or {}).items() if v is not None}
    start = Path(request.file).expanduser().resolve().parent
    return load_settings(
        cli_overrides=overrides, editor_settings=request.editor_settings, start_dir=start
    )


def make_llm_policy(
    request: OptimizeRequest, out_dir: Path
) -> tuple[LLMPolicy, Callable[[Variant, Measurement], Awaitable[dict[str, Any]]], LLMClient]:
    """The LLM policy, the LLM judge's review and the client they share (the caller closes it).

    Raises `ConfigError` when no provider is configured (or it is `offline`) and `MissingAPIKey`
    when the provider's key is not set, before any search work. `out_dir` is the run's folder;
    the answers are kept in the response cache (the settings' `cache_dir`), not there, so a run
    with another `--out` replays them."""
    settings = llm_settings(request)
    if settings.provider == "offline":
        raise ConfigError(
            "--policy llm needs an LLM provider and none is configured: set --provider and "
            "--model (or OPTIML_LLM_PROVIDER and OPTIML_LLM_MODEL, or [llm] in optiml.toml; "
            "see docs/llm.md), or use --policy offline"
        )
    client = make_client(settings)
    key = resolve_api_key(settings.provider)
    log = None
    if settings.cache and settings.cache_dir is not None:
        log = AnswerLog(settings.cache_dir / "by-code", (key.reveal(),) if key else ())
    policy = LLMPolicy(client, arch=request.arch, log=log)
    if request.text is not None:
        original = request.text
    elif request.original_text:
        original = request.original_text
    else:
        original = SourceFile.read(request.file).text
    review = make_llm_review(client, original, str(request.file), request.kernel, log=log)
    return policy, review, client
