"""The search problem of one kernel, for the generic MCTS: states are variants, actions are edits a
policy proposes, and evaluating a state runs the real pipeline (compile, check, time, profile)
through an executor. Identical variants reached by different paths are measured once."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from optiml.cuda.source import Kernel, SourceFile
from optiml.errors import OptimlError
from optiml.executors.base import Executor, Job
from optiml.harness.evaluate import EvalOptions, candidate_spec
from optiml.search.catalog import CATALOG
from optiml.search.mcts import Evaluation, Node
from optiml.search.policy import NodeView, Policy
from optiml.search.reward import RewardConfig, reward
from optiml.search.trajectory import Edit, Measurement, ProfileSummary
from optiml.search.tree_io import Codec
from optiml.search.variant import Variant
from optiml.spec import Spec


@dataclass
class ProblemOptions:
    eval: EvalOptions
    profile: bool = True  # profile correct candidates (the reward's hardware terms)
    reward: RewardConfig = RewardConfig()
    # Profile only a candidate at least this fraction as fast as the best measured so far (the
    # input counts as 1x). A search-set profile took 2.7 to 5.2 s per candidate on an H100 and
    # H200 against 1.3 to 1.6 s for its checked, timed run (benchmarks/results/throughput-h100.json,
    # optimize-sgemm-h200-defaults-trajectory.json): profiling most candidates held the search
    # under 25 a minute. A profile changes a decision where the candidate becomes the best: its
    # bottleneck steers the edits tried on it next (the search benchmark's MCTS, with the input's
    # profile alone, reached 95 % of the exhaustive best in 2 to 4 evaluations on every fixture);
    # a slower one's reward differs only by the profile's small terms. The winner, if the search
    # did not profile it, is profiled once after the judge. None: every correct candidate.
    profile_within: float | None = 1.0
    # ... and only where it is at least this much faster than the kernel whose profile steers it
    # (its nearest profiled ancestor, the input at first): within that, a variant of the same
    # kernel is taken to have the same bottleneck, and its children are steered by that profile.
    # On the H100, softmax's search profiled 4 of 20 candidates, ~3-5 s each against ~0.9 s
    # for an evaluation: ~40 % of the search's GPU time (throughput-h100-defaults.json).
    # None: every new best.
    profile_step: float | None = 1.25
    # An input whose launch takes at least this long (ms) is the search's reference only until a
    # candidate at least `surrogate_step` times faster is verified against it: that candidate then
    # checks and times the search's later ones (their speedups its own times theirs over it), and
    # a candidate `surrogate_step` times faster than it takes its place. The confirmation and the
    # judge check against the input. Until the first, and for the first `gated` verdicts at most,
    # evaluations run one at a time: on an H100 KernelBench's plain LayerNorm (787 ms a launch) was
    # launched ~9 times by each of 8 evaluations in flight (3 seeds checked against it, 6 launches
    # timed beside the candidate), and none had finished 27 s later; where no candidate is that
    # much faster, the search goes on in parallel after them. None: the input throughout.
    surrogate_ms: float | None = 20.0
    # A variant slower than the best so far by more than this factor gets no light touches (edits
    # the catalog ranks as rarely moving a kernel far on its own: block size, unrolling, launch
    # bounds, qualifiers, fast math, a grid-stride loop): none can make it the winner. KernelBench's
    # large-K GEMM spent 40 of its 48 evaluations on block sizes of a grid-stride loop running at
    # 0.24x, its 1.47x tiling having nothing more to try. None: every edit everywhere.
    light_reach: float | None = 2.0
    surrogate_step: float = 1.5
    gated: int = 2


CODEC: Codec[Variant, Edit] = Codec(
    encode_state=lambda v: v.to_json(),
    decode_state=Variant.from_json,
    encode_action=lambda e: e.model_dump(),
    decode_action=Edit.model_validate,
)


class KernelProblem:
    def __init__(
        self,
        source: SourceFile,
        kernel: Kernel,
        spec: Spec,
        executor: Executor,
        policy: Policy,
        options: ProblemOptions,
        baseline: Measurement,
        sm_count: int = 132,
        origin: float | None = None,
    ):
        self.source, self.kernel, self.spec = source, kernel, spec
        # what each evaluation's `started_s`, `verdict_s` and `ended_s` count from
        # (`time.perf_counter()`; the optimize run's start)
        self.origin = time.perf_counter() if origin is None else origin
        self.executor = executor
        self.policy = policy
        self.options = options
        self.baseline = baseline
        self.sm_count = sm_count
        self._made: dict[tuple[str, str], Variant] = {}
        self._measured: dict[str, asyncio.Future[Evaluation]] = {}
        self.root_key = Variant(source.text).key
        self.best_speedup = 1.0  # the fastest correct candidate measured so far (the input: 1x)
        # Per variant, the profile that steers its edits and that profile's kernel's speedup:
        # its own where it was profiled, else its parent's (the input's at the root).
        self._steering: dict[str, tuple[ProfileSummary | None, float]] = {
            self.root_key: (baseline.profile, 1.0)
        }
        self._parent: dict[str, str] = {}  # variant -> the variant it was made from
        # The search's reference in place of a slow input (`ProblemOptions.surrogate_ms`): a
        # verified candidate and its speedup over the input.
        slow = options.surrogate_ms is not None and (baseline.candidate_ms or 0) >= (
            options.surrogate_ms
        )
        self.slow_input = slow and spec.reference.kind in ("self", "numpy")
        self.surrogate: tuple[Variant, float] | None = None
        self._reference: tuple[str, tuple[SourceFile, Kernel, Spec]] | None = None  # parsed
        self._first = asyncio.Lock()  # one evaluation at a time until there is a surrogate
        self._verdicts = 0  # verdicts taken in (the gate opens after `gated` of them regardless)
        # The options of an evaluation against a slow input: its time is the one the input's
        # measurement took (at the first size, the only one the search times), not measured again
        # beside the candidate. Where the search times every size, the input is timed beside.
        ms = baseline.candidate_ms
        self._before = (
            replace(options, eval=replace(options.eval, reference_ms=ms))
            if ms and not options.eval.time_all_sizes
            else options
        )
        # When the search stops (`time.perf_counter()`; None: no time limit): a profile that would
        # end after it is not begun, as a node is recorded only once its profile is in and the
        # stop cancels what is in flight (a slow input's first verified candidate could be lost so).
        self.deadline: float | None = None
        # what a profile takes, the longest seen: the input's to begin with, at most 10 s (a full
        # profile, for an LLM's prompt, takes longer than the search set a candidate gets)
        self.profile_s = min(baseline.profile_s or 0.0, 10.0)

    # -- mcts.Problem ---------------------------------------------------------------------------

    async def propose(
        self, node: Node[Variant, Edit], k: int, rng: random.Random
    ) -> list[tuple[Edit, float]]:
        info = node.info.get("measurement") or {}
        m = Measurement.model_validate(info) if info else None
        own = m.profile if m else None
        steering, steered_by = self.steering(node.state.key)
        request = NodeView(
            variant=node.state,
            path=self.source.path,
            kernel=self.kernel.name,
            applied=tuple(e.transform for e in node.path),
            profile=own or steering,
            profile_from=None if own is not None or steering is None else steered_by,
            speedup=m.speedup if m else None,
            sm_count=self.sm_count,
            tried={c.key for c in node.children if c.key},
        )
        out = []
        reach = self.options.light_reach
        behind = reach is not None and m is not None and m.speedup is not None
        behind = behind and m.speedup * reach < self.best_speedup
        for c in await self.policy.propose(request, k, rng):
            if behind and light_touch(c.edit.transform):
                continue
            # a text the search has already measured or is measuring (edits that commute, a block
            # size set back: 512 then 256 is 256) would be the same evaluation again under
            # another name, counted against the budget and grown as a subtree of its own
            if c.variant.key in self._measured or c.variant.key == self.root_key:
                continue
            self._made[(node.state.key, c.edit.key)] = c.variant
            self._parent.setdefault(c.variant.key, node.state.key)
            out.append((c.edit, c.prior))
        return out

    def apply(self, state: Variant, action: Edit) -> Variant:
        return self._made[(state.key, action.key)]

    def action_key(self, action: Edit) -> str:
        return action.key

    async def evaluate(self, state: Variant) -> Evaluation:
        # The same text reached twice (edits that commute) is measured once.
        future = self._measured.get(state.key)
        if future is None:
            future = asyncio.ensure_future(self._evaluate(state))
            self._measured[state.key] = future
        return await asyncio.shield(future)

    # -- evaluation ----------------------------------------------------------------------------

    def steering(self, key: str) -> tuple[ProfileSummary | None, float]:
        """The profile that steers the edits of variant `key`, and its kernel's speedup: its own,
        else its nearest profiled ancestor's."""
        while key not in self._steering and key in self._parent:
            key = self._parent[key]
        return self._steering.get(key, (self.baseline.profile, 1.0))

    def _worth(self, m: Measurement, steered_by: float) -> str | None:
        """Why a correct candidate is not profiled, or None: it is, being at least as fast as the
        best so far and faster by `profile_step` than the kernel whose profile steers it."""
        if self.deadline is not None and time.perf_counter() + self.profile_s > self.deadline:
            return "not profiled: the search's time ends before a profile would"
        within, step = self.options.profile_within, self.options.profile_step
        if within is None or m.speedup is None:
            return None
        if m.speedup < within * self.best_speedup:
            return (
                f"not profiled: {m.speedup:.2f}x, behind the best so far ({self.best_speedup:.2f}x)"
            )
        if step is not None and m.speedup < step * steered_by:
            return (
                f"not profiled: {m.speedup:.2f}x, within {step:g}x of the profiled kernel it "
                f"comes from ({steered_by:.2f}x), whose bottleneck steers its edits"
            )
        return None

    def job(self, state: Variant, reference: Variant | None = None) -> Job:
        """`state` checked against the input, or against `reference` (a verified variant of it,
        under its own launch; the contract stays the input's)."""
        if reference is None:
            source, kernel, spec = self.source, self.kernel, self.spec
        else:
            source, kernel, spec = self._reference_of(reference)
        return Job(
            source,
            kernel,
            spec,
            candidate=SourceFile(state.text, self.source.path),
            flags=state.flags,
        )

    def _reference_of(self, variant: Variant) -> tuple[SourceFile, Kernel, Spec]:
        """A verified variant as the reference: parsed once, not at each evaluation against it."""
        if self._reference is None or self._reference[0] != variant.key:
            source = SourceFile(variant.text, self.source.path)
            kernel = source.kernel(self.kernel.name)
            self._reference = (
                variant.key,
                (source, kernel, candidate_spec(self.spec, source, kernel)),
            )
        return self._reference[1]

    async def _evaluate(self, state: Variant) -> Evaluation:
        if state.key == self.root_key:
            m = self.baseline
        elif not self.slow_input:
            m = await self._measure(state)
        else:
            # Queued evaluations pass one by one until a surrogate is found (decided once the
            # verdict is in, before a profile) or `gated` verdicts are in, then all at once.
            await self._first.acquire()
            held = self.surrogate is None and self._verdicts < self.options.gated
            if not held:
                self._first.release()

            def verdict_in() -> None:
                nonlocal held
                if held:
                    held = False
                    self._verdicts += 1
                    self._first.release()

            try:
                m = await self._measure(state, verdict_in)
            finally:
                verdict_in()
        r, terms = reward(m, self.baseline, self.options.reward)
        return Evaluation(reward=r, info={"measurement": m.model_dump(), "terms": terms})

    async def _measure(
        self, state: Variant, verdict_in: Callable[[], None] | None = None
    ) -> Measurement:
        """`state` measured against the input or the surrogate at the time; `verdict_in` is
        called once its verdict is taken in (before it is profiled)."""
        steered_by = self.steering(state.key)[1]  # not profiled yet: its parent's
        surrogate = self.surrogate
        started = time.perf_counter() - self.origin

        def taken(m: Measurement) -> None:
            m.started_s = round(started, 3)
            m.verdict_s = round(time.perf_counter() - self.origin, 3)
            self._take(state, m, surrogate)
            if verdict_in is not None:
                verdict_in()

        m = await measure(
            self.executor,
            self.job(state, surrogate[0] if surrogate else None),
            self._before if self.slow_input and surrogate is None else self.options,
            worth=lambda m: self._worth(m, steered_by),
            on_verdict=taken,
        )
        m.ended_s = round(time.perf_counter() - self.origin, 3)
        if m.profile is not None and m.speedup:
            self._steering[state.key] = (m.profile, m.speedup)
        self.profile_s = max(self.profile_s, m.profile_s or 0.0)
        return m

    def _take(self, state: Variant, m: Measurement, surrogate: tuple[Variant, float] | None):
        """A verdict's speedup over the input (where `surrogate` was its reference, its own
        scaled by the surrogate's); the best so far; the surrogate, where it is one."""
        if surrogate is not None:
            # its times over the surrogate's, as over the input's: the surrogate's speedup
            variant, factor = surrogate
            if m.speedup:
                m.speedup *= factor
            if m.reference_ms is not None:
                m.reference_ms *= factor
            if m.reference_iqr_ms is not None:
                m.reference_iqr_ms *= factor
            m.message += (
                f"; checked and timed against the verified candidate {variant.key[:12]} "
                f"({factor:.2f}x the input) in the input's place"
            )
        if m.status == "ok" and m.speedup:
            self.best_speedup = max(self.best_speedup, m.speedup)
            # a reference is built with the input's flags: a variant with its own is not one
            plain = tuple(state.flags) == tuple(self.options.eval.flags)
            current = self.surrogate[1] if self.surrogate else 1.0
            step = self.options.surrogate_step
            if self.slow_input and plain and m.speedup >= step * current:
                self.surrogate = (state, m.speedup)


