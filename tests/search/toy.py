"""A toy problem for the search: spell TARGET one digit at a time.

States are tuples of digits; an action appends one. The reward, 10 per digit of TARGET matched from
the start minus one per digit, has one optimum, TARGET itself, reached only by its own sequence.
Two equal digits in a row "fail to compile" (reward None). The policy's priors are informative
(the right digit first), uniform, or misleading (the right digit last).
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from typing import Literal

from optiml.search import Evaluation, Node

TARGET = (3, 1, 4, 1, 5, 2)
DIGITS = range(6)
OPTIMUM = 10 * len(TARGET) - len(TARGET)

Digits = tuple[int, ...]
Priors = Literal["informative", "uniform", "misleading"]


def matched(state: Digits) -> int:
    count = 0
    for digit, wanted in zip(state, TARGET, strict=False):
        if digit != wanted:
            break
        count += 1
    return count


def reward(state: Digits, dead_repeats: bool = True) -> float | None:
    if dead_repeats and any(a == b for a, b in zip(state, state[1:], strict=False)):
        return None
    return 10.0 * matched(state) - len(state)


class Toy:
    """The toy as a `Problem`; counts evaluations per state."""

    def __init__(
        self,
        priors: Priors = "uniform",
        dead_repeats: bool = True,
        max_length: int | None = len(TARGET),
    ):
        self.priors = priors
        self.dead_repeats = dead_repeats
        self.max_length = max_length
        self.calls: Counter[Digits] = Counter()
        self.log: list[Digits] = []

    def propose(
        self, node: Node[Digits, int], k: int, rng: random.Random
    ) -> list[tuple[int, float]]:
        state = node.state
        if self.max_length is not None and len(state) >= self.max_length:
            return []
        right = TARGET[len(state)] if len(state) < len(TARGET) else None
        digits = list(DIGITS)
        rng.shuffle(digits)
        proposals = [(digit, self.prior(digit, right)) for digit in digits]
        # Best prior first (the sort is stable, so equal priors keep the shuffled order).
        proposals.sort(key=lambda proposal: -proposal[1])
        taken = {child.action for child in node.children}
        return [proposal for proposal in proposals if proposal[0] not in taken][:k]

    def prior(self, digit: int, right: int | None) -> float:
        if self.priors == "uniform" or right is None:
            return 1.0
        if self.priors == "informative":
            return 5.0 if digit == right else 1.0
        return 0.05 if digit == right else 1.0

    def apply(self, state: Digits, action: int) -> Digits:
        return (*state, action)

    def evaluate(self, state: Digits) -> Evaluation:
        self.calls[state] += 1
        self.log.append(state)
        value = reward(state, self.dead_repeats)
        return Evaluation(value, {"matched": matched(state)})

    def action_key(self, action: int) -> str:
        return str(action)


class AsyncToy(Toy):
    """The toy with an `async def` evaluation that takes `delay(state)` seconds."""

    def __init__(self, delay=lambda state: 0.0, **options):
        super().__init__(**options)
        self.delay = delay
        self.in_flight: set[Digits] = set()
        self.peak: set[Digits] = set()

    async def evaluate(self, state: Digits) -> Evaluation:
        assert state not in self.in_flight, f"{state} is evaluated twice at once"
        self.in_flight.add(state)
        if len(self.in_flight) > len(self.peak):
            self.peak = set(self.in_flight)
        try:
            await asyncio.sleep(self.delay(state))
            return super().evaluate(state)
        finally:
            self.in_flight.discard(state)
