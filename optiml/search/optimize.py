"""OptiML-X end to end, as the CLI and the editor run it: measure the input, search with MCTS over a
policy's edits, re-measure the top candidates interleaved with the input (only a confirmed speedup
counts), judge the best, and record everything as a `Trajectory` (plus the winner's file and an
HTML report when an output folder is given)."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from optiml.cuda.source import SourceFile
from optiml.errors import OptimlError
from optiml.executors.base import Executor, Job
from optiml.harness.evaluate import EvalOptions
from optiml.harness.nvcc import find_toolkit
from optiml.search.judge import judge
from optiml.search.mcts import Node, Progress, Search, SearchConfig, SearchResult
from optiml.search.policy import NodeView, OfflinePolicy, Policy
from optiml.search.problem import CODEC, KernelProblem, ProblemOptions, measure
from optiml.search.request import DEFAULT_BUDGET
from optiml.search.reward import RewardConfig, is_improvement
from optiml.search.trajectory import (
    Confirmation,
    JudgeRejection,
    JudgeVerdict,
    Measurement,
    ProfileSummary,
    ProgressPoint,
    Trajectory,
    TrajectoryNode,
)
from optiml.search.variant import Variant, kernel_text
from optiml.spec import load, parse_spec

logger = logging.getLogger(__name__)

# Confirmed candidates the judge looks at, best first, until one is accepted (a rejected one's
# descendants are skipped: they carry its edit).
JUDGE_TOP = 3
# Of a run's wall-time budget, the share the search leaves for confirming and judging its best:
# the search stops at the rest (the input's measurement included); the checks are never cut.
FINISH_SHARE = 0.25
# ... or, where more, this many times the input's own checked, timed run: confirming and judging
# time the input beside each candidate, at larger sizes too. On an H100 at KernelBench's sizes
# (benchmarks/results/kernelbench/kernelbench-h100.md) the two took 8.7 times the input's run for
# gemv (5.5 s) and for LogSoftmax (8.3 s), 48 s and 72 s against the quarter's 22.5 s of 90.
FINISH_RUNS = 9.0
FINISH_MAX_SHARE = 0.6  # the search keeps the rest, however slow the input
# A slow input's candidate the search found this many times faster is confirmed against the
# input's measured time rather than beside it (`_confirming`).
CLEAR_SPEEDUP = 2.0
# Of a run's wall-time budget, the most the input's NumPy reference may take at a step's sizes
# where a smaller size is left: past it, the larger sizes are checked against the input as
# written once it has passed against the function at the smaller (`evaluate`'s fallback). On an
# H100 the input's measurement of KernelBench's transposed 3-D convolutions 58 and 72 (their
# generated references at the declared sizes) took 40 s and 66 s of a 90 s run, the search then
# 17 s and 1.7 s (kb-58-62-64-h100.json, kb-72-74-76-h100.json).
REFERENCE_SHARE = 0.1


def reference_limit(max_seconds: float | None, options: EvalOptions) -> float:
    """The input's NumPy reference's time limit at a step's sizes where a smaller is left: the
    options' own, or `REFERENCE_SHARE` of a run's budget where less."""
    if max_seconds is None:
        return options.reference_limit_s
    return min(options.reference_limit_s, REFERENCE_SHARE * max_seconds)


def finish_seconds(max_seconds: float, input_run_s: float | None = None) -> float:
    """What a run of `max_seconds` keeps for confirming and judging: `FINISH_SHARE` of it, or
    `FINISH_RUNS` of the input's run where more, at most `FINISH_MAX_SHARE` of it."""
    by_input = FINISH_RUNS * (input_run_s or 0.0)
    return min(FINISH_MAX_SHARE * max_seconds, max(FINISH_SHARE * max_seconds, by_input))


def search_seconds(
    max_seconds: float | None, elapsed: float, input_run_s: float | None = None
) -> float | None:
    """The search's own time limit within a run's budget, `elapsed` seconds in: what is left of
    the budget once `finish_seconds` of it is kept for confirming and judging (0: no search)."""
    if max_seconds is None:
        return None
    return max(0.0, max_seconds - finish_seconds(max_seconds, input_run_s) - elapsed)


