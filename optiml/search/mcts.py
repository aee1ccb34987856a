"""A generic Monte Carlo tree search for optimization: PUCT selection over the caller's priors,
progressive widening, several evaluations in flight under virtual loss, budgets, cancellation,
and a tree that is saved and resumed. It knows nothing of kernels: the caller's `Problem` does.

Design (after DeepMind's mctx: the search is the algorithm; the environment is the caller's):

- A node is a state; evaluating it once gives its reward (higher is better, any unit) or None, which
  marks it dead (failed compile, wrong result): a dead node is never selected or expanded. There are
  no rollouts: the real pipeline is the evaluation.
- Selection descends by PUCT, Q + c_puct·P·sqrt(N_parent) / (1 + N_child), to the first child that
  has not been evaluated. Q is min-max normalized over the rewards backed up so far, so rewards in
  any unit work; an unvisited child's Q (first-play urgency) is its parent's own normalized reward
  minus `fpu_reduction`: an edit is first assumed to be as good as the kernel it edits. P is the
  policy's prior, normalized over the node's children. If every child of the best-scoring node is
  dead or in flight, selection backtracks to the next-best one.
- Progressive widening: a node has at most ceil(widening_c·N^widening_alpha) children (N counts
  visits in flight). Passing through a node below that asks the policy for the missing ones; actions
  are deduplicated by `action_key`. A node whose policy proposes nothing new is exhausted and never
  asked again. A node whose children are all dead may widen past the limit: otherwise it could
  block the search without anything left in flight.
- Filling the slots (`fill_slots`): where a slot is free but every child within the widening limits
  is evaluated or in flight, one node widens past its limit rather than leave the slot idle: the
  deepest node on the line of best-ranked evaluated children from the root whose policy has more to
  propose (then the one above it, ...; then any node in PUCT order). The limit counts visits in
  flight, but grows as their square root: without this, a search of 8 slots kept 2 evaluations in
  flight, and where evaluations take seconds a free slot is an idle compiler.
- Backup: `max` (default) gives a node the best reward in its subtree, since an optimizer keeps the
  best variant it finds, not the average one; `mean` gives the mean of the subtree's rewards, a dead
  evaluation counting as the worst reward seen.
- Virtual loss: up to `parallelism` evaluations are in flight. Each counts, until its result
  arrives, as a visit of zero value to its node and every ancestor, so concurrent selections spread
  over the tree. `async def` evaluations run on the event loop; plain functions in a thread pool.
- Determinism: selection, expansion and backup run on one task, and the policy's random generator
  is the search's (seeded, saved). With `ordered=True` (default) results are applied in the order
  evaluations started, so for a seed, a config and a deterministic problem the tree is the same at
  any parallelism and any completion timing. `ordered=False` applies each result as it arrives:
  more throughput when evaluation times vary, no reproducibility. A wall-time budget or a stop
  request cuts a run at a timing-dependent point.
- Stopping: budgets are per `run`. An evaluation budget stops new starts; evaluations already in
  flight finish and are recorded (reward, info, best node, progress), but those an uninterrupted
  run would back up only after its next selection (at most parallelism - 1, none when serial) stay
  pending until the search continues. So a search stopped by its budget, saved, loaded and run on
  builds the same tree as one that never stopped, at any parallelism. A wall-time budget or a stop
  request cancels evaluations in flight (a thread cannot be interrupted: its result is dropped);
  their nodes stay in the tree and are evaluated first when the search continues.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import random
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Generic, Literal, Protocol, TypeVar

from optiml.search.tree_io import Codec, read_json, rng_from_json, rng_state_to_json, write_json

State = TypeVar("State")
Action = TypeVar("Action")

# A stop request is a plain callable and the clock may be injected, so neither can wake a wait on
# evaluations: waits poll them this often.
_POLL_SECONDS = 0.005


@dataclass(frozen=True)
class Evaluation:
    """What evaluating a state gave: a reward (higher is better) or None for a dead state, and a
    JSON-serializable payload (verdict, timings, profile) kept on the node for the policy and the
    report."""

    reward: float | None
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(eq=False, slots=True)
class Node(Generic[State, Action]):
    """One state of the tree: how it was reached, its evaluation and its statistics.

    Policies and reports read nodes; only the search changes them.
    """

    # The repr stays one line: a state can be a whole source, and the links would print the tree.
    id: int
    state: State = field(repr=False)
    parent: Node[State, Action] | None = field(repr=False)
    action: Action | None
    key: str | None  # the action's `action_key`
    prior: float
    depth: int
    children: list[Node[State, Action]] = field(default_factory=list, repr=False)
    order: int | None = None  # the position of its evaluation among all the search started
    evaluated: bool = False
    reward: float | None = None
    info: dict[str, Any] = field(default_factory=dict, repr=False)
    dead: bool = False
    pending: bool = False  # started and not yet backed up
    exhausted: bool = False  # its policy proposed nothing new
    closed: bool = False  # exhausted, and every child dead or closed: nothing left below
    visits: int = 0  # evaluations backed up through it, its own included
    live_visits: int = 0  # those of them that were not dead
    value_sum: float = 0.0  # sum of their rewards
    max_reward: float | None = None  # best of their rewards
    virtual: int = 0  # evaluations in flight at it or below

    @property
    def path(self) -> list[Action]:
        """The actions from the root to this node."""
        actions: list[Action] = []
        node: Node[State, Action] | None = self
        while node is not None and node.parent is not None:
            actions.append(node.action)
            node = node.parent
        return actions[::-1]


class Problem(Protocol[State, Action]):
    """What the caller supplies: a policy, a transition and an evaluation."""

    def propose(
        self, node: Node[State, Action], k: int, rng: random.Random
    ) -> Sequence[tuple[Action, float]] | Awaitable[Sequence[tuple[Action, float]]]:
        """Up to `k` (action, prior) pairs to try from an evaluated `node`; fewer, or none, are fine.

        Called again on the same node to widen it; `node.children` are the actions it has, and
        `node.info` its evaluation's payload. Priors are non-negative, in any scale. Draw any
        randomness from `rng`, so the search stays reproducible.
        """
        ...

    def apply(self, state: State, action: Action) -> State:
        """The state `action` makes from `state`; pure and cheap (no evaluation here)."""
        ...

    def evaluate(self, state: State) -> Evaluation | Awaitable[Evaluation]:
        """Evaluate a state: `async def`, or a plain function that the search runs in a thread."""
        ...

    def action_key(self, action: Action) -> str:
        """A string equal for actions that make the same child; proposals are deduplicated by it."""
        ...


@dataclass(frozen=True)
class SearchConfig:
    """The search's parameters; saved with the tree, so a resumed search goes on as it began."""

    seed: int = 0
    c_puct: float = 1.25
    fpu_reduction: float = 0.0
    widening_c: float = 1.0
    widening_alpha: float = 0.5
    backup: Literal["max", "mean"] = "max"
    parallelism: int = 1
    ordered: bool = True
    fill_slots: bool = False  # widen past the limit rather than leave a slot idle

    def __post_init__(self) -> None:
        if self.parallelism < 1:
            raise ValueError(f"parallelism must be at least 1, not {self.parallelism}")
        if self.widening_c <= 0 or not 0 <= self.widening_alpha <= 1:
            raise ValueError("widening needs widening_c > 0 and 0 <= widening_alpha <= 1")
        if self.c_puct < 0:
            raise ValueError(f"c_puct must not be negative, not {self.c_puct}")
        if self.backup not in ("max", "mean"):
            raise ValueError(f"backup is 'max' or 'mean', not {self.backup!r}")


