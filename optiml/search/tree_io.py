"""The saved form of a search: a versioned JSON file, written atomically, with codecs that turn the
caller's states and actions into JSON values and back, and the random generator's state.

The tree itself (which fields a node keeps) is `mcts.py`'s; this module owns only the file format.
"""

from __future__ import annotations

import json
import os
import random
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from pydantic import TypeAdapter

State = TypeVar("State")
Action = TypeVar("Action")

FORMAT = "optiml-search/1"


def _identity(value: Any) -> Any:
    return value


@dataclass(frozen=True)
class Codec(Generic[State, Action]):
    """Turns states and actions into JSON values and back; the default is for values that are JSON
    already (strings, numbers, lists, dicts)."""

    encode_state: Callable[[State], Any] = field(default=_identity)
    decode_state: Callable[[Any], State] = field(default=_identity)
    encode_action: Callable[[Action], Any] = field(default=_identity)
    decode_action: Callable[[Any], Action] = field(default=_identity)

    @classmethod
    def for_types(cls, state_type: Any, action_type: Any) -> Codec[Any, Any]:
        """A codec from type annotations through pydantic: tuples, dataclasses, enums and pydantic
        models come back as the types they were, not as the lists and dicts JSON has."""
        states: TypeAdapter[Any] = TypeAdapter(state_type)
        actions: TypeAdapter[Any] = TypeAdapter(action_type)
        return cls(
            encode_state=lambda value: states.dump_python(value, mode="json"),
            decode_state=states.validate_python,
            encode_action=lambda value: actions.dump_python(value, mode="json"),
            decode_action=actions.validate_python,
        )


def rng_state_to_json(rng: random.Random) -> list[Any]:
    version, internal, gauss_next = rng.getstate()
    return [version, list(internal), gauss_next]


def rng_from_json(data: list[Any]) -> random.Random:
    version, internal, gauss_next = data
    rng = random.Random()
    rng.setstate((version, tuple(internal), gauss_next))
    return rng


def write_json(path: str | Path, data: dict[str, Any]) -> None:
    """Write `data` with its format tag. Through a temporary file and a rename, so a job killed
    while saving leaves the previous file, never half of one."""
    path = Path(path)
    text = json.dumps({"format": FORMAT, **data}, allow_nan=False)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write(text)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


def read_json(path: str | Path) -> dict[str, Any]:
    """The data of a file `write_json` wrote; ValueError if it is not a search of this format."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise ValueError(f"{path}: not a saved search of format {FORMAT!r} (found {found!r})")
    return data
