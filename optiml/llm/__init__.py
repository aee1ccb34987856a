"""OptiML's LLM layer: one async interface for chat and structured output over OpenAI, Anthropic,
OpenAI-compatible servers and `offline`, with retries, a response cache, replay and accounting.

It knows nothing of kernels; callers bring the prompts (`load_prompt`) and the pydantic schemas.
"""

from optiml.llm.accounting import Accounting
from optiml.llm.check import LLMCheckReport, check_llm
from optiml.llm.client import LLMClient, make_client
from optiml.llm.errors import (
    AuthenticationFailed,
    BudgetExceeded,
    ConfigError,
    ContextOverflow,
    InvalidStructuredOutput,
    LLMError,
    LLMExitCode,
    MissingAPIKey,
    ModelNotFound,
    Offline,
    ProviderUnavailable,
    RateLimited,
    Refused,
    ReplayMiss,
    RequestRejected,
    RequestTimeout,
)
from optiml.llm.messages import ChatResult, Message, Usage
from optiml.llm.prices import DEFAULT_PRICES, Price
from optiml.llm.prompts import PromptError, RenderedPrompt, load_prompt, prompt_names
from optiml.llm.retry import RetryPolicy
from optiml.llm.settings import ApiKey, LLMSettings, load_settings, resolve_api_key

__all__ = [
    "DEFAULT_PRICES",
    "Accounting",
    "ApiKey",
    "AuthenticationFailed",
    "BudgetExceeded",
    "ChatResult",
    "LLMCheckReport",
    "ConfigError",
    "ContextOverflow",
    "InvalidStructuredOutput",
    "LLMClient",
    "LLMError",
    "LLMExitCode",
    "LLMSettings",
    "Message",
    "MissingAPIKey",
    "ModelNotFound",
    "Offline",
    "Price",
    "PromptError",
    "ProviderUnavailable",
    "RateLimited",
    "Refused",
    "RenderedPrompt",
    "ReplayMiss",
    "RequestRejected",
    "RequestTimeout",
    "RetryPolicy",
    "Usage",
    "load_prompt",
    "load_settings",
    "make_client",
    "prompt_names",
    "resolve_api_key",
    "check_llm",
]
