"""The MCTS core on the toy problem: it finds the optimum, priors and widening act as specified, dead
nodes stay dead, virtual loss spreads evaluations, runs are reproducible, budgets and stops hold."""

from __future__ import annotations

import asyncio
import inspect
import math
import random
import statistics
import sys
import threading
import time
from collections.abc import Callable

import pytest

from optiml.search import Evaluation, Progress, Search, SearchConfig, StopReason
from tests.search.toy import DIGITS, OPTIMUM, TARGET, AsyncToy, Toy, reward


def first_optimum(search: Search) -> int | None:
    """How many evaluations the search had started when it started the optimum's."""
    orders = [node.order for node in search.nodes if node.evaluated and node.reward == OPTIMUM]
    return min(orders) + 1 if orders else None


def optimum_found(search: Search) -> Callable[[], bool]:
    return lambda: search.best is not None and search.best.reward == OPTIMUM


async def test_finds_the_optimum_within_a_budget():
    for seed in range(3):
        search = Search(AsyncToy(priors="uniform"), (), SearchConfig(seed=seed))
        result = await search.run(max_evaluations=200)
        assert result.best_reward == OPTIMUM
        assert result.path == list(TARGET)
        assert result.best is not None and result.best.state == TARGET
        assert result.stop is StopReason.EVALUATIONS
        assert result.evaluations == result.total_evaluations == 200


async def test_mean_backup_finds_the_optimum_too():
    search = Search(Toy("uniform"), (), SearchConfig(seed=0, backup="mean"))
    assert (await search.run(max_evaluations=200)).best_reward == OPTIMUM


async def test_informative_priors_need_fewer_evaluations_than_uniform_ones_and_misleading_more():
    needed = {}
    for priors in ("informative", "uniform", "misleading"):
        runs = []
        for seed in range(4):
            search = Search(AsyncToy(priors=priors), (), SearchConfig(seed=seed))
            await search.run(max_evaluations=300, should_stop=optimum_found(search))
            runs.append(first_optimum(search))
        assert None not in runs, priors
        needed[priors] = statistics.mean(runs)
    assert needed["informative"] < needed["uniform"] < needed["misleading"]
    # Informative priors lead straight there: the root and one evaluation per digit.
    assert needed["informative"] == len(TARGET) + 1


async def test_beats_random_search_at_equal_budget():
    budget = 60
    for seed in range(5):
        search = Search(Toy("uniform"), (), SearchConfig(seed=seed))
        mcts = (await search.run(max_evaluations=budget)).best_reward
        rng = random.Random(seed)
        samples = [tuple(rng.choice(DIGITS) for _ in TARGET) for _ in range(budget)]
        baseline = max((r for r in map(reward, samples) if r is not None), default=None)
        assert baseline is not None and mcts > baseline, seed


@pytest.mark.parametrize(("widening_c", "alpha"), [(1.0, 0.5), (2.0, 0.3), (1.0, 0.0)])
async def test_progressive_widening_limits_children(widening_c, alpha):
    # No dead states and no end: the only widening is the specified one.
    toy = Toy("uniform", dead_repeats=False, max_length=None)
    config = SearchConfig(seed=1, widening_c=widening_c, widening_alpha=alpha)
    search = Search(toy, (), config)
    await search.run(max_evaluations=80)
    assert not search.pending
    for node in search.nodes:
        assert len(node.children) <= math.ceil(widening_c * node.visits**alpha)
    assert max(len(node.children) for node in search.nodes) > (1 if alpha else 0)
    if alpha == 0:  # one child per node: the tree is a line
        assert max(node.depth for node in search.nodes) == 80 - 1


async def test_a_line_deeper_than_python_s_recursion_limit():
    # widening_alpha=0 allows one child per node: the tree is a line as deep as the evaluations.
    search = Search(
        AsyncToy(dead_repeats=False, max_length=None), (), SearchConfig(widening_alpha=0)
    )
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(len(inspect.stack()) + 100)
    try:
        result = await search.run(max_evaluations=200)
    finally:
        sys.setrecursionlimit(limit)
    assert result.evaluations == 200 and max(node.depth for node in search.nodes) == 199