class StopReason(StrEnum):
    """Why a run returned."""

    EVALUATIONS = "evaluations"  # the evaluation budget is spent
    TIME = "time"  # the wall-time budget is spent
    CANCELLED = "cancelled"  # should_stop said so
    EXHAUSTED = "exhausted"  # nothing is left to evaluate


@dataclass(frozen=True)
class Progress(Generic[State, Action]):
    """Passed to `on_progress` after every evaluation."""

    evaluations: int  # results recorded in this run
    best_reward: float | None
    best: Node[State, Action] | None
    node: Node[State, Action]  # the node just evaluated
    seconds: float  # since the run began


@dataclass(frozen=True)
class SearchResult(Generic[State, Action]):
    """What a run found, and the whole tree for the report."""

    best: Node[State, Action] | None  # None if every evaluation was dead
    best_reward: float | None
    path: list[Action]  # the best node's actions from the root
    evaluations: int  # results recorded in this run
    total_evaluations: int  # results recorded in the tree, over all runs
    seconds: float
    stop: StopReason
    root: Node[State, Action]


class _Run:
    """One call of `Search.run`: its budgets, its evaluations in flight and its counters."""

    def __init__(
        self,
        max_evaluations: int | None,
        max_seconds: float | None,
        should_stop: Callable[[], bool] | None,
        on_progress: Callable[[Progress[Any, Any]], None] | None,
        clock: Callable[[], float],
    ):
        self.max_evaluations = max_evaluations
        self.max_seconds = max_seconds
        self.should_stop = should_stop
        self.on_progress = on_progress
        self.clock = clock
        self.start = clock()
        self.started = 0
        self.recorded = 0
        self.futures: dict[int, asyncio.Future[Evaluation]] = {}

    def seconds(self) -> float:
        return self.clock() - self.start

    def budget_left(self) -> bool:
        return self.max_evaluations is None or self.started < self.max_evaluations

    def interrupted(self) -> StopReason | None:
        if self.should_stop is not None and self.should_stop():
            return StopReason.CANCELLED
        if self.max_seconds is not None and self.seconds() >= self.max_seconds:
            return StopReason.TIME
        return None

    def polls(self) -> bool:
        return self.should_stop is not None or self.max_seconds is not None