# Evaluations in flight per GPU: while the GPU times and profiles one, the others compile on the
# CPUs. On an H100 (benchmarks/results/throughput-h100.json), 8 against 2 raised the search's
# rate from 20.2 to 22.0 a minute on the softmax fixture and from 7.9 to 13.5 on SGEMM (whose
# candidates take nvcc longest), with the same result.
IN_FLIGHT_PER_GPU = 8
# The input's edits compiled while it is measured: the first the search evaluates.
PRECOMPILE_FIRST = 16


def runners_ahead() -> bool:
    """The search's evaluations run in runners started ahead of them (`EvalOptions.ahead`) unless
    `OPTIML_RUNNER_AHEAD=0`: on an H100 at 8 in flight, 14 to 27 % more evaluations a minute
    (benchmarks/results/throughput-h100-ahead.json)."""
    return os.environ.get("OPTIML_RUNNER_AHEAD", "1") != "0"


@dataclass
class OptimizeOptions:
    budget: int | None = DEFAULT_BUDGET  # evaluations
    # the whole run's wall time (measuring the input, search, confirmation, judging): the search
    # stops early enough to leave `finish_seconds` of it for the rest; None: the budget alone
    max_seconds: float | None = None
    seed: int = 0
    parallel: int | None = None  # evaluations in flight; None: IN_FLIGHT_PER_GPU per GPU slot
    profile: bool = True
    confirm_top: int = 3
    sanitize: bool = True
    judge: bool = True
    # the search times the first size only, briefly (a candidate 4x slower than its reference at
    # a slow round's length by that round alone); confirmation times it longer
    search_eval: EvalOptions = field(
        default_factory=lambda: EvalOptions(
            time_all_sizes=False, reps_min=10, target_ms=100.0, ahead=runners_ahead(), give_up=4.0
        )
    )
    confirm_eval: EvalOptions = field(
        default_factory=lambda: EvalOptions(time_all_sizes=False, reps_min=30, target_ms=400.0)
    )
    reward: RewardConfig = RewardConfig()
    arch: str | None = None
    resume: Path | None = None  # a saved tree to go on from
    save_to: Path | None = None  # where the tree is saved if the executor fails mid-search


class Event(BaseModel):
    """Progress for a CLI or an editor: what phase, how far, the best so far."""

    phase: str  # baseline | search | confirm | judge | done
    evaluations: int = 0
    budget: int | None = None
    seconds: float = 0.0  # since the run started
    max_seconds: float | None = None  # the run's wall-time budget
    finish_s: float | None = None  # of it, kept for confirming and judging (None: the share)
    best_speedup: float | None = None
    bottleneck: str | None = None
    last: str = ""

    def search_done(self) -> float | None:
        """How far the search is, 0 to 1: by whichever of its budgets runs out first, the
        evaluations or its share of the time; None where there is no budget to measure by."""
        shares = []
        if self.budget:
            shares.append(self.evaluations / self.budget)
        if self.max_seconds:
            finish = (
                self.finish_s if self.finish_s is not None else finish_seconds(self.max_seconds)
            )
            shares.append(self.seconds / max(self.max_seconds - finish, 1e-9))
        return min(1.0, max(shares)) if shares else None


@dataclass
class Outcome:
    trajectory: Trajectory
    winner: Variant | None  # the confirmed, judged variant (the whole file), if any
    baseline_profile: ProfileSummary | None
    search: Search[Variant, Any]
    files: dict[str, Path] = field(default_factory=dict)

    @property
    def speedup(self) -> float | None:
        t = self.trajectory
        found = next((c for c in t.confirmed if c.node == t.winner), None)
        return found.speedup if found else None