async def test_dead_nodes_are_never_selected_again():
    toy = Toy("uniform")
    search = Search(toy, (), SearchConfig(seed=2))
    await search.run(max_evaluations=150)
    dead = [node for node in search.nodes if node.dead]
    assert len(dead) > 10
    for node in dead:
        assert node.children == [] and not node.exhausted
    assert max(toy.calls.values()) == 1  # no state, dead or alive, is evaluated twice


async def test_a_node_whose_children_all_die_widens_then_closes():
    class Doomed(Toy):
        def evaluate(self, state):
            return Evaluation(0.0 if state == () else None)

    search = Search(Doomed("uniform"), (), SearchConfig(seed=0))
    result = await search.run(max_evaluations=100)
    assert result.stop is StopReason.EXHAUSTED
    assert result.total_evaluations == 1 + len(DIGITS)
    assert search.root.closed and result.best is search.root and result.path == []


async def test_a_dead_root_ends_the_search():
    class Broken(Toy):
        def evaluate(self, state):
            return Evaluation(None, {"error": "does not compile"})

    result = await Search(Broken(), ()).run(max_evaluations=10)
    assert result.stop is StopReason.EXHAUSTED
    assert result.best is None and result.best_reward is None and result.evaluations == 1
    assert result.root.info == {"error": "does not compile"}


async def test_virtual_loss_spreads_concurrent_selections():
    toy = AsyncToy(delay=lambda state: 0.002)
    result = await Search(toy, (), SearchConfig(seed=0, parallelism=4)).run(max_evaluations=40)
    assert len(toy.peak) == 4  # four distinct states at once (the toy asserts no state twice)
    assert result.evaluations == 40 and max(toy.calls.values()) == 1


@pytest.mark.parametrize("fill", [False, True])
async def test_free_slots_are_filled_past_the_widening_limit(fill):
    """With `fill_slots` every evaluation after the root's begins with all four slots taken (the
    root's six digits and their children are there to take); progressive widening alone (the root's
    limit grows as the square root of its visits in flight) leaves slots free. It still finds the
    optimum and evaluates no state twice."""
    toy = AsyncToy(delay=lambda state: 0.001 * (1 + sum(state) % 3), priors="informative")
    taken: list[int] = []  # slots taken (in flight or awaiting backup) as each evaluation began
    evaluate = toy.evaluate

    async def counting(state):
        taken.append(len(search.pending))
        return await evaluate(state)

    toy.evaluate = counting
    search = Search(toy, (), SearchConfig(seed=0, parallelism=4, fill_slots=fill))
    result = await search.run(max_evaluations=60)
    assert len(taken) == 60 and max(toy.calls.values()) == 1
    if fill:
        assert taken[0] == 1 and set(taken[1:]) == {4}
        assert result.best_reward == OPTIMUM
    else:
        assert min(taken[1:]) < 4


def test_sync_evaluations_run_in_threads_at_once():
    lock = threading.Lock()
    running, peak = set(), [0]

    class Slow(Toy):
        def evaluate(self, state):
            with lock:
                running.add(threading.get_ident())
                peak[0] = max(peak[0], len(running))
            time.sleep(0.005)
            with lock:
                running.discard(threading.get_ident())
            return super().evaluate(state)

    toy = Slow()
    search = Search(toy, (), SearchConfig(seed=0, parallelism=4))
    asyncio.run(search.run(max_evaluations=30))
    assert peak[0] == 4 and len(toy.log) == 30 and max(toy.calls.values()) == 1


async def test_a_seed_makes_a_run_reproducible():
    first = Search(Toy(), (), SearchConfig(seed=5))
    second = Search(Toy(), (), SearchConfig(seed=5))
    await first.run(max_evaluations=50)
    await second.run(max_evaluations=50)
    assert first.to_json() == second.to_json()


async def test_parallel_runs_are_reproducible_whatever_the_completion_order():
    def jitter(state):
        return random.random() * 0.001  # not seeded: results arrive in a different order each run

    trees, logs = [], []
    for _ in range(2):
        toy = AsyncToy(delay=jitter)
        search = Search(toy, (), SearchConfig(seed=3, parallelism=4))
        await search.run(max_evaluations=40)
        trees.append(search.to_json())
        logs.append([node.state for node in sorted(search.nodes, key=_order) if node.evaluated])
    assert trees[0] == trees[1] and logs[0] == logs[1]


