"""The content-addressed response cache: one JSON file per request, named by the request's sha256.

The key covers what determines the answer (provider, model, endpoint, messages, parameters, schema,
prompt version) and nothing that identifies the caller: no key, no header, no timeout.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from optiml.llm.errors import redact
from optiml.llm.messages import ChatResult

log = logging.getLogger("optiml.llm")

# Bumped whenever the key material or the entry layout changes, so old entries simply miss.
CACHE_FORMAT = 1


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def cache_key(material: Mapping[str, Any]) -> str:
    return hashlib.sha256(canonical_json({"format": CACHE_FORMAT, **material}).encode()).hexdigest()


class ResponseCache:
    """Entries live at `DIR/ab/abcdef….json`; a torn or foreign file reads as a miss."""

    def __init__(self, directory: Path, secrets: Sequence[str] = ()):
        self.directory = directory
        self._secrets = tuple(s for s in secrets if s)

    def path(self, key: str) -> Path:
        return self.directory / key[:2] / f"{key}.json"

    def get(self, key: str) -> ChatResult | None:
        path = self.path(key)
        try:
            entry = json.loads(path.read_text(encoding="utf-8"))
            if entry.get("format") != CACHE_FORMAT or entry.get("key") != key:
                raise ValueError("not an entry of this cache format")
            return ChatResult.model_validate(entry["response"])
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError, AttributeError, ValidationError) as error:
            log.warning("ignoring unreadable cache entry %s: %s", path, error)
            return None

    def put(self, key: str, material: Mapping[str, Any], result: ChatResult) -> None:
        entry = {
            "format": CACHE_FORMAT,
            "key": key,
            "request": material,
            "response": result.model_dump(mode="json", exclude={"cached", "key"}),
        }
        # The request's messages are the user's text; should a secret be in them, it is not
        # written out (the key above is a hash, so it reveals nothing).
        text = redact(
            json.dumps(entry, indent=1, ensure_ascii=False), self._secrets, key_shaped=False
        )
        path = self.path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        # Write then rename, so a concurrent reader or a crash never sees half an entry.
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(text)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