async def optimize(
    path: str | Path,
    kernel_name: str,
    executor: Executor,
    options: OptimizeOptions | None = None,
    *,
    policy: Policy | None = None,
    on_event: Callable[[Event], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    source_text: str | None = None,
    llm_review: Callable[[Variant, Measurement], Any] | None = None,
) -> Outcome:
    """Search for a faster, verified `kernel_name` in `path` (or in `source_text`, an editor's
    snapshot of it): measure the input, search, confirm the best, judge them, record it all. The
    user's file is never written here."""
    opts = options or OptimizeOptions()
    policy = policy or OfflinePolicy()
    run = _Run(opts, on_event or (lambda e: None), should_stop or (lambda: False))
    if source_text is None:
        source, kernel, spec = load(path, kernel_name)
    else:
        source = SourceFile(source_text, str(path))
        kernel = source.kernel(kernel_name)
        spec = parse_spec(source, kernel)
    arch = opts.arch or spec.arch
    # Once the input has passed against the spec's NumPy function (its baseline), candidates are
    # checked against the input on the GPU (`kernel_reference`).
    search_eval = replace(
        opts.search_eval, arch=arch or opts.search_eval.arch, kernel_reference=True
    )
    confirm_eval = replace(
        opts.confirm_eval, arch=arch or opts.confirm_eval.arch, kernel_reference=True
    )
    problem_opts = ProblemOptions(eval=search_eval, profile=opts.profile, reward=opts.reward)

    try:
        run.emit("baseline", last="measuring the input")
        base_job = Job(source, kernel, spec, candidate=SourceFile(source.text, source.path))
        early = asyncio.ensure_future(
            precompile_first(executor, policy, base_job, search_eval, run.background)
        )
        try:
            base_eval = replace(
                search_eval,
                kernel_reference=False,
                reference_limit_s=reference_limit(opts.max_seconds, search_eval),
            )
            asked = time.perf_counter() - run.started
            baseline = await measure_baseline(
                executor,
                base_job,
                replace(problem_opts, eval=base_eval),
                full=not isinstance(policy, OfflinePolicy),
            )
            # when the input's measurement began and ended, as a candidate's are recorded: the
            # baseline phase beyond it is the wait for the first edits' proposals
            baseline.started_s = round(asked, 3)
            baseline.ended_s = round(time.perf_counter() - run.started, 3)
        finally:
            await early  # its compiles go on in the executor's pool; the policy is the search's now
        run.phase("baseline")
        if opts.max_seconds is not None:
            run.finish_s = finish_seconds(opts.max_seconds, baseline.run_s)
        problem = KernelProblem(
            source,
            kernel,
            spec,
            executor,
            policy,
            problem_opts,
            baseline,
            sm_count=baseline.sm_count or 132,
            origin=run.started,
        )
        run.bottleneck = baseline.profile.bottleneck if baseline.profile else None
        root = Variant(source.text)
        search, result = await run_search(problem, root, executor, opts, run)
        run.phase("search")
        rejections: list[JudgeRejection] = []
        if problem.slow_input and opts.judge:
            confirmed, winner, verdict = await confirm_and_judge_in_turn(
                search, root, problem, executor, confirm_eval, opts, run, llm_review, rejections
            )
        else:
            confirmed = await confirm(search, root, problem, executor, confirm_eval, opts, run)
            run.phase("confirm")
            winner, verdict = await judge_confirmed(
                confirmed, problem, executor, confirm_eval, opts, run, llm_review, rejections
            )
            run.phase("judge")
        trajectory = record(
            path, source, kernel, spec, policy, opts, run, baseline, search, result, confirmed
        )
        trajectory.arch = search_eval.arch or ""
        trajectory.winner = winner.id if winner is not None else None
        if winner is not None:
            info = Measurement.model_validate(winner.info.get("measurement", {}))
            trajectory.winner_profile = info.profile or await _profile_of(
                executor, problem.job(winner.state), opts
            )
        trajectory.judge = verdict
        trajectory.judge_rejected = rejections
        trajectory.outcome = _outcome(trajectory, confirmed, verdict)
        run.emit("done", best_speedup=run.best_speedup, last=trajectory.outcome)
        return Outcome(
            trajectory=trajectory,
            winner=winner.state if winner is not None else None,
            baseline_profile=baseline.profile,
            search=search,
        )
    finally:
        for task in run.background:  # compiles no evaluation waited for
            task.cancel()


@dataclass
class _Run:
    """One optimize run's reporting: its events, its stop, the best seen so far."""

    opts: OptimizeOptions
    on_event: Callable[[Event], None]
    should_stop: Callable[[], bool]
    started: float = field(default_factory=time.perf_counter)
    evaluations: int = 0
    best_speedup: float | None = None
    bottleneck: str | None = None
    stopped: bool = False
    finish_s: float | None = None  # kept for confirming and judging, once the input is measured
    points: list[ProgressPoint] = field(default_factory=list)
    phases: dict[str, float] = field(default_factory=dict)  # wall seconds of each, in order
    background: list[asyncio.Task[None]] = field(default_factory=list)  # precompiles
    # how long after its deadline the search returned (its evaluations in flight cancelled)
    search_overrun_s: float | None = None

    def phase(self, name: str) -> None:
        """`name` ended now: its seconds are those since the one before ended."""
        self.phases[name] = time.perf_counter() - self.started - sum(self.phases.values())

    def emit(self, phase: str, **fields: Any) -> None:
        fields.setdefault("evaluations", self.evaluations)
        self.on_event(
            Event(
                phase=phase,
                budget=self.opts.budget,
                seconds=time.perf_counter() - self.started,
                max_seconds=self.opts.max_seconds,
                finish_s=self.finish_s,
                **fields,
            )
        )

    def check_stop(self) -> bool:
        self.stopped = self.should_stop()
        return self.stopped


async def _profile_of(executor: Executor, job: Job, opts: OptimizeOptions):
    """The winner's search-set profile, where the search did not profile it (it was not the best
    when measured): the report's roofline and bottleneck shift need it. None if profiling is off
    or fails (said in the log)."""
    if not opts.profile:
        return None
    try:
        return ProfileSummary.of(await executor.profile(job))
    except OptimlError as e:
        logger.warning("profiling the winner of %s: %s", job.kernel.name, e)
        return None


async def precompile_first(
    executor: Executor,
    policy: Policy,
    job: Job,
    options: EvalOptions,
    tasks: list[asyncio.Task[None]],
) -> None:
    """While the input is measured (its GPU busy, the CPUs not), have the executor compile the
    edits of it that the search will evaluate first: a GEMM tiling's template takes nvcc ~10 s,
    and the input's checked runs and profile several seconds. The offline policy only (an LLM's
    proposals cost a request, and are asked for once the input's profile is there)."""
    if not isinstance(policy, OfflinePolicy):
        return
    view = NodeView(variant=Variant(job.source.text), path=job.source.path, kernel=job.kernel.name)
    try:
        found = await asyncio.to_thread(policy.candidates, view)
    except Exception as e:  # a hint: the search proposes (and reports) for itself
        logger.debug("precompiling %s: %s", job.kernel.name, e)
        return
    first = sorted(found, key=lambda c: -c.prior)[:PRECOMPILE_FIRST]
    for c in first:
        variant_job = Job.of_variant(job.source, job.kernel, job.spec, c.variant)
        tasks.append(asyncio.ensure_future(executor.precompile(variant_job, options)))


# An input whose launch takes at least this long at the spec's first size is profiled at its
# smallest declared one: ncu replays the kernel once per pass of its metrics, and KernelBench's
# plain LayerNorm (787 ms a launch) took 14.5 s to profile on an H100, of a 90 s run. The bottleneck
# of a kernel that slow is in its code (a thread per long row, uncoalesced reads), not its size.
SLOW_PROFILE_MS = 20.0


def slow_profile_size(job: Job, m: Measurement) -> dict[str, int] | None:
    """The smallest declared size, where the input is slow and that is not its first."""
    if (m.candidate_ms or 0.0) < SLOW_PROFILE_MS or len(job.spec.sizes) < 2:
        return None
    smallest = min(job.spec.sizes, key=lambda s: sum(job.spec.case(s).lengths.values()))
    return None if smallest == job.spec.sizes[0] else smallest


async def measure_baseline(
    executor: Executor, job: Job, options: ProblemOptions, *, full: bool = True
) -> Measurement:
    """The input, profiled with the full set where `full` (ncu's rules reach an LLM's prompt and
    the report as hints), else with the search set, as the candidates are: its bottleneck is what
    steers the search, and the full set's replay passes took 17 to 29 s of a 90 s run on an H100
    for GEMMs (benchmarks/results/kernelbench/).
    An input that is slow at the spec's first size is profiled at its smallest
    (`slow_profile_size`). `BaselineFailed` when it does not pass its own checks.

    Against a NumPy reference, the harness checks sizes beyond `numpy_sizes` against the input
    itself once it has passed against the function at the others (`evaluate`)."""
    baseline = await measure(
        executor, job, options, full_profile=full, profile_at=lambda m: slow_profile_size(job, m)
    )
    if baseline.status != "ok":
        raise BaselineFailed(
            f"the input itself does not pass its checks: {baseline.message}", baseline.status
        )
    if baseline.speedup is None:
        # The input against itself builds one object, so the runner timed it once: 1.0 by definition.
        baseline.speedup = 1.0
        baseline.reference_ms, baseline.reference_iqr_ms = (
            baseline.candidate_ms,
            baseline.candidate_iqr_ms,
        )
    return baseline


async def run_search(
    problem: KernelProblem, root: Variant, executor: Executor, opts: OptimizeOptions, run: _Run
) -> tuple[Search[Variant, Any], SearchResult]:
    """The tree search (or the saved one, resumed), its progress reported as events."""
    in_flight = opts.parallel or IN_FLIGHT_PER_GPU * max(1, executor.slots)
    config = SearchConfig(seed=opts.seed, parallelism=in_flight, fill_slots=True)
    if opts.resume is not None and opts.resume.exists():
        search = Search.load(opts.resume, problem, CODEC)
    else:
        search = Search(problem, root, config, CODEC)

    def progress(p: Progress[Variant, Any]) -> None:
        m = Measurement.model_validate(p.node.info.get("measurement", {}))
        if p.best is not None:
            best = Measurement.model_validate(p.best.info.get("measurement", {}))
            run.best_speedup = best.speedup
            if best.profile:
                run.bottleneck = best.profile.bottleneck
        run.evaluations = search.evaluations
        run.points.append(
            ProgressPoint(
                evaluations=search.evaluations,
                seconds=time.perf_counter() - run.started,
                best_speedup=run.best_speedup,
            )
        )
        what = p.node.action.summary if p.node.action is not None else "the input"
        verdict = m.status if m.status != "ok" else f"{m.speedup:.2f}x" if m.speedup else "ok"
        run.emit(
            "search",
            best_speedup=run.best_speedup,
            bottleneck=run.bottleneck,
            last=f"{what}: {verdict}",
        )

    limit = search_seconds(
        opts.max_seconds, time.perf_counter() - run.started, problem.baseline.run_s
    )
    problem.deadline = None if limit is None else time.perf_counter() + limit
    try:
        result = await search.run(
            max_evaluations=opts.budget,
            max_seconds=limit,
            should_stop=run.should_stop,
            on_progress=progress,
        )
    except OptimlError as e:
        # the executor gave up (a connection lost for good): what was measured is kept
        if opts.save_to is None or not search.evaluations:
            raise
        search.save(opts.save_to)
        e.message += (
            f"; the search's {search.evaluations} evaluations are saved in {opts.save_to}: "
            "run again with --resume to go on from them"
        )
        raise
    if problem.deadline is not None:
        run.search_overrun_s = round(max(0.0, time.perf_counter() - problem.deadline), 3)
    run.evaluations = search.evaluations
    return search, result


async def confirm(
    search: Search[Variant, Any],
    root: Variant,
    problem: KernelProblem,
    executor: Executor,
    confirm_eval: EvalOptions,
    opts: OptimizeOptions,
    run: _Run,
) -> list[tuple[Node, Confirmation, Measurement]]:
    """The best distinct correct variants (the input left out), re-measured longer on one GPU,
    interleaved with the input; fastest first."""
    top = _top(search, root, opts.confirm_top)
    confirmed: list[tuple[Node, Confirmation, Measurement]] = []
    run.check_stop()
    for i, n in enumerate(top):
        if run.stopped:
            break
        found = await _confirm_one(
            n, f"{i + 1} of {len(top)}", problem, executor, confirm_eval, run
        )
        if found is not None:
            confirmed.append(found)
        run.check_stop()
    return rank_confirmed(confirmed, opts.reward.min_noise)


def _top(search: Search[Variant, Any], root: Variant, k: int) -> list[Node]:
    """The `k` best distinct correct variants by the search's reward, the input left out."""
    ranked = sorted(
        (
            n
            for n in search.nodes
            if n.evaluated and not n.dead and n.reward is not None and n.state.key != root.key
        ),
        key=lambda n: (-n.reward, n.order or 0),
    )
    seen, top = set(), []
    for n in ranked:
        if n.state.key not in seen:
            seen.add(n.state.key)
            top.append(n)
        if len(top) == k:
            break
    return top


async def _confirm_one(
    n: Node,
    which: str,
    problem: KernelProblem,
    executor: Executor,
    confirm_eval: EvalOptions,
    run: _Run,
) -> tuple[Node, Confirmation, Measurement] | None:
    """`n` re-measured longer beside the input; None where it is not correct and timed."""
    run.emit("confirm", best_speedup=run.best_speedup, last=f"re-measuring candidate {which}")
    # every confirmation on the same GPU: their speedups are compared with each other
    start = time.perf_counter()
    v = await executor.evaluate(problem.job(n.state), confirm_eval, pinned=True)
    seconds = time.perf_counter() - start
    m = Measurement.of(v)
    if m.status != "ok" or not m.speedup:
        return None
    repeats = v.cases[0].timing.candidate.reps if v.cases and v.cases[0].timing else 0
    c = Confirmation(
        node=n.id,
        speedup=m.speedup,
        candidate_ms=m.candidate_ms,
        reference_ms=m.reference_ms,
        noise=m.noise,
        repeats=repeats,
        seconds=round(seconds, 3),
        run_s=round(v.run_s, 3) if v.run_s else None,
    )
    return n, c, m


async def confirm_and_judge_in_turn(
    search: Search[Variant, Any],
    root: Variant,
    problem: KernelProblem,
    executor: Executor,
    confirm_eval: EvalOptions,
    opts: OptimizeOptions,
    run: _Run,
    llm_review: Callable[[Variant, Measurement], Any] | None,
    rejections: list[JudgeRejection],
) -> tuple[list[tuple[Node, Confirmation, Measurement]], Node | None, JudgeVerdict | None]:
    """For a slow input, whose every confirmation times it beside the candidate (a 148 ms
    matrix-vector product's three took 56 s): the best candidate confirmed and judged before the
    next is confirmed, the next only where the judge turned it down or it was no improvement (in
    the order `judge_confirmed` takes them: no rejected one's descendants, one without a rejected
    one's last edit first). The confirmations and the judge's seconds go to their phases."""
    # every correct variant in line (the next one confirmed may be far down it: not a rejected
    # one's descendant, nor carrying its last edit), at most confirm_top of them confirmed
    queue = _top(search, root, len(search.nodes))
    confirmed: list[tuple[Node, Confirmation, Measurement]] = []
    rejected: list[Node] = []
    winner, verdict = None, None
    seconds = {"confirm": 0.0, "judge": 0.0}
    tried = 0
    run.check_stop()
    while not run.stopped and len(rejected) < JUDGE_TOP and tried < opts.confirm_top:
        n = _next_to_judge(queue, rejected, lambda n: n)
        if n is None:
            break
        tried += 1
        started = time.perf_counter()
        found = await _confirm_one(
            n,
            f"{tried} of {opts.confirm_top} at most",
            problem,
            executor,
            _confirming(confirm_eval, problem, n),
            run,
        )
        seconds["confirm"] += time.perf_counter() - started
        run.check_stop()
        if found is None or run.stopped:
            continue
        confirmed.append(found)
        started = time.perf_counter()
        winner, judged = await judge_confirmed(
            [found], problem, executor, confirm_eval, opts, run, llm_review, rejections, rejected
        )
        verdict = judged or verdict  # the last one the judge gave (none for a non-improvement)
        seconds["judge"] += time.perf_counter() - started
        if winner is not None:
            break
    for name, s in seconds.items():
        run.phases[name] = round(s, 6)
    return rank_confirmed(confirmed, opts.reward.min_noise), winner, verdict


def _confirming(confirm_eval: EvalOptions, problem: KernelProblem, n: Node) -> EvalOptions:
    """A slow input's confirmation of a candidate the search found at least CLEAR_SPEEDUP times
    faster: the candidate timed alone, against the input's measured time (`reference_ms`), as the
    search's evaluations against it were; no drift of a GPU's clock over a run comes near such a
    margin. Timing the input beside it took most of a confirmation (KernelBench's 76 on an H100:
    986 ms a launch, 30 rounds; its confirmations 60 s of a 90 s run). The candidate is still
    checked against the input at every size and seed; the judge still times the input beside it."""
    measured = n.info.get("measurement", {}) if n.info else {}
    ms = problem.baseline.candidate_ms
    if (
        problem.slow_input
        and ms
        and not confirm_eval.time_all_sizes
        and (measured.get("speedup") or 0.0) >= CLEAR_SPEEDUP
    ):
        return replace(confirm_eval, reference_ms=ms)
    return confirm_eval


def rank_confirmed(
    confirmed: list[tuple[Node, Confirmation, Measurement]], min_noise: float
) -> list[tuple[Node, Confirmation, Measurement]]:
    """Fastest first; but among those as fast as the fastest within their measured spread, the
    one reached with the fewest edits first. Timing noise must not pick between a rewrite and the
    same rewrite plus an edit that changes nothing measurable (`__restrict__`, an unroll pragma):
    the smaller diff is the one a user reads and keeps, and the same one on every GPU."""
    ranked = sorted(confirmed, key=lambda item: -item[1].speedup)
    if not ranked:
        return ranked
    best = ranked[0][1]

    def tied(c: Confirmation) -> bool:
        return abs(math.log(best.speedup / c.speedup)) <= max(best.noise, c.noise, min_noise)

    ties = sorted((x for x in ranked if tied(x[1])), key=lambda x: (x[0].depth, -x[1].speedup))
    return ties + [x for x in ranked if not tied(x[1])]


async def judge_confirmed(
    confirmed: list[tuple[Node, Confirmation, Measurement]],
    problem: KernelProblem,
    executor: Executor,
    confirm_eval: EvalOptions,
    opts: OptimizeOptions,
    run: _Run,
    llm_review: Callable[[Variant, Measurement], Any] | None,
    rejections: list[JudgeRejection] | None = None,
    rejected: list[Node] | None = None,
) -> tuple[Node | None, JudgeVerdict | None]:
    """The first confirmed improvement the judge accepts (up to JUDGE_TOP judged, best first, in
    `_next_to_judge`'s order), and the last verdict; each one rejected before it is added to
    `rejected` (the nodes, which may hold earlier calls') and to `rejections` (the judge's
    reasons and seconds)."""
    winner, verdict = None, None
    rejected = [] if rejected is None else rejected
    judged = 0
    # one of a tie may be an improvement; a slower one after it too
    queue = [(n, c, m) for n, c, m in confirmed if is_improvement(m, opts.reward)]
    while not run.stopped and judged < JUDGE_TOP:
        picked = _next_to_judge(queue, rejected, lambda e: e[0])
        if picked is None:
            break
        n, c, m = picked
        judged += 1
        if not opts.judge:
            return n, None
        run.emit("judge", best_speedup=c.speedup, last="judging the best candidate")
        # The confirmation does not profile; the review gets the search's profile of the node.
        seen = Measurement.model_validate(n.info.get("measurement", {})) if n.info else None
        if llm_review is not None and seen is not None and seen.profile is None and not m.profile:
            # the search did not profile it (within its step of the kernel it comes from): the
            # review reads the candidate's own profile, kept for the report
            seen.profile = await _profile_of(executor, problem.job(n.state), opts)
            n.info["measurement"] = seen.model_dump()
        shown = m if m.profile or seen is None else m.model_copy(update={"profile": seen.profile})
        review = (
            (lambda n=n, shown=shown: llm_review(n.state, shown))
            if llm_review is not None
            else None
        )
        started = time.perf_counter()
        verdict = await judge(
            executor,
            problem.job(n.state),
            confirm_eval,
            m,
            sanitize=opts.sanitize,
            llm_review=review,
            until_rejected=True,  # a rejected one's other checks would only cost time
        )
        if verdict.accepted:
            return n, verdict
        rejected.append(n)
        if rejections is not None:
            rejections.append(
                JudgeRejection(
                    node=n.id,
                    reasons=verdict.reasons,
                    seconds=round(time.perf_counter() - started, 2),
                )
            )
        run.check_stop()
    return winner, verdict


def record(
    path: str | Path,
    source: SourceFile,
    kernel,
    spec,
    policy: Policy,
    opts: OptimizeOptions,
    run: _Run,
    baseline: Measurement,
    search: Search[Variant, Any],
    result: SearchResult,
    confirmed: list[tuple[Node, Confirmation, Measurement]],
) -> Trajectory:
    """What the run measured, as a `Trajectory`; the caller adds what the judge decided (winner,
    verdict, outcome) and the target."""
    stop = result.stop.value
    return Trajectory(
        file=str(path),
        kernel=kernel.name,
        device=baseline.device,
        arch="",
        nvcc=find_toolkit().version,
        date=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        policy=getattr(policy, "name", type(policy).__name__),
        seed=opts.seed,
        budget=opts.budget,
        max_seconds=opts.max_seconds,
        baseline=baseline,
        nodes=[_node(n, kernel.name) for n in search.nodes],
        progress=run.points,
        best=result.best.id if result.best is not None else None,
        confirmed=[c for _, c, _ in confirmed],
        stop="cancelled" if run.stopped and stop != "cancelled" else stop,
        stopped_in_flight=[n.id for n in search.pending if not n.evaluated],
        search_overrun_s=run.search_overrun_s,
        evaluations=search.evaluations,
        wall_s=time.perf_counter() - run.started,
        phase_s={k: round(v, 2) for k, v in run.phases.items()},
        llm_cost_usd=getattr(policy, "cost_usd", None),
        rejected=list(getattr(policy, "rejected", [])),
        computes=_computes(source, kernel, spec),
    )


def _computes(source: SourceFile, kernel, spec) -> str:
    """What the input computes, in one line (its family and the evidence, or why not)."""
    from optiml.lift import lift
    from optiml.lift.families import describe

    try:
        d = describe(lift(source, kernel, spec), spec)
    except Exception as e:  # a report's line: never the reason a search fails
        return f"not read: {type(e).__name__}"
    why = (d.evidence or d.not_understood or [""])[0]
    return f"{d.family}: {why}" if why else d.family


def _next_to_judge(queue: list, rejected: list[Node], node_of: Callable[[Any], Node]):
    """The next of `queue` (best first; `node_of` its items' nodes) to judge, taken out of it, or
    None: a rejected candidate's descendants carry its edit and are dropped (the next one judged
    is another line); of the rest, the first whose edits include the fewest of the rejected
    ones' last edits (none: another schedule without the flags that made the rejected wrong; one:
    after the fast-math schedule and the cluster schedule were each turned down, the one that
    has only one of them)."""
    queue[:] = [e for e in queue if not any(_descends(node_of(e), r) for r in rejected)]
    if not queue:
        return None
    suspect = {r.action.key for r in rejected if r.action is not None}
    carried = [_carried(node_of(e), suspect) for e in queue]
    return queue.pop(carried.index(min(carried)))


def _carried(n: Node, keys: set[str]) -> int:
    """How many of `keys` the edits on `n`'s path from the input have."""
    found = set()
    while n is not None:
        if n.action is not None and n.action.key in keys:
            found.add(n.action.key)
        n = n.parent
    return len(found)


def _descends(n: Node, ancestor: Node) -> bool:
    """Whether `n` is `ancestor` or lies in its subtree."""
    while n is not None:
        if n is ancestor:
            return True
        n = n.parent
    return False


class BaselineFailed(Exception):
    """The input's own evaluation failed; `status` is its verdict's (compile_error, wrong_result...)."""

    def __init__(self, message: str, status: str = "wrong_result"):
        super().__init__(message)
        self.status = status


def _node(n: Node[Variant, Any], kernel: str) -> TrajectoryNode:
    info = n.info or {}
    m = Measurement.model_validate(info["measurement"]) if "measurement" in info else None
    src = SourceFile(n.state.text)
    try:
        text = kernel_text(src, src.kernel(kernel))
    except Exception:  # an LLM's variant that lost the kernel: keep what there is
        text = n.state.text
    return TrajectoryNode(
        id=n.id,
        parent=n.parent.id if n.parent is not None else None,
        depth=n.depth,
        edit=n.action,
        kernel=text,
        flags=list(n.state.flags),
        order=n.order,
        measurement=m,
        reward=n.reward,
        reward_terms=info.get("terms", {}),
        visits=n.visits,
    )


def _outcome(t: Trajectory, confirmed, verdict) -> str:
    if t.winner is not None:
        c = next(c for c in t.confirmed if c.node == t.winner)
        line = f"{c.speedup:.2f}x faster ({c.reference_ms:.4g} ms -> {c.candidate_ms:.4g} ms), confirmed and judged"
        # every front end shows this line: the flags a build of the file alone would miss
        if added := t.added_flags():
            line += (
                f"; measured with the nvcc flags {' '.join(added)}: your build needs them too "
                "(the file alone does not carry them)"
            )
        return line
    if verdict is not None and not verdict.accepted:
        return "the best candidate was rejected by the judge: " + "; ".join(verdict.reasons)
    if confirmed:
        best = confirmed[0][1]
        return (
            f"no confirmed improvement: the best candidate re-measured at {best.speedup:.2f}x, within the noise ({best.noise:.1%})"
            if best.speedup > 1
            else f"no improvement: the best candidate re-measured at {best.speedup:.2f}x"
        )
    if t.stop == "time" and t.evaluations == 0 and t.max_seconds:
        b = t.baseline
        launch = f", {b.candidate_ms:.4g} ms a launch" if b.candidate_ms else ""
        return (
            f"nothing was evaluated: measuring the input took {b.ended_s or 0:.0f} s{launch}, and "
            f"the rest of the {t.max_seconds:g} s budget is kept for confirming and judging a "
            "winner; give the run more time (--time, or the editor's optiml.seconds)"
        )
    return "no correct candidate faster than the input was found"