async def test_different_seeds_can_differ():
    trees = set()
    for seed in range(4):
        search = Search(Toy(), (), SearchConfig(seed=seed))
        await search.run(max_evaluations=20)
        trees.add(tuple(node.state for node in search.nodes))
    assert len(trees) > 1


async def test_unordered_results_respect_the_budget_and_find_the_optimum():
    toy = AsyncToy(delay=lambda state: random.random() * 0.001)
    config = SearchConfig(seed=0, parallelism=4, ordered=False)
    result = await Search(toy, (), config).run(max_evaluations=200)
    assert result.evaluations == len(toy.log) == 200 and result.best_reward == OPTIMUM


@pytest.mark.parametrize("parallelism", [1, 3])
async def test_the_evaluation_budget_is_respected(parallelism):
    toy = Toy()
    search = Search(toy, (), SearchConfig(parallelism=parallelism))
    result = await search.run(max_evaluations=7)
    assert result.stop is StopReason.EVALUATIONS
    assert result.evaluations == len(toy.log) == 7
    assert all(node.evaluated for node in search.pending)  # in flight at the end, finished


async def test_the_wall_time_budget_is_respected_with_an_injected_clock():
    now = [0.0]

    class Timed(AsyncToy):
        async def evaluate(self, state):
            now[0] += 1.0  # every evaluation takes one second of the injected clock
            return await super().evaluate(state)

    result = await Search(Timed(), ()).run(max_seconds=5.5, clock=lambda: now[0])
    # Evaluations start at 0, 1, ... 5 seconds; the one started at 5 ends at 6, past the budget.
    assert result.stop is StopReason.TIME and result.evaluations == 6 and result.seconds == 6.0


async def test_the_wall_time_budget_cancels_evaluations_in_flight_and_they_run_again_later():
    hang = asyncio.Event()
    toy = AsyncToy()

    async def hang_after_the_root(state):
        if state != ():
            await hang.wait()
        return await AsyncToy.evaluate(toy, state)

    toy.evaluate = hang_after_the_root
    search = Search(toy, (), SearchConfig(parallelism=2))
    began = time.monotonic()
    result = await search.run(max_seconds=0.05)
    assert time.monotonic() - began < 0.5
    assert result.stop is StopReason.TIME and result.evaluations == 1
    stuck = list(search.pending)
    assert stuck and all(not node.evaluated for node in stuck)

    hang.set()
    result = await search.run(max_evaluations=10)
    assert all(node.evaluated for node in stuck)
    assert [node.order for node in stuck] == list(range(1, len(stuck) + 1))
    assert result.evaluations == 10


async def test_a_stop_request_stops_promptly():
    stop = threading.Event()
    toy = AsyncToy()
    evaluate = toy.evaluate

    async def stop_at_the_fourth(state):
        if len(toy.log) == 3:
            stop.set()
            await asyncio.sleep(10)
        return await evaluate(state)

    toy.evaluate = stop_at_the_fourth
    began = time.monotonic()
    result = await Search(toy, ()).run(should_stop=stop.is_set)
    assert time.monotonic() - began < 0.5
    assert result.stop is StopReason.CANCELLED and result.evaluations == 3


async def test_a_stop_cuts_the_wait_for_evaluations_left_at_the_budget():
    release = asyncio.Event()
    stop = threading.Event()
    toy = AsyncToy()
    evaluate = toy.evaluate

    async def hang_after_the_root(state):
        if state != ():
            await release.wait()
        return await evaluate(state)

    toy.evaluate = hang_after_the_root
    asyncio.get_running_loop().call_later(0.02, stop.set)
    search = Search(toy, (), SearchConfig(parallelism=2))
    result = await search.run(max_evaluations=3, should_stop=stop.is_set)
    assert result.stop is StopReason.CANCELLED and result.evaluations == 1
    assert [node.evaluated for node in search.pending] == [False, False]


async def test_one_run_at_a_time():
    toy = AsyncToy(delay=lambda state: 0.01)
    search = Search(toy, ())
    first = asyncio.ensure_future(search.run(max_evaluations=2))
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="already running"):
        await search.run(max_evaluations=2)
    assert (await first).evaluations == 2


