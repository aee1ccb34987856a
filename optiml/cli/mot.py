"""`optiml generate`'s flags for the Mixture-of-Thoughts path: --mot, --experts, --repairs and
--replay, and the `MotOptions` they make."""

from __future__ import annotations

from collections.abc import Callable

import click

from optiml.api import MotOptions


def mot_options(command: Callable) -> Callable:
    """--mot, --experts, --repairs and --replay, given to the command as four arguments (`collect`
    makes them one `MotOptions`)."""

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
    """The flags of `mot_options` as the `MotOptions` that `run_generate` takes."""
    return MotOptions(mot, experts, repairs, replay)
