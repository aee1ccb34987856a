"""The options of `optiml generate`'s Mixture-of-Thoughts path as data; the command line's
flags that fill them are `optiml/cli/mot.py`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MotOptions:
    enabled: bool = False  # --mot: the LLM path for a formula or --from-torch too
    experts: int = 4
    repairs: int = 2
    replay: bool = False
