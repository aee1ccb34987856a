"""The options of `optiml generate`'s Mixture-of-Thoughts path, kept apart from the work so that
the command line loads no more than click to declare them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import click


@dataclass(frozen=True)
class MotOptions:
    enabled: bool = False  # --mot: the LLM path for a formula or --from-torch too
    experts: int = 4
    repairs: int = 2
    replay: bool = False


def mot_options(command: Callable) -> Callable:
    """--mot, --experts, --repairs and --replay, given to the command as `mot: MotOptions`."""

    for decorator in reversed(
        [
            click.option(
                "--mot",
                is_flag=True,
                help="With a formula or --from-torch, take the LLM's Mixture-of-Thoughts path "
                "too (the formula's float64 reference has the final say); prose always does.",
            ),
            click.option(
                "--experts",
                type=click.IntRange(1, 8),
                default=4,
                show_default=True,
                help="LLM experts that draft and revise (memory traffic, parallelism, simplest "
                "correct, numerics, in turn).",
            ),
            click.option(
                "--repairs",
                type=click.IntRange(0, 10),
                default=2,
                show_default=True,
                help="Repair rounds for a final kernel that fails its check, within the LLM budget.",
            ),
            click.option(
                "--replay",
                is_flag=True,
                help="Answer every LLM request from the recorded responses; nothing is sent.",
            ),
        ]
    ):
        command = decorator(command)
    return command


def collect(mot: bool, experts: int, repairs: int, replay: bool) -> MotOptions:
    return MotOptions(mot, experts, repairs, replay)
