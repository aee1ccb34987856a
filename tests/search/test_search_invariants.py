"""Properties of every search on the toy, whatever the config: budgets hold, no state is evaluated
twice, and each node's statistics are exactly those of the evaluations backed up below it."""

from __future__ import annotations

import asyncio
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from optiml.search import Search, SearchConfig, StopReason
from tests.search.toy import AsyncToy, Toy

configs = st.builds(
    SearchConfig,
    seed=st.integers(0, 2**32),
    c_puct=st.floats(0.0, 4.0),
    fpu_reduction=st.floats(0.0, 1.0),
    widening_c=st.floats(0.5, 3.0),
    widening_alpha=st.floats(0.0, 1.0),
    backup=st.sampled_from(["max", "mean"]),
    parallelism=st.integers(1, 4),
    ordered=st.booleans(),
    fill_slots=st.booleans(),
)


@settings(max_examples=30, deadline=None)
@given(
    config=configs,
    budget=st.integers(0, 40),
    dead_repeats=st.booleans(),
    priors=st.sampled_from(["informative", "uniform", "misleading"]),
    threads=st.booleans(),
)
def test_statistics_budgets_and_widening_hold(config, budget, dead_repeats, priors, threads):
    toy = (Toy if threads else AsyncToy)(priors=priors, dead_repeats=dead_repeats)
    search = Search(toy, (), config)
    result = asyncio.run(search.run(max_evaluations=budget))

    assert result.evaluations == len(toy.log) <= budget
    assert result.stop is StopReason.EVALUATIONS or result.evaluations < budget
    assert not toy.calls or max(toy.calls.values()) == 1
    assert len(search.pending) < config.parallelism  # only results an uninterrupted run defers

    for node in search.nodes:
        below = _subtree(node)
        backed = [n for n in below if n.evaluated and not n.pending]
        rewards = [n.reward for n in backed if n.reward is not None]
        assert node.visits == len(backed) and node.live_visits == len(rewards)
        assert math.isclose(node.value_sum, sum(rewards), abs_tol=1e-9)
        assert node.max_reward == max(rewards, default=None)
        assert node.virtual == sum(n.pending for n in below)
        assert not (node.dead and node.children)
        closed = any(child.closed for child in node.children)
        if not dead_repeats and not closed and not config.fill_slots:
            width = math.ceil(
                config.widening_c * (node.visits + node.virtual) ** config.widening_alpha
            )
            assert len(node.children) <= width
    live = [node for node in search.nodes if node.evaluated and not node.dead]
    assert result.best_reward == max((node.reward for node in live), default=None)


def _subtree(node):
    nodes, stack = [], [node]
    while stack:
        nodes.append(stack.pop())
        stack.extend(nodes[-1].children)
    return nodes