def light_touch(transform: str) -> bool:
    """Whether the catalog ranks `transform` as a light touch (its `gain` under a rewrite's)."""
    t = CATALOG.get(transform)
    return t is not None and t.gain < 1.0


async def measure(
    executor: Executor,
    job: Job,
    options: ProblemOptions,
    *,
    full_profile: bool = False,
    worth: Callable[[Measurement], str | None] | None = None,
    on_verdict: Callable[[Measurement], None] | None = None,
    profile_at: Callable[[Measurement], dict[str, int] | None] | None = None,
) -> Measurement:
    """Evaluate a candidate, and profile it if it is correct (a profile that fails is noted): with
    the search set, or with the full one (ncu's rules, hotspots) for the input, profiled once.
    `worth`: why a correct candidate need not be profiled (said in its message), or None.
    `on_verdict` sees the measurement before it is profiled (and may amend it). `profile_at`: the
    size to profile at instead of the spec's first, given the measurement, or None."""
    verdict = await executor.evaluate(job, options.eval)
    m = Measurement.of(verdict)
    if on_verdict is not None:
        on_verdict(m)
    skip = worth(m) if worth is not None and m.status == "ok" else None
    if skip is not None:
        m.message += f"; {skip}"
    elif m.status == "ok" and options.profile:
        start = time.perf_counter()
        at = profile_at(m) if profile_at is not None else None
        profiled = job if at is None else at_size(job, at)
        try:
            m.profile = ProfileSummary.of(await executor.profile(profiled, full=full_profile))
            if at is not None:
                m.profile.size = ", ".join(f"{k}={v}" for k, v in at.items())
        except OptimlError as e:
            m.message += f"; not profiled: {e}"
        m.profile_s = time.perf_counter() - start
    return m


def at_size(job: Job, sizes: dict[str, int]) -> Job:
    """`job` whose spec's first size (where the profiler runs it) is `sizes`."""
    rest = [s for s in job.spec.sizes if s != sizes]
    return replace(job, spec=job.spec.model_copy(update={"sizes": [sizes, *rest]}))
