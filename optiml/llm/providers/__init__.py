"""The backends, one per wire format: OpenAI chat completions (also for compatible servers) and
Anthropic messages. `make_backend` picks the one the settings name.
"""

from __future__ import annotations

from optiml.llm.errors import MissingAPIKey
from optiml.llm.providers.base import Backend, display_url
from optiml.llm.settings import KEY_VARS, ApiKey, LLMSettings

__all__ = ["Backend", "display_url", "make_backend"]


def make_backend(settings: LLMSettings, key: ApiKey | None) -> Backend:
    """The backend for `settings.provider`, which must not be `offline`."""
    # The SDKs are imported here, not at the top: importing them takes seconds (anthropic's
    # over two), which offline runs, replays and `optiml --help` should not pay.
    if settings.provider == "anthropic":
        from optiml.llm.providers.anthropic_backend import AnthropicBackend

        if key is None:
            raise _no_key("anthropic")
        return AnthropicBackend(settings, key)
    from optiml.llm.providers.openai_backend import OpenAIBackend

    # OpenAI-compatible servers often check no key at all, so only OpenAI itself needs one.
    if key is None and settings.provider == "openai":
        raise _no_key("openai")
    return OpenAIBackend(settings, key)


def _no_key(provider: str) -> MissingAPIKey:
    return MissingAPIKey(f"no API key for {provider}: set {' or '.join(KEY_VARS[provider])}")