class Search(Generic[State, Action]):
    """A search tree over `problem` from `root`; `run` grows it, `save` and `load` keep it."""

    def __init__(
        self,
        problem: Problem[State, Action],
        root: State,
        config: SearchConfig | None = None,
        codec: Codec[State, Action] | None = None,
    ):
        self.problem = problem
        self.config = config or SearchConfig()
        self.codec: Codec[State, Action] = codec or Codec()
        self.root: Node[State, Action] = Node(
            id=0, state=root, parent=None, action=None, key=None, prior=1.0, depth=0
        )
        self.nodes: list[Node[State, Action]] = [self.root]
        self.best: Node[State, Action] | None = None
        self.evaluations = 0  # results recorded, over all runs
        self._started = 0  # evaluations started, over all runs: the next one's `order`
        self._pending: list[Node[State, Action]] = []  # in the order they started
        self._bounds: tuple[float, float] | None = None  # lowest and highest reward backed up
        self._rng = random.Random(self.config.seed)
        self._running = False

    @property
    def pending(self) -> list[Node[State, Action]]:
        """Nodes started and not yet backed up, oldest first: in flight, cancelled by a stop, or
        finished and waiting for the next run (see the module's notes on stopping)."""
        return list(self._pending)

    async def run(
        self,
        *,
        max_evaluations: int | None = None,
        max_seconds: float | None = None,
        should_stop: Callable[[], bool] | None = None,
        on_progress: Callable[[Progress[State, Action]], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> SearchResult[State, Action]:
        """Grow the tree until a budget of this run is spent, `should_stop()` is true, or nothing is
        left to evaluate. May be called again, on this object or on a loaded one, to go on."""
        if self._running:
            raise RuntimeError("this search is already running; one run at a time")
        run = _Run(max_evaluations, max_seconds, should_stop, on_progress, clock)
        executor = None
        if not inspect.iscoroutinefunction(self.problem.evaluate):
            executor = ThreadPoolExecutor(self.config.parallelism, thread_name_prefix="optiml-eval")
        self._running = True
        try:
            # Evaluations a stop cancelled last time start again first, in their order.
            for node in self._pending:
                if not node.evaluated and run.budget_left():
                    self._submit(node, run, executor)
            stop = await self._wind_down(run, await self._grow(run, executor))
        finally:
            self._running = False
            for future in run.futures.values():
                future.cancel()
            if run.futures:
                await asyncio.gather(*run.futures.values(), return_exceptions=True)
            if executor is not None:
                executor.shutdown(wait=False, cancel_futures=True)
        best = self.best
        return SearchResult(
            best=best,
            best_reward=None if best is None else best.reward,
            path=[] if best is None else best.path,
            evaluations=run.recorded,
            total_evaluations=self.evaluations,
            seconds=run.seconds(),
            stop=stop,
            root=self.root,
        )

    async def _grow(self, run: _Run, executor: ThreadPoolExecutor | None) -> StopReason:
        while True:
            while len(self._pending) < self.config.parallelism and run.budget_left():
                if stop := run.interrupted():
                    return stop
                node = await self._select()
                if node is None and self.config.fill_slots:
                    node = await self._fill()
                if node is None:
                    break
                self._start(node)
                self._submit(node, run, executor)
            if stop := run.interrupted():
                return stop
            if not run.budget_left():
                return StopReason.EVALUATIONS
            if not self._pending:
                return StopReason.EXHAUSTED
            node = await self._next_result(run)
            if node is None:
                return run.interrupted() or StopReason.CANCELLED
            if not node.evaluated:
                self._record(node, run.futures.pop(node.id).result(), run)
            self._backup(node)

    async def _next_result(self, run: _Run) -> Node[State, Action] | None:
        """The pending node whose result is applied next: the oldest if `ordered`, else the oldest
        of those done. None if the run is interrupted while waiting."""
        while True:
            candidates = self._pending[:1] if self.config.ordered else self._pending
            for node in candidates:
                if node.evaluated or run.futures[node.id].done():
                    return node
            await asyncio.wait(
                [run.futures[node.id] for node in candidates],
                timeout=_POLL_SECONDS if run.polls() else None,
                return_when=asyncio.FIRST_COMPLETED,
            )
            if run.interrupted():
                return None

    async def _wind_down(self, run: _Run, stop: StopReason) -> StopReason:
        """Record what finished. After an evaluation budget, wait for what is in flight first (unless
        a stop or the time budget interrupts that); otherwise leave it to be cancelled."""
        if stop is StopReason.EVALUATIONS:
            while not all(future.done() for future in run.futures.values()):
                await asyncio.wait(
                    list(run.futures.values()),
                    timeout=_POLL_SECONDS if run.polls() else None,
                    return_when=asyncio.FIRST_COMPLETED,
                )
                if interrupted := run.interrupted():
                    stop = interrupted
                    break
        for node in self._pending:
            future = run.futures.get(node.id)
            if future is not None and future.done():
                self._record(node, run.futures.pop(node.id).result(), run)
        # With every slot busy, an uninterrupted run would back up the oldest result before it
        # selects again, so doing it now changes nothing, and a serial run ends fully backed up.
        pending = self._pending
        full = len(pending) == self.config.parallelism
        if stop is StopReason.EVALUATIONS and full and pending[0].evaluated:
            self._backup(pending[0])
        return stop

    def _submit(
        self, node: Node[State, Action], run: _Run, executor: ThreadPoolExecutor | None
    ) -> None:
        if executor is None:
            future = asyncio.ensure_future(self.problem.evaluate(node.state))
        else:
            loop = asyncio.get_running_loop()
            future = loop.run_in_executor(executor, self.problem.evaluate, node.state)
        run.futures[node.id] = future
        run.started += 1

    def _start(self, node: Node[State, Action]) -> None:
        node.order = self._started
        self._started += 1
        self._hold(node)

    def _hold(self, node: Node[State, Action]) -> None:
        """Put `node` in flight: a virtual loss on it and its ancestors until its backup."""
        node.pending = True
        self._pending.append(node)
        ancestor: Node[State, Action] | None = node
        while ancestor is not None:
            ancestor.virtual += 1
            ancestor = ancestor.parent

    def _record(self, node: Node[State, Action], evaluation: Evaluation, run: _Run) -> None:
        if not isinstance(evaluation, Evaluation):
            raise TypeError(f"evaluate returned {type(evaluation).__name__}, not an Evaluation")
        reward = evaluation.reward
        if reward is not None and not math.isfinite(reward):
            raise ValueError(f"evaluate returned the reward {reward}; a reward must be finite")
        node.evaluated = True
        node.reward = None if reward is None else float(reward)
        node.dead = reward is None
        node.info = dict(evaluation.info)
        self.evaluations += 1
        run.recorded += 1
        # Ties go to the earlier node: the simpler variant, found first.
        best_reward = None if self.best is None else self.best.reward
        if node.reward is not None and (best_reward is None or node.reward > best_reward):
            self.best, best_reward = node, node.reward
        if run.on_progress is not None:
            run.on_progress(
                Progress(
                    evaluations=run.recorded,
                    best_reward=best_reward,
                    best=self.best,
                    node=node,
                    seconds=run.seconds(),
                )
            )

    def _backup(self, node: Node[State, Action]) -> None:
        self._pending.remove(node)
        node.pending = False
        reward = node.reward
        if reward is not None:
            low, high = self._bounds or (reward, reward)
            self._bounds = (min(low, reward), max(high, reward))
        ancestor: Node[State, Action] | None = node
        while ancestor is not None:
            ancestor.virtual -= 1
            ancestor.visits += 1
            if reward is not None:
                ancestor.live_visits += 1
                ancestor.value_sum += reward
                if ancestor.max_reward is None or reward > ancestor.max_reward:
                    ancestor.max_reward = reward
            ancestor = ancestor.parent

    async def _select(self) -> Node[State, Action] | None:
        """The next node to evaluate, or None if every candidate is in flight or nothing is left."""
        root = self.root
        if root.pending or root.dead or root.closed:
            return None
        if not root.evaluated:
            return root
        return await self._descend(root)

    async def _fill(self) -> Node[State, Action] | None:
        """A new child for a free slot, past a node's widening limit (see `fill_slots`), or None
        where no evaluated node's policy has anything new."""
        root = self.root
        if root.pending or not root.evaluated or root.dead or root.closed:
            return None  # as `_select`: nothing below a root not yet backed up
        line = [root]
        while best := next((c for c in self._ranked(line[-1]) if c.evaluated), None):
            line.append(best)
        for node in reversed(line):
            if (child := await self._widen_once(node)) is not None:
                return child
        tried = {node.id for node in line}
        stack = [root]
        while stack:
            node = stack.pop()
            if node.id not in tried and (child := await self._widen_once(node)) is not None:
                return child
            stack.extend(reversed([c for c in self._ranked(node) if c.evaluated]))
        return None

    async def _widen_once(self, node: Node[State, Action]) -> Node[State, Action] | None:
        """`node`'s next child from its policy, past its limit; None where it has none."""
        if node.exhausted or node.dead or node.closed or not node.evaluated:
            return None
        before = len(node.children)
        await self._widen(node)
        return node.children[before] if len(node.children) > before else None

    async def _descend(self, root: Node[State, Action]) -> Node[State, Action] | None:
        """Depth first in PUCT order, so that a subtree with nothing to evaluate now yields to the
        next-best sibling. A loop, not recursion: a line of edits can outgrow Python's stack."""
        frames: list[tuple[Node[State, Action], Iterator[Node[State, Action]]]] = []
        node: Node[State, Action] | None = root
        while True:
            if node is not None:
                if self._may_widen(node):
                    await self._widen(node)
                frames.append((node, iter(self._ranked(node))))
            if not frames:
                return None
            parent, ranked = frames[-1]
            node = next(ranked, None)
            if node is None:
                frames.pop()
                if all(child.dead or child.closed for child in parent.children):
                    # Its children closed during this descent: ask its policy for more before
                    # giving up on it (a node is closed only when nothing new is proposed).
                    if not parent.exhausted:
                        await self._widen(parent)
                        if not parent.exhausted:
                            frames.append((parent, iter(self._ranked(parent))))
                            continue
                    parent.closed = True
            elif not node.evaluated:
                return node

    def _width(self, node: Node[State, Action]) -> int:
        """How many children progressive widening allows `node` now."""
        visits = node.visits + node.virtual
        return math.ceil(self.config.widening_c * visits**self.config.widening_alpha)

    def _may_widen(self, node: Node[State, Action]) -> bool:
        if node.exhausted:
            return False
        if len(node.children) < self._width(node):
            return True
        return all(child.dead or child.closed for child in node.children)

    async def _widen(self, node: Node[State, Action]) -> None:
        wanted = max(self._width(node) - len(node.children), 1)
        proposals = self.problem.propose(node, wanted, self._rng)
        if inspect.isawaitable(proposals):
            proposals = await proposals
        keys = {child.key for child in node.children}
        added = 0
        for action, prior in proposals:
            if added == wanted:
                break
            if not (math.isfinite(prior) and prior >= 0):
                raise ValueError(f"propose gave the prior {prior}; priors must be finite and >= 0")
            key = self.problem.action_key(action)
            if key in keys:
                continue
            keys.add(key)
            child = Node(
                id=len(self.nodes),
                state=self.problem.apply(node.state, action),
                parent=node,
                action=action,
                key=key,
                prior=float(prior),
                depth=node.depth + 1,
            )
            node.children.append(child)
            self.nodes.append(child)
            added += 1
        if added == 0:
            node.exhausted = True

    def _ranked(self, node: Node[State, Action]) -> list[Node[State, Action]]:
        """The children selection may enter, best PUCT score first (ties: the older child)."""
        children = node.children
        total_prior = sum(child.prior for child in children)
        exploration = self.config.c_puct * math.sqrt(node.visits + node.virtual)
        fpu = max(0.0, self._normalized(node.reward) - self.config.fpu_reduction)
        scored = []
        for index, child in enumerate(children):
            if child.dead or child.closed or child.pending:
                continue
            prior = child.prior / total_prior if total_prior > 0 else 1 / len(children)
            seen = child.visits + child.virtual
            value = fpu if child.visits == 0 else self._value(child) * child.visits / seen
            scored.append((-(value + exploration * prior / (1 + seen)), index, child))
        scored.sort(key=lambda item: item[:2])
        return [child for _, _, child in scored]

    def _value(self, node: Node[State, Action]) -> float:
        """A visited node's Q in [0, 1], before virtual loss."""
        if self.config.backup == "max":
            return self._normalized(node.max_reward)
        mean = self._normalized(node.value_sum / node.live_visits)
        return mean * node.live_visits / node.visits

    def _normalized(self, reward: float) -> float:
        low, high = self._bounds
        return (reward - low) / (high - low) if high > low else 0.5

    def to_json(self) -> dict[str, Any]:
        """The whole search as JSON values, states and actions through the codec."""
        codec = self.codec
        nodes = []
        for node in self.nodes:
            nodes.append(
                {
                    "id": node.id,
                    "parent": None if node.parent is None else node.parent.id,
                    "action": None if node.parent is None else codec.encode_action(node.action),
                    "key": node.key,
                    "prior": node.prior,
                    "state": codec.encode_state(node.state),
                    "order": node.order,
                    "evaluated": node.evaluated,
                    "reward": node.reward,
                    "info": node.info,
                    "dead": node.dead,
                    "exhausted": node.exhausted,
                    "closed": node.closed,
                    "visits": node.visits,
                    "live_visits": node.live_visits,
                    "value_sum": node.value_sum,
                    "max_reward": node.max_reward,
                }
            )
        return {
            "config": asdict(self.config),
            "rng": rng_state_to_json(self._rng),
            "evaluations": self.evaluations,
            "started": self._started,
            "bounds": None if self._bounds is None else list(self._bounds),
            "best": None if self.best is None else self.best.id,
            "pending": [node.id for node in self._pending],
            "nodes": nodes,
        }

    @classmethod
    def from_json(
        cls,
        data: dict[str, Any],
        problem: Problem[State, Action],
        codec: Codec[State, Action] | None = None,
    ) -> Search[State, Action]:
        """The search `to_json` described, ready to run on."""
        codec = codec or Codec()
        records = data["nodes"]
        search = cls(
            problem, codec.decode_state(records[0]["state"]), SearchConfig(**data["config"]), codec
        )
        search.nodes = []
        for record in records:
            parent = None if record["parent"] is None else search.nodes[record["parent"]]
            node: Node[State, Action] = Node(
                id=record["id"],
                state=codec.decode_state(record["state"]),
                parent=parent,
                action=None if parent is None else codec.decode_action(record["action"]),
                key=record["key"],
                prior=record["prior"],
                depth=0 if parent is None else parent.depth + 1,
                order=record["order"],
                evaluated=record["evaluated"],
                reward=record["reward"],
                info=record["info"],
                dead=record["dead"],
                exhausted=record["exhausted"],
                closed=record["closed"],
                visits=record["visits"],
                live_visits=record["live_visits"],
                value_sum=record["value_sum"],
                max_reward=record["max_reward"],
            )
            if parent is not None:
                parent.children.append(node)
            search.nodes.append(node)
        search.root = search.nodes[0]
        search._rng = rng_from_json(data["rng"])
        search.evaluations = data["evaluations"]
        search._started = data["started"]
        search._bounds = None if data["bounds"] is None else tuple(data["bounds"])
        search.best = None if data["best"] is None else search.nodes[data["best"]]
        for node_id in data["pending"]:
            search._hold(search.nodes[node_id])
        return search

    def save(self, path: str | Path) -> None:
        """Write the search to `path` (JSON, atomically)."""
        write_json(path, self.to_json())

    @classmethod
    def load(
        cls,
        path: str | Path,
        problem: Problem[State, Action],
        codec: Codec[State, Action] | None = None,
    ) -> Search[State, Action]:
        """The search saved at `path`, with its config, random state and evaluations in flight."""
        return cls.from_json(read_json(path), problem, codec)