async def test_a_stop_requested_before_the_run_starts_nothing():
    toy = Toy()
    result = await Search(toy, ()).run(should_stop=lambda: True)
    assert result.stop is StopReason.CANCELLED and result.evaluations == 0 and toy.log == []


async def test_a_node_prints_as_one_short_line():
    result = await Search(Toy(), ()).run(max_evaluations=50)
    assert "\n" not in repr(result) and len(repr(result)) < 1000
    assert "state" not in repr(result.best) and "children" not in repr(result.root)


async def test_progress_is_reported_after_every_evaluation():
    seen: list[Progress] = []
    search = Search(Toy("informative"), ())
    await search.run(max_evaluations=12, on_progress=seen.append)
    assert [progress.evaluations for progress in seen] == list(range(1, 13))
    bests = [progress.best_reward for progress in seen]
    assert bests == sorted(bests) and bests[-1] == OPTIMUM
    assert [progress.node.state for progress in seen[:3]] == [(), TARGET[:1], TARGET[:2]]
    assert seen[-1].best is search.best


async def test_async_policies_build_the_same_tree_as_sync_ones():
    class AsyncPolicy(Toy):
        async def propose(self, node, k, rng):
            await asyncio.sleep(0)
            return super().propose(node, k, rng)

    sync, asynchronous = Search(Toy(), ()), Search(AsyncPolicy(), ())
    await sync.run(max_evaluations=30)
    await asynchronous.run(max_evaluations=30)
    assert sync.to_json() == asynchronous.to_json()


async def test_duplicate_proposals_are_dropped_and_a_policy_with_nothing_new_is_asked_no_more():
    asked = []

    class Stubborn(Toy):
        def propose(self, node, k, rng):
            asked.append(node.state)
            return [(1, 1.0), (1, 2.0), (2, 1.0)]  # the same two actions, every time

    toy = Stubborn(dead_repeats=False, max_length=None)
    search = Search(toy, (), SearchConfig(widening_c=3.0))
    await search.run(max_evaluations=4)
    assert [child.action for child in search.root.children] == [1, 2]
    assert search.root.exhausted and asked.count(()) == 2  # two new, then nothing new


async def test_the_caller_s_errors_are_raised():
    class Failing(Toy):
        def evaluate(self, state):
            raise RuntimeError("executor bug")

    class NaN(Toy):
        def evaluate(self, state):
            return Evaluation(math.nan)

    class Negative(Toy):
        def propose(self, node, k, rng):
            return [(1, -1.0)]

    with pytest.raises(RuntimeError, match="executor bug"):
        await Search(Failing(), ()).run(max_evaluations=3)
    with pytest.raises(ValueError, match="finite"):
        await Search(NaN(), ()).run(max_evaluations=3)
    with pytest.raises(ValueError, match="priors"):
        await Search(Negative(), ()).run(max_evaluations=3)
    with pytest.raises(ValueError, match="parallelism"):
        SearchConfig(parallelism=0)


def _order(node):
    return node.order if node.order is not None else -1


def test_a_node_whose_children_close_mid_descent_is_widened_again():
    """Regression: the root had two children, both leaves whose policy proposes nothing; they were
    closed during the descent after the root's widening check, and the search stopped as
    'exhausted' with eight more actions left at the root."""
    from optiml.search.mcts import Evaluation, Search, StopReason

    class Leaves:
        def propose(self, node, k, rng):
            return [(i, 1.0) for i in range(10)] if node.depth == 0 else []

        def apply(self, state, action):
            return action

        def evaluate(self, state):
            return Evaluation(reward=float(state or 0))

        def action_key(self, action):
            return str(action)

    search = Search(Leaves(), None)
    result = asyncio.run(search.run(max_evaluations=50))
    assert result.evaluations == 11 and result.stop is StopReason.EXHAUSTED
    assert result.best_reward == 9.0


async def test_a_search_stopped_after_its_root_fills_its_slots_when_it_goes_on():
    # a budget of one evaluation leaves the root recorded but not backed up (see the module's
    # notes on stopping); the next run backs it up first, then fills every slot
    toy = AsyncToy(delay=lambda state: 0.001)
    search = Search(toy, (), SearchConfig(seed=0, parallelism=4, fill_slots=True))
    await search.run(max_evaluations=1)
    result = await search.run(max_evaluations=12)
    assert result.evaluations == 12 and len(toy.peak) == 4
