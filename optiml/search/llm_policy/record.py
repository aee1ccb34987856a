"""The model's answers kept by what they were about, for replay on other measurements.

Replay (`--replay`) answers from the response cache. The prompts hold measured numbers (profile,
speedups, timings), which differ a little from run to run, so each answer is also kept under a key
that holds no measurement (`AnswerLog`: model, prompt version, the code and flags asked about, the
round); a replay whose prompt misses the cache uses that record, so a recorded run replays on
another run's measurements. The same holds for the judge's review.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from optiml.llm import LLMClient, ReplayMiss
from optiml.llm.errors import redact

logger = logging.getLogger(__name__)
T = TypeVar("T", bound=BaseModel)


class AnswerLog:
    """The model's answers by a key that holds no measurement, for replay on other measurements.

    The response cache keys an answer by the whole prompt, measured numbers included; this keys it
    by what was asked about (model, prompt version, the code). One JSON file per answer under
    `directory`, written then renamed; secrets are redacted."""

    def __init__(self, directory: Path, secrets: Iterable[str] = ()):
        self.directory = directory
        self._secrets = tuple(s for s in secrets if s)

    @staticmethod
    def key(client: LLMClient, prompt_id: str, **about: Any) -> tuple[str, dict[str, Any]]:
        s = client.settings
        what = {
            "provider": s.provider,
            "model": s.model,
            "base_url": s.base_url if s.provider == "openai-compatible" else None,
            "prompt": prompt_id,
            **about,
        }
        return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest(), what

    def _path(self, key: str) -> Path:
        return self.directory / key[:2] / f"{key}.json"

    def get(self, key: str, schema: type[T]) -> T | None:
        try:
            entry = json.loads(self._path(key).read_text(encoding="utf-8"))
            return schema.model_validate(entry["answer"])
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError, ValidationError) as e:
            logger.warning("ignoring unreadable recorded answer %s: %s", key[:12], e)
            return None

    def put(self, key: str, what: dict[str, Any], answer: BaseModel) -> None:
        entry = {"key": key, "request": what, "answer": answer.model_dump()}
        text = redact(json.dumps(entry, indent=1), self._secrets, key_shaped=False)
        path = self._path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(text)
            os.replace(tmp, path)
        except OSError as e:
            logger.warning("could not record the answer %s: %s", key[:12], e)


async def structured_with_record(
    client: LLMClient,
    messages: list[Any],
    schema: type[T],
    *,
    prompt_id: str,
    log: AnswerLog | None,
    about: dict[str, Any],
    max_tokens: int | None = None,
) -> T:
    """`client.structured`, and the answer kept in `log` under what it was about; in replay, a
    prompt that is not in the response cache is answered from `log` (else `ReplayMiss`)."""
    key, what = AnswerLog.key(client, prompt_id, **about)
    try:
        answer = await client.structured(
            messages, schema, max_tokens=max_tokens, prompt_id=prompt_id
        )
    except ReplayMiss:
        recorded = log.get(key, schema) if log is not None else None
        if recorded is None:
            raise
        logger.info("replayed the recorded answer for %s", json.dumps(about, sort_keys=True))
        return recorded
    if log is not None and not client.settings.replay:
        log.put(key, what, answer)
    return answer
