"""`optimize` end to end without a GPU: the real policy, catalog, MCTS, confirmation, judge and
report, over an executor that compiles every candidate for real (nvcc) and stands in for the GPU
with a fixed cost model (a vectorized kernel is faster, a grid-stride one a little). What the GPU
itself says is tested on the GPU (tests/search/test_gpu_catalog.py)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest

from optiml.cuda.source import SourceFile
from optiml.executors.base import Executor, Job
from optiml.harness.evaluate import EvalOptions, build_candidate, numpy_sizes, reference_of
from optiml.harness.sanitize import SanitizerReport
from optiml.harness.verdict import (
    BufferCheck,
    CaseResult,
    CaseTiming,
    KernelAttributes,
    LaunchConfig,
    SeedCheck,
    TimingStats,
    Verdict,
)
from optiml.profile.model import Bottleneck, Coalescing, Occupancy, Profile, Roofline
from optiml.search.optimize import (
    FINISH_SHARE,
    IN_FLIGHT_PER_GPU,
    JUDGE_TOP,
    PRECOMPILE_FIRST,
    Event,
    OptimizeOptions,
    finish_seconds,
    optimize,
    search_seconds,
)
from optiml.search.policy import OfflinePolicy
from optiml.search.problem import light_touch
from optiml.search.report import render
from optiml.search.variant import kernel_text
from optiml.spec import load
from tests.support import FIXTURES, load_script

BASE_MS = 1.0


def cost(text: str) -> float:
    """The stand-in GPU's time for a variant: what each edit is worth in this model."""
    ms = BASE_MS
    if "optiml_pack" in text:
        ms /= 1.25
    if "blockDim.x * gridDim.x" in text:
        ms /= 1.05
    if "__restrict__" in text:
        ms /= 1.02
    return ms


_COMPILES = ThreadPoolExecutor(os.cpu_count() or 1, thread_name_prefix="stand-in-nvcc")


class StandInExecutor(Executor):
    def __init__(self, wrong: str | None = None):
        self.calls: list[str] = []
        self.wrong = wrong  # a marker: candidates containing it are "wrong"

    @property
    def slots(self) -> int:
        return 1

    async def evaluate(self, job: Job, options: EvalOptions, *, pinned: bool = False) -> Verdict:
        self.calls.append("evaluate")
        source, kernel, spec = job.target
        # on a pool of a worker per CPU, as the local executor's: the event loop goes on meanwhile
        build = await asyncio.get_running_loop().run_in_executor(
            _COMPILES, build_candidate, job.source, job.kernel, job.spec, source, options
        )
        base = dict(
            file=job.source.path,
            kernel=kernel.name,
            reference="self",
            arch="sm_90",
            nvcc_version="13.0",
            date="2026-12-02",
        )
        if build is None or not build.ok:
            return Verdict(status="compile_error", message="does not compile", **base)
        if self.wrong and self.wrong in source.text:
            return Verdict(status="wrong_result", message="y[3] is 1, expected 2", **base)
        # Every case asked for (a judge's several sizes and values), its time in proportion to
        # its work; by default the first size.
        sizes = (
            [p.sizes for p in options.cases] if options.cases else (options.sizes or spec.sizes)[:1]
        )
        first = sum(spec.case(spec.sizes[0]).lengths.values())
        # The input against itself is one object: the runner times it once, with no reference.
        same = source.text == job.source.text

        def stats(m: float) -> TimingStats:
            return TimingStats(median_ms=m, q1_ms=m * 0.999, q3_ms=m * 1.001, min_ms=m, reps=20)

        cases = []
        for size in sizes:
            case = spec.case(size)
            launch = LaunchConfig(grid=list(case.grid), block=list(case.block), smem=case.smem)
            scale = sum(case.lengths.values()) / first
            ms = cost(source.text) * scale
            cases.append(
                CaseResult(
                    label=case.label,
                    launch={"candidate": launch, "reference": launch},
                    attributes={
                        "candidate": KernelAttributes(
                            registers=32,
                            local_bytes=0,
                            static_smem=0,
                            max_threads_per_block=1024,
                            blocks_per_sm=8,
                        )
                    },
                    seeds=[
                        SeedCheck(
                            seed=s,
                            buffers=[
                                BufferCheck(
                                    name="y",
                                    mismatches=0,
                                    unwritten=0,
                                    max_abs_error=0,
                                    max_rel_error=0,
                                )
                            ],
                        )
                        for s in (1, 2)
                    ],
                    timing=CaseTiming(
                        candidate=stats(ms),
                        reference=None if same else stats(cost(job.source.text) * scale),
                        warmup_rounds=1,
                        sm_clock_mhz=[1980, 1980],
                    ),
                )
            )
        return Verdict(status="ok", message="correct", cases=cases, **base)

    async def profile(self, job: Job, *, full: bool = False) -> Profile:
        self.calls.append("profile (full)" if full else "profile")
        source, _, _ = job.target
        return Profile(
            kernel=job.kernel.name,
            duration_ms=cost(source.text),
            sol_compute_pct=10,
            sol_memory_pct=80,
            dram_pct=80,
            l2_pct=40,
            l1_pct=30,
            dram_read_bytes=5e8,
            dram_write_bytes=2.5e8,
            dram_tbps=3.4,
            flops=1e8,
            registers_per_thread=32,
            grid_blocks=1e5,
            block_threads=256,
            sm_count=132,
            occupancy=Occupancy(
                achieved_pct=90, theoretical_pct=100, limiter="warps", blocks_per_sm={}
            ),
            coalescing=Coalescing(
                load_sectors_per_request=4, store_sectors_per_request=4, excessive_sector_fraction=0
            ),
            shared_bank_conflicts=0,
            shared_wavefronts=0,
            local_sectors=0,
            global_sectors=1e7,
            atomic_sectors=0,
            stalls=[],
            roofline=Roofline(
                arithmetic_intensity=0.1,
                achieved_tflops=0.1,
                achieved_tbps=3.4,
                ridge=15,
                bound="memory",
                fraction_of_roof=0.8,
            ),
            bottleneck=Bottleneck(kind="dram", explanation="DRAM throughput is at 80 % of peak"),
        )

    async def sanitize(self, job: Job, tool: str, sizes=None) -> SanitizerReport:
        self.calls.append(tool)
        return SanitizerReport(
            tool=tool, errors=0, ok=True, size="n=1000003", messages=[], seconds=0.1
        )


def run(executor, budget=12, **kw):
    events: list[Event] = []
    outcome = asyncio.run(
        optimize(
            FIXTURES / "saxpy.cu",
            "saxpy",
            executor,
            OptimizeOptions(budget=budget, **kw),
            on_event=events.append,
        )
    )
    return outcome, events


def test_finds_confirms_and_judges_the_vectorized_saxpy():
    ex = StandInExecutor()
    outcome, events = run(ex)
    t = outcome.trajectory
    assert t.winner is not None and outcome.winner is not None
    assert "optiml_pack" in outcome.winner.text  # the model's fastest edit
    assert outcome.speedup == pytest.approx(
        max(
            BASE_MS / cost(n.kernel)
            for n in t.nodes
            if n.measurement and n.measurement.status == "ok"
        ),
        rel=1e-6,
    )
    assert t.judge.accepted and {c.name for c in t.judge.checks} >= {
        "memcheck",
        "initcheck",
        "racecheck",
        "synccheck",
        "no hard-coded sizes",
        "unseen sizes and seeds",
        "inputs beyond the declared",
        "no state across launches",
        "work scaling",
    }
    # what each of the judge's verdicts took
    assert all(c.seconds is not None and c.seconds >= 0 for c in t.judge.checks)
    assert [e.phase for e in events][0] == "baseline" and events[-1].phase == "done"
    # where the wall time went, phase by phase, adding up to (nearly all of) it
    assert list(t.phase_s) == ["baseline", "search", "confirm", "judge"]
    assert all(v >= 0 for v in t.phase_s.values())
    assert sum(t.phase_s.values()) == pytest.approx(t.wall_s, abs=0.5)
    assert t.evaluations == 12 and len(t.progress) >= 11
    assert t.baseline.profile.bottleneck == "dram"
    # offline, the input is profiled with the search set as every candidate is (no prompt reads
    # ncu's rules; the full set's replay passes cost a large share of the run's time)
    profiles = [c for c in ex.calls if c.startswith("profile")]
    assert "profile (full)" not in profiles and len(profiles) > 1
    assert t.computes.startswith("map: y: each element")  # what the lifting reads
    html = render(t)
    assert "Diff of the kernel" in html and "optiml_pack" in html and "<script" not in html
    assert "map: y: each element" in html
    assert re.search(r"\(baseline [0-9.]+ s, search [0-9.]+ s, confirm [0-9.]+ s, judge", html)
    json.loads(t.model_dump_json())  # the trajectory is plain JSON


class Against(StandInExecutor):
    """Records what each evaluation was checked against and how many ran at once."""

    def __init__(self, input_text: str) -> None:
        super().__init__()
        self.input_text = input_text
        self.against: list[tuple[bool, bool]] = []  # (pinned: a confirmation, against the input)
        self.running = self.most = 0
        self.delay = 0.01  # seconds an evaluation takes
        self.most_before_surrogate = 0
        self.profiles = 0
        self.profiling: set[int] = set()  # profiles in flight, by number (the input's is 1)
        self.during: list[set[int]] = []  # of each evaluation, those in flight when it started
        # each evaluation's `EvalOptions.reference_ms`, and whether it was a confirmation's
        self.reference_ms: list[float | None] = []
        self.pinned_reference_ms: list[float | None] = []

    async def profile(self, job, *, full=False):
        self.profiles += 1
        number = self.profiles
        self.profiling.add(number)
        try:
            await asyncio.sleep(0.2)
            return await super().profile(job, full=full)
        finally:
            self.profiling.discard(number)

    async def evaluate(self, job, options, *, pinned=False):
        self.during.append(set(self.profiling))
        self.reference_ms.append(options.reference_ms)
        if pinned:
            self.pinned_reference_ms.append(options.reference_ms)
        self.running += 1
        self.most = max(self.most, self.running)
        against_input = job.source.text == self.input_text
        if against_input and not pinned and job.candidate is not None:
            self.most_before_surrogate = max(self.most_before_surrogate, self.running)
        try:
            await asyncio.sleep(self.delay)  # long enough for the search's others to start
            return await super().evaluate(job, options, pinned=pinned)
        finally:
            self.running -= 1
            self.against.append((pinned, against_input))


def _packing_halves(text: str) -> float:
    """The stand-in GPU where packing halves the time: a candidate worth a surrogate."""
    return (
        BASE_MS
        / (2.0 if "optiml_pack" in text else 1.0)
        / (1.02 if "__restrict__" in text else 1.0)
    )


def test_a_slow_input_gives_way_to_its_first_verified_faster_candidate(monkeypatch):
    monkeypatch.setitem(globals(), "BASE_MS", 50.0)  # 50 ms a launch: slow
    monkeypatch.setitem(globals(), "cost", _packing_halves)
    source = (FIXTURES / "saxpy.cu").read_text()
    ex = Against(source)
    t = asyncio.run(
        optimize(FIXTURES / "saxpy.cu", "saxpy", ex, OptimizeOptions(budget=12))
    ).trajectory
    confirming = next(i for i, (pinned, _) in enumerate(ex.against) if pinned)
    searched = [against for _, against in ex.against[1:confirming]]  # after the input's
    # one at a time against the input until a packed candidate (2x) was verified; the rest
    # against it, several at once
    assert ex.most_before_surrogate == 1 and ex.most > 1
    # the first surrogate's profile (the second, after the input's) does not hold the others back
    assert any(2 in during for during in ex.during)
    assert searched[0] and not searched[-1] and searched.count(False) >= 3
    # confirmation and judge check against the input
    assert all(against for _, against in ex.against[confirming:])
    # evaluations against the slow input take its time from its measurement (50 ms) instead of
    # timing it beside each candidate, as does the confirmation of a candidate found 2x faster;
    # those against the surrogate, the input's own measurement and the judge time their reference
    before = [ms for ms in ex.reference_ms if ms is not None]
    assert before and all(ms == pytest.approx(50.0) for ms in before)
    assert ex.reference_ms[0] is None and len(before) < len(ex.reference_ms) - 1
    assert ex.pinned_reference_ms == [pytest.approx(50.0)]
    judged = ex.reference_ms[confirming + 1 :]
    assert judged and set(judged) == {None}
    # every speedup is over the input, whichever reference it was timed beside
    for n in t.nodes[1:]:
        m = n.measurement
        if m and m.status == "ok":
            assert m.speedup == pytest.approx(BASE_MS / _packing_halves(n.kernel), rel=1e-6)
            assert m.reference_ms / m.candidate_ms == pytest.approx(m.speedup, rel=1e-6)
    surrogate = [n for n in t.nodes if "in the input's place" in (n.measurement.message or "")]
    assert surrogate and "(2.00x the input)" in surrogate[0].measurement.message
    assert t.winner is not None and "optiml_pack" in t.nodes[t.winner].kernel
    # each confirmation times the slow input again: the best is confirmed and judged before the
    # next would be, and the judge accepted it
    assert sum(pinned for pinned, _ in ex.against) == 1 == len(t.confirmed)
    assert t.judge.accepted and t.phase_s["confirm"] > 0 and t.phase_s["judge"] > 0


def test_a_slow_inputs_rejected_best_is_followed_by_the_next_confirmation(monkeypatch):
    """Confirmed in turn: the judge turns down the best (memcheck finds errors in every variant
    with `__restrict__`), then the next line is confirmed and judged, and delivered."""
    monkeypatch.setitem(globals(), "BASE_MS", 50.0)
    monkeypatch.setitem(globals(), "cost", _packing_halves)

    class Strict(Against):
        async def sanitize(self, job, tool, sizes=None):
            bad = tool == "memcheck" and "__restrict__" in job.target[0].text
            return SanitizerReport(
                tool=tool, errors=int(bad), ok=not bad, size="n=1000003", seconds=0.1,
                messages=["Invalid __global__ read of size 16"] if bad else [],
            )  # fmt: skip

    ex = Strict((FIXTURES / "saxpy.cu").read_text())
    t = asyncio.run(
        optimize(FIXTURES / "saxpy.cu", "saxpy", ex, OptimizeOptions(budget=16, confirm_top=4))
    ).trajectory
    assert t.winner is not None and t.judge.accepted
    assert "optiml_pack" in t.nodes[t.winner].kernel
    assert "__restrict__" not in t.nodes[t.winner].kernel
    rejected = [r.node for r in t.judge_rejected]
    assert rejected and all("__restrict__" in t.nodes[r].kernel for r in rejected)
    # one confirmation for each judged, none beyond the winner's
    assert sum(pinned for pinned, _ in ex.against) == len(rejected) + 1 == len(t.confirmed)


class ProfiledAt(StandInExecutor):
    def __init__(self) -> None:
        super().__init__()
        self.at: list[dict[str, int]] = []

    async def profile(self, job, *, full=False):
        self.at.append(job.target[2].sizes[0])
        return await super().profile(job, full=full)


@pytest.mark.parametrize("ms", [50.0, 1.0])
def test_a_slow_input_is_profiled_at_its_smallest_declared_size(ms, monkeypatch):
    monkeypatch.setitem(globals(), "BASE_MS", ms)
    ex = ProfiledAt()
    t = asyncio.run(
        optimize(FIXTURES / "saxpy.cu", "saxpy", ex, OptimizeOptions(budget=3))
    ).trajectory
    _, _, spec = load(FIXTURES / "saxpy.cu", "saxpy")
    smallest = min(spec.sizes, key=lambda s: s["n"])
    assert smallest != spec.sizes[0]
    if ms >= 20.0:  # the input's profile at the smallest, said in its summary; candidates' not
        assert ex.at[0] == smallest and t.baseline.profile.size == f"n={smallest['n']}"
        assert all(at == spec.sizes[0] for at in ex.at[1:])
        assert f"n={smallest['n']}" in render(t)
    else:
        assert all(at == spec.sizes[0] for at in ex.at) and t.baseline.profile.size is None


def test_a_slow_input_with_nothing_much_faster_is_searched_in_parallel_after_two(monkeypatch):
    # packing is worth 1.25x here: short of a surrogate's 1.5x, so none is found; after the
    # first two verdicts the evaluations run several at once again
    monkeypatch.setitem(globals(), "BASE_MS", 50.0)
    ex = Against((FIXTURES / "saxpy.cu").read_text())
    asyncio.run(optimize(FIXTURES / "saxpy.cu", "saxpy", ex, OptimizeOptions(budget=10)))
    confirming = next(i for i, (pinned, _) in enumerate(ex.against) if pinned)
    assert all(against for _, against in ex.against[:confirming])  # the input throughout
    assert ex.most_before_surrogate > 1


def test_a_fast_input_stays_the_searchs_reference():
    source = (FIXTURES / "saxpy.cu").read_text()
    ex = Against(source)
    asyncio.run(optimize(FIXTURES / "saxpy.cu", "saxpy", ex, OptimizeOptions(budget=8)))
    assert all(against for _, against in ex.against) and ex.most > 1


def test_the_search_keeps_every_slot_of_the_gpu_busy():
    # 8 evaluations in flight a GPU: the root's proposals fill them from the first round (the
    # widening limit alone let 2 run at once: SGEMM's 20 evaluations on an H100, 2026-12-07)
    # (0.3 s an evaluation: the catalog's proposals, on a loaded machine,
    # must not decide it)
    ex = Against((FIXTURES / "saxpy.cu").read_text())
    ex.delay = 0.3
    asyncio.run(optimize(FIXTURES / "saxpy.cu", "saxpy", ex, OptimizeOptions(budget=9)))
    assert ex.most == IN_FLIGHT_PER_GPU == 8


class Prompted:
    """A policy other than the offline one (as an LLM's is): its proposals are the catalog's."""

    name = "prompted"

    def __init__(self) -> None:
        self.inner = OfflinePolicy()

    async def propose(self, request, k, rng):
        return await self.inner.propose(request, k, rng)


def test_a_prompted_policy_gets_the_inputs_full_profile():
    # ncu's rules reach an LLM's prompt: the input alone is profiled with the full set
    ex = StandInExecutor()
    outcome = asyncio.run(
        optimize(FIXTURES / "saxpy.cu", "saxpy", ex, OptimizeOptions(budget=6), policy=Prompted())
    )
    profiles = [c for c in ex.calls if c.startswith("profile")]
    assert profiles[0] == "profile (full)" and "profile (full)" not in profiles[1:]
    assert outcome.trajectory.evaluations == 6


class Precompiling(StandInExecutor):
    """Records what it is asked to precompile, and when the input's measurement ended."""

    def __init__(self) -> None:
        super().__init__()
        self.precompiled: list[str] = []
        self.baseline_done: float | None = None
        self.precompile_times: list[float] = []

    async def precompile(self, job: Job, options: EvalOptions) -> None:
        self.precompile_times.append(time.perf_counter())
        self.precompiled.append(job.candidate.text)

    async def evaluate(self, job: Job, options: EvalOptions, *, pinned: bool = False) -> Verdict:
        if self.baseline_done is None:  # the first evaluation is the input's
            await asyncio.sleep(0.5)  # a slow input: its edits are asked for meanwhile
            verdict = await super().evaluate(job, options, pinned=pinned)
            self.baseline_done = time.perf_counter()
            return verdict
        return await super().evaluate(job, options, pinned=pinned)


def test_the_first_edits_are_precompiled_while_the_input_is_measured():
    """With the offline policy, the edits the search tries first are handed to the executor to
    compile while the input is still being measured; the search then evaluates them."""
    ex = Precompiling()
    outcome, _ = run(ex)
    assert ex.precompiled and len(ex.precompiled) <= PRECOMPILE_FIRST
    assert max(ex.precompile_times) < ex.baseline_done
    first = [n.kernel for n in outcome.trajectory.nodes if n.depth == 1 and n.measurement]
    asked = set()
    for text in ex.precompiled:
        source = SourceFile(text, "saxpy.cu")
        asked.add(kernel_text(source, source.kernel("saxpy")))
    assert first and all(k in asked for k in first)  # every edit of the input it evaluated


def test_wrong_candidates_are_pruned_not_offered():
    ex = StandInExecutor(wrong="optiml_pack")
    outcome, _ = run(ex)
    t = outcome.trajectory
    wrong = [n for n in t.nodes if n.measurement and n.measurement.status == "wrong_result"]
    assert wrong and all(n.reward is None for n in wrong)
    assert outcome.winner is None or "optiml_pack" not in outcome.winner.text


def test_no_improvement_is_said_plainly():
    class Flat(StandInExecutor):
        async def evaluate(self, job, options, *, pinned=False):
            v = await super().evaluate(job, options, pinned=pinned)
            for c in v.cases:
                if c.timing.reference is not None:  # every variant as fast as the input
                    c.timing.candidate = c.timing.reference
            return v

    outcome, _ = run(Flat(), budget=6)
    assert outcome.winner is None
    assert (
        "no confirmed improvement" in outcome.trajectory.outcome
        or "no improvement" in outcome.trajectory.outcome
    )


def test_a_stop_request_ends_the_search_with_what_it_has():
    ex = StandInExecutor()
    calls = {"n": 0}

    def stop():
        calls["n"] += 1
        return calls["n"] > 3

    outcome = asyncio.run(
        optimize(FIXTURES / "saxpy.cu", "saxpy", ex, OptimizeOptions(budget=40), should_stop=stop)
    )
    assert outcome.trajectory.stop == "cancelled"
    assert outcome.trajectory.evaluations < 40


def test_the_search_resumes_from_its_saved_tree(tmp_path):
    ex = StandInExecutor()
    first, _ = run(ex, budget=5)
    saved = tmp_path / "search.json"
    first.search.save(saved)
    second, _ = run(StandInExecutor(), budget=5, resume=saved)
    assert second.trajectory.evaluations == 10
    assert len(second.trajectory.nodes) >= len(first.trajectory.nodes)


def test_a_rejected_best_gives_way_to_the_next_line_not_its_descendants():
    """The judge rejects every candidate that carries `__restrict__` (memcheck finds errors in
    them): the best lines with it are rejected, their descendants are skipped unjudged, and the
    best candidate without it is delivered."""

    class Strict(StandInExecutor):
        judged: list[str] = []

        async def sanitize(self, job, tool, sizes=None):
            self.calls.append(tool)
            if tool == "memcheck":
                self.judged.append((job.target[0].text, list(job.flags)))
            bad = tool == "memcheck" and "__restrict__" in job.target[0].text
            return SanitizerReport(
                tool=tool,
                errors=int(bad),
                ok=not bad,
                size="n=1000003",
                messages=["Invalid __global__ read of size 16"] if bad else [],
                seconds=0.1,
            )

    ex = Strict()
    outcome, _ = run(ex, budget=16, confirm_top=16)
    t = outcome.trajectory
    assert t.winner is not None and t.judge.accepted
    assert "__restrict__" not in outcome.winner.text and "optiml_pack" in outcome.winner.text
    # judged: a rejected line's best (or several lines'), then the winner, each once, within the
    # judge's bound; a rejected candidate's descendants (its edit and more) are passed over
    *rejected, accepted = ex.judged
    assert rejected and all("__restrict__" in text for text, _ in rejected)
    assert "__restrict__" not in accepted[0]
    assert len(ex.judged) <= JUDGE_TOP and len(set(map(str, ex.judged))) == len(ex.judged)
    best = max(c.speedup for c in t.confirmed)
    assert 1 < outcome.speedup < best
    # the trajectory names each one turned down, why, and what judging it took
    assert len(t.judge_rejected) == len(rejected)
    for r in t.judge_rejected:
        assert "__restrict__" in t.nodes[r.node].kernel and r.seconds >= 0
        assert any(reason.startswith("memcheck: ") for reason in r.reasons)


def test_after_a_rejection_a_candidate_without_its_edit_is_judged_next(monkeypatch):
    """The judge turns down the best (fast math on a schedule: NaN where the input is finite);
    the next best makes the same flags on another schedule, the third does not: the third is
    judged next, and delivered."""
    from types import SimpleNamespace

    from optiml.search import optimize as opt
    from optiml.search.mcts import Node
    from optiml.search.trajectory import Check, Confirmation, Edit, JudgeVerdict, Measurement

    def node(id, parent, transform, params):
        edit = Edit(transform=transform, params=params, summary=transform)
        return Node(id=id, state=id, parent=parent, action=edit, key=edit.key, prior=1.0, depth=1)

    root = Node(id=0, state=0, parent=None, action=None, key=None, prior=1.0, depth=0)
    rows, cluster = node(1, root, "warp_rows", {"per_row": "warp"}), node(2, root, "warp_rows", {})
    fast = {"flags": "approx-div-sqrt"}
    ranked = [node(3, rows, "fast_math", fast), node(4, cluster, "fast_math", fast), cluster]
    m = Measurement(status="ok", message="correct", speedup=6.0, noise=0.01)
    judged = []

    async def judge(executor, job, options, measured, **kw):
        judged.append(job)
        ok = job != 3
        return JudgeVerdict(accepted=ok, checks=[Check(name="inputs beyond", ok=ok, detail="NaN")])

    monkeypatch.setattr(opt, "judge", judge)
    run = opt._Run(OptimizeOptions(), lambda e: None, lambda: False)
    problem = SimpleNamespace(job=lambda state: state)
    c = Confirmation(
        node=0, speedup=6.0, candidate_ms=1.0, reference_ms=6.0, noise=0.01, repeats=30
    )
    confirmed = [(n, c, m) for n in ranked]
    winner, verdict = asyncio.run(
        opt.judge_confirmed(confirmed, problem, None, None, OptimizeOptions(), run, None)
    )
    assert judged == [3, 2] and winner is cluster and verdict.accepted
    # with nothing else left, the one that carries the edit is still judged
    judged.clear()
    winner, _ = asyncio.run(
        opt.judge_confirmed(confirmed[:2], problem, None, None, OptimizeOptions(), run, None)
    )
    assert judged == [3, 4] and winner is ranked[1]

    # KernelBench's L1 norm on an H100: fast math on the warp schedule (NaN on tiny inputs) and
    # the cluster schedule (a launch error at another size) each turned down; every other line
    # carries one of their edits: fast math on the cluster schedule reached another way carries
    # both, fast math alone one; that one is judged next
    judged.clear()
    unrolled = node(5, root, "unroll", {"factor": 8})
    again = node(7, unrolled, "warp_rows", {})
    ranked = [node(3, rows, "fast_math", fast), cluster, node(8, again, "fast_math", fast)]
    ranked.append(node(6, root, "fast_math", fast))

    async def judge_two(executor, job, options, measured, **kw):
        judged.append(job)
        ok = job not in (3, 2)
        return JudgeVerdict(accepted=ok, checks=[Check(name="checks", ok=ok, detail="NaN")])

    monkeypatch.setattr(opt, "judge", judge_two)
    confirmed = [(n, c, m) for n in ranked]
    winner, _ = asyncio.run(
        opt.judge_confirmed(confirmed, problem, None, None, OptimizeOptions(), run, None)
    )
    assert judged == [3, 2, 6] and winner is ranked[3]


def test_among_candidates_as_fast_within_the_noise_the_fewest_edits_wins():
    """Timing noise does not choose between a rewrite and the same rewrite plus a no-op edit;
    a candidate faster beyond the noise still comes first, whatever its depth."""
    from optiml.search.mcts import Node
    from optiml.search.optimize import rank_confirmed
    from optiml.search.trajectory import Confirmation

    def candidate(id: int, depth: int, speedup: float, noise: float = 0.004):
        n = Node(id=id, state=None, parent=None, action=None, key=None, prior=1.0, depth=depth)
        c = Confirmation(
            node=id,
            speedup=speedup,
            candidate_ms=1 / speedup,
            reference_ms=1.0,
            noise=noise,
            repeats=100,
        )
        return n, c, None

    rewrite_plus_restrict = candidate(1, depth=3, speedup=11.70)
    rewrite = candidate(2, depth=2, speedup=11.69)
    slower = candidate(3, depth=1, speedup=9.0)
    order = rank_confirmed([slower, rewrite, rewrite_plus_restrict], min_noise=0.01)
    assert [n.id for n, _, _ in order] == [2, 1, 3]

    # 3 % faster with a 1 % spread is faster, not a tie: depth does not matter then
    clearly_faster = candidate(4, depth=5, speedup=12.05)
    order = rank_confirmed([rewrite, clearly_faster, slower], min_noise=0.01)
    assert [n.id for n, _, _ in order] == [4, 2, 3]
    # a wide spread makes it a tie again
    noisy = candidate(5, depth=5, speedup=12.05, noise=0.05)
    assert [n.id for n, _, _ in rank_confirmed([noisy, rewrite], 0.01)] == [2, 5]
    assert rank_confirmed([], 0.01) == []


def test_no_profile_is_begun_that_would_end_after_the_search(monkeypatch):
    """A node is recorded only once its profile is in, and the search's stop cancels what is in
    flight: a candidate whose verdict comes within a profile's time of the stop is not profiled
    (its message says so) and is kept."""

    class SlowProfiles(StandInExecutor):
        async def evaluate(self, job, options, *, pinned=False):
            await asyncio.sleep(0.4)
            return await super().evaluate(job, options, pinned=pinned)

        async def profile(self, job, *, full=False):
            await asyncio.sleep(2.0)
            return await super().profile(job, full=full)

    # Verdicts paced by the clock alone (every candidate compiles, as far as this test is
    # concerned): with real builds a loaded machine left no verdict in the search's last
    # profile's time, and the test failed twice
    monkeypatch.setattr(
        sys.modules[__name__], "build_candidate", lambda *a, **k: SimpleNamespace(ok=True)
    )
    outcome, _ = run(SlowProfiles(), budget=200, max_seconds=10, judge=False)
    t = outcome.trajectory
    assert t.stop == "time"
    late = [
        n
        for n in t.nodes
        if n.measurement and "the search's time ends before a profile" in n.measurement.message
    ]
    # recorded, their verdicts kept, where a profile begun would have been cancelled with them
    assert late and all(n.measurement.profile is None for n in late)
    assert all(n.measurement.status == "ok" and n.reward is not None for n in late)


def test_only_a_new_best_is_profiled(monkeypatch):
    """A profile costs two to three checked runs and steers only the edits of the node it
    profiles: a candidate slower than the best so far is not profiled (its message says so), one
    at least as fast is; the winner has its profile (taken after the judge if the search had
    none)."""
    original = cost

    def slow_with_restrict(text: str) -> float:
        return original(text) * (2.0 if "__restrict__" in text else 1.0)

    monkeypatch.setitem(globals(), "cost", slow_with_restrict)  # the stand-in's cost model
    executor = StandInExecutor()
    outcome, _ = run(executor, budget=16)
    t = outcome.trajectory
    measured = [
        n
        for n in t.nodes
        if n.measurement and n.measurement.status == "ok" and n.parent is not None
    ]
    slow = [n for n in measured if "__restrict__" in n.kernel]
    assert slow, "the catalog proposed no __restrict__: the test needs another slow edit"
    for n in slow:
        assert n.measurement.profile is None
        assert "not profiled: 0." in n.measurement.message
        assert "behind the best so far" in n.measurement.message
    for n in measured:  # each one either profiled or told why not
        m = n.measurement
        assert (m.profile is not None) != ("not profiled" in m.message), m.message
    # the fastest candidate measured was the best when it was measured: profiled, unless it was
    # within the step of the profiled kernel it comes from
    fastest = max(measured, key=lambda n: n.measurement.speedup)
    assert fastest.measurement.profile is not None or "within 1.25x of the profiled kernel" in (
        fastest.measurement.message
    )
    assert t.winner is not None and t.winner_profile is not None
    for n in measured:  # never behind the best and profiled; never 1.25x past its steering and not
        m = n.measurement
        if "within 1.25x" in m.message:
            steered_by = float(m.message.split("comes from (")[1].split("x")[0])
            assert m.speedup < 1.25 * steered_by
    # fewer profiles than candidates evaluated (the input's full profile aside)
    assert executor.calls.count("profile") < executor.calls.count("evaluate") - 1


def test_a_time_budget_is_the_whole_runs_and_leaves_the_checks_their_share():
    """--time is the run's wall time: the search stops at (1 - FINISH_SHARE) of it, the input's
    measurement counted; the best is still confirmed and judged whole after that."""

    class Slow(StandInExecutor):
        async def evaluate(self, job, options, *, pinned=False):
            # 40 of these, 8 at a time, take longer than the search's share (12.5 s > 10.5 s)
            await asyncio.sleep(2.5)
            return await super().evaluate(job, options, pinned=pinned)

    budget_s = 14.0  # room for a few evaluations after the input's, on a loaded machine too
    outcome, events = run(Slow(), budget=40, max_seconds=budget_s)
    t = outcome.trajectory
    assert t.stop == "time" and 0 < t.evaluations < 40
    # the search ends at its share of the time (what finished meanwhile is recorded as it
    # winds down, and a selection under way — the catalog's proposals for a node, computed on
    # the loop — ends first: on a loaded machine that can take seconds with 8 in flight), far
    # short of the 40 evaluations left, and within the run's budget
    search_end = budget_s * (1 - FINISH_SHARE)
    searching = [e for e in events if e.phase == "search"]
    assert searching and searching[-1].seconds <= search_end + (budget_s - search_end)
    assert t.winner is not None and t.judge.accepted  # confirmed and judged regardless
    # the evaluations in flight at the stop are named (8 at a time, each 2.5 s: some were), and
    # the search returned soon after its deadline; each confirmation says how long it took
    ids = {n.id for n in t.nodes}
    assert t.stopped_in_flight and set(t.stopped_in_flight) <= ids
    assert all(t.nodes[i].measurement is None for i in t.stopped_in_flight)
    assert t.search_overrun_s is not None and 0 <= t.search_overrun_s < budget_s
    assert t.confirmed and all(c.seconds >= 2.5 for c in t.confirmed)
    phases = [e.phase for e in events]
    assert phases.index("confirm") > max(i for i, p in enumerate(phases) if p == "search")
    assert all(e.max_seconds == budget_s for e in events)


def test_the_search_gets_what_is_left_of_its_share_of_the_time():
    assert search_seconds(None, 30.0) is None  # the evaluation budget alone
    assert search_seconds(100.0, 20.0) == pytest.approx(100.0 * (1 - FINISH_SHARE) - 20.0)
    assert search_seconds(100.0, 90.0) == 0.0  # the input took it all: no search


def test_a_slow_inputs_run_keeps_more_for_confirming_and_judging():
    # a quarter of 90 s, or 9 times the input's checked, timed run where more (gemv's 5.5 s on an
    # H100: 49.5 s), never more than 60 % of the run
    assert finish_seconds(90.0) == finish_seconds(90.0, 1.1) == pytest.approx(22.5)
    assert finish_seconds(90.0, 5.5) == pytest.approx(49.5)
    assert finish_seconds(90.0, 30.0) == pytest.approx(54.0)
    assert search_seconds(90.0, 25.0, 5.5) == pytest.approx(90.0 - 49.5 - 25.0)
    e = Event(phase="search", seconds=20.0, max_seconds=90.0, finish_s=50.0)
    assert e.search_done() == pytest.approx(0.5)


def test_a_run_whose_input_took_all_its_time_says_nothing_was_evaluated():
    # (KernelBench's BatchNorm as once generated: 1.9 s a launch, its measurement 40 s of 90)
    t = asyncio.run(
        optimize(
            FIXTURES / "saxpy.cu", "saxpy", StandInExecutor(), OptimizeOptions(max_seconds=1e-3)
        )
    ).trajectory
    assert t.stop == "time" and t.evaluations == 0 and t.winner is None
    assert t.outcome.startswith("nothing was evaluated: measuring the input took ")
    assert "ms a launch" in t.outcome and t.outcome.endswith(
        "(--time, or the editor's optiml.seconds)"
    )


def test_progress_is_the_budget_that_runs_out_first():
    e = Event(phase="search", evaluations=6, budget=48, seconds=10.0, max_seconds=None)
    assert e.search_done() == pytest.approx(6 / 48)
    e = Event(phase="search", evaluations=6, budget=48, seconds=45.0, max_seconds=90.0)
    assert e.search_done() == pytest.approx(45.0 / (90.0 * (1 - FINISH_SHARE)))
    assert Event(phase="search", evaluations=60, budget=48).search_done() == 1.0
    assert Event(phase="search").search_done() is None


class References(StandInExecutor):
    """Records, per evaluation, whether the kernel as written was to be the reference."""

    def __init__(self) -> None:
        super().__init__()
        self.kernel_reference: list[bool] = []

    async def evaluate(self, job, options, *, pinned=False):
        self.kernel_reference.append(options.kernel_reference)
        return await super().evaluate(job, options, pinned=pinned)


def test_a_numpy_reference_checks_the_input_and_the_input_checks_the_candidates():
    # The input passes against the spec's NumPy function; candidates are then checked against
    # the input on the GPU (timed side by side with it: a speedup, where a NumPy reference gives
    # none), confirmed and judged the same way.
    ex = References()
    outcome = asyncio.run(
        optimize(FIXTURES / "numpy_ref" / "rmsnorm.cu", "rmsnorm", ex, OptimizeOptions(budget=4))
    )
    assert ex.kernel_reference[0] is False  # the input, against NumPy
    assert len(ex.kernel_reference) > 4 and all(ex.kernel_reference[1:])
    assert outcome.trajectory.evaluations == 4


def test_which_reference_a_candidate_is_checked_against():
    source, kernel, spec = load(FIXTURES / "numpy_ref" / "rmsnorm.cu", "rmsnorm")
    target, label = reference_of(source, kernel, spec, EvalOptions())
    assert target is None and label.startswith("rmsnorm in ") and label.endswith("rmsnorm_ref.py")
    target, label = reference_of(source, kernel, spec, EvalOptions(kernel_reference=True))
    assert target is not None and target.kernel is kernel and label.endswith("rmsnorm.cu")
    # a kernel checked against itself or another kernel is unchanged by the option
    source, kernel, spec = load(FIXTURES / "saxpy.cu", "saxpy")
    for opts in (EvalOptions(), EvalOptions(kernel_reference=True)):
        assert reference_of(source, kernel, spec, opts)[0].kernel is kernel


def _big_rmsnorm(tmp_path: Path) -> Path:
    """rmsnorm with a first size of 2^27 elements, beyond NumPy's reach; its second, within."""
    original = (FIXTURES / "numpy_ref" / "rmsnorm.cu").read_text()
    big = original.replace("(8192, 1024), (1000, 333)", "(131072, 1024), (1000, 333)")
    assert big != original
    (tmp_path / "rmsnorm.cu").write_text(big)
    (tmp_path / "rmsnorm_ref.py").write_text(
        (FIXTURES / "numpy_ref" / "rmsnorm_ref.py").read_text()
    )
    return tmp_path / "rmsnorm.cu"


class Steps:
    """Stands in for the harness's single evaluation: records its options, a case per size."""

    def __init__(self, fail_first: bool = False) -> None:
        self.options: list[EvalOptions] = []
        self.fail_first = fail_first

    def __call__(self, source, kernel, spec, candidate, opts) -> Verdict:
        self.options.append(opts)
        wrong = self.fail_first and len(self.options) == 1
        cases = [
            CaseResult(label=spec.case(s).label, launch={}, seeds=[])
            for s in opts.sizes or spec.sizes
        ]
        return Verdict(
            status="wrong_result" if wrong else "ok",
            message="y[3] is 1, expected 2" if wrong else "correct",
            file=source.path,
            kernel=kernel.name,
            reference="self" if opts.kernel_reference else "numpy",
            arch="sm_90",
            nvcc_version="13.0",
            date="2026-12-06",
            cases=cases,
            run_s=1.0,
        )


def test_sizes_beyond_numpys_reach_are_checked_against_the_kernel_once_it_passes(
    tmp_path, monkeypatch
):
    # NumPy checks the kernel at the size it can take (untimed: the first size is the one timed
    # where only the first is), then the kernel checks itself at the other, timed; one verdict.
    import optiml.harness.evaluate as harness

    source, kernel, spec = load(_big_rmsnorm(tmp_path), "rmsnorm")
    small = {"rows": 1000, "cols": 333}
    assert numpy_sizes(spec) == [small]
    steps = Steps()
    monkeypatch.setattr(harness, "_evaluate", steps)
    verdict = harness.evaluate(source, kernel, spec, options=EvalOptions(time_all_sizes=False))
    check, timed = steps.options
    assert check.sizes == [small] and not check.time and not check.kernel_reference
    assert timed.sizes == [spec.sizes[0]] and timed.time and timed.kernel_reference
    assert check.seeds == timed.seeds and check.seeds  # the same seeds in both steps
    assert verdict.ok and verdict.message.startswith(
        "checked against `rmsnorm` at rows=1000, cols=333 (larger sizes against `rmsnorm`"
    )
    assert [c.label for c in verdict.cases] == [spec.case(s).label for s in spec.sizes]
    assert verdict.run_s == 2.0 and verdict.reference == "numpy, then self"
    # failing against NumPy ends it there, saying where it was checked
    steps = Steps(fail_first=True)
    monkeypatch.setattr(harness, "_evaluate", steps)
    verdict = harness.evaluate(source, kernel, spec)
    assert verdict.status == "wrong_result" and len(steps.options) == 1
    assert verdict.message.startswith("y[3] is 1, expected 2 (checked against `rmsnorm` at")
    # every size against NumPy where asked (`optiml eval --numpy-all-sizes`), or sizes named
    for opts in (EvalOptions(numpy_elements=None), EvalOptions(sizes=spec.sizes)):
        steps = Steps()
        monkeypatch.setattr(harness, "_evaluate", steps)
        harness.evaluate(source, kernel, spec, options=opts)
        assert len(steps.options) == 1 and steps.options[0].sizes == opts.sizes
    # the declared sizes within reach of NumPy: all of them, and nothing to split
    _, _, spec = load(FIXTURES / "numpy_ref" / "rmsnorm.cu", "rmsnorm")
    assert numpy_sizes(spec) is None


def test_the_searchs_runners_start_ahead_unless_the_environment_says_not(monkeypatch):
    monkeypatch.delenv("OPTIML_RUNNER_AHEAD", raising=False)
    options = OptimizeOptions()
    assert options.search_eval.ahead and not options.confirm_eval.ahead
    monkeypatch.setenv("OPTIML_RUNNER_AHEAD", "0")
    assert not OptimizeOptions().search_eval.ahead


def _grid_stride_slow(text: str) -> float:
    """The stand-in GPU where a grid-stride loop runs 4x slower and packing 1.25x faster."""
    ms = BASE_MS / (1.25 if "optiml_pack" in text else 1.0)
    return ms * (4.0 if "blockDim.x * gridDim.x" in text else 1.0)


def _light_children_of_laggards(t) -> list[str]:
    """Light touches made of a variant more than 2x behind the best measured when it was
    expanded (here: every variant with a grid-stride loop, at 0.25x or 0.31x)."""
    by_id = {n.id: n for n in t.nodes}
    out = []
    for n in t.nodes:
        parent = by_id.get(n.parent) if n.parent is not None else None
        pm = parent.measurement if parent else None
        if pm and pm.speedup and pm.speedup < 0.5 and n.edit and light_touch(n.edit.transform):
            out.append(n.edit.transform)
    return out


def test_a_variant_far_behind_the_best_gets_no_light_touches(monkeypatch):
    monkeypatch.setitem(globals(), "cost", _grid_stride_slow)

    def run():
        options = OptimizeOptions(budget=24)
        return asyncio.run(
            optimize(FIXTURES / "saxpy.cu", "saxpy", StandInExecutor(), options)
        ).trajectory

    t = run()
    laggards = [n for n in t.nodes if n.measurement and (n.measurement.speedup or 1) < 0.5]
    assert laggards, "no grid-stride variant was measured"
    assert _light_children_of_laggards(t) == []
    # without the rule the same search gives them block sizes, unrolling, launch bounds
    monkeypatch.setattr("optiml.search.problem.light_touch", lambda transform: False)
    assert _light_children_of_laggards(run())


class Texts(StandInExecutor):
    """Records the text (and flags) of every evaluation the search made."""

    def __init__(self) -> None:
        super().__init__()
        self.searched: list[tuple[str, tuple[str, ...]]] = []

    async def evaluate(self, job, options, *, pinned=False):
        search = OptimizeOptions().search_eval  # not the confirmation's nor the judge's
        if job.candidate is not None and (options.reps_min, options.target_ms) == (
            search.reps_min,
            search.target_ms,
        ):
            self.searched.append((job.candidate.text, tuple(job.flags or ())))
        return await super().evaluate(job, options, pinned=pinned)


def test_no_text_is_evaluated_twice_under_two_names():
    """Edits that commute, or a block size set and set back, reach a text already in the tree:
    it is not added again (it would count against the budget as a second evaluation)."""
    ex = Texts()
    t = asyncio.run(
        optimize(FIXTURES / "saxpy.cu", "saxpy", ex, OptimizeOptions(budget=30))
    ).trajectory
    # every node measured is an evaluation of its own (the input's among them): without the rule,
    # 30 nodes of this search were 24 evaluations
    assert len(ex.searched) == len(set(ex.searched)) and len(ex.searched) > 10
    assert len([n for n in t.nodes if n.measurement]) == len(ex.searched)


def test_each_evaluation_says_when_it_began_got_its_verdict_and_ended():
    t = asyncio.run(
        optimize(FIXTURES / "saxpy.cu", "saxpy", StandInExecutor(), OptimizeOptions(budget=12))
    ).trajectory
    searched = [n.measurement for n in t.nodes[1:] if n.measurement]
    assert len(searched) >= 8
    for m in searched:
        assert 0 < m.started_s <= m.verdict_s <= m.ended_s <= t.wall_s
    # the input's measurement came first: every evaluation began after it
    assert min(m.started_s for m in searched) >= t.phase_s["baseline"] - 0.01
    # throughput.py lists them, in the order they began
    rows = load_script("benchmarks/throughput.py", "throughput_bench").rate(t.model_dump())
    assert len(rows["evaluations_s"]) == len(searched)
    assert [r[0] for r in rows["evaluations_s"]] == sorted(m.started_s for m in searched)


def test_the_inputs_reference_is_bounded_by_the_runs_time():
    """With a wall-time budget the input's measurement (against its NumPy function, where it
    has one) may give that function a tenth of it before a smaller size is checked instead;
    the search's candidates are checked against the input on the GPU."""

    class Options(StandInExecutor):
        seen: list[tuple[bool, float]] = []

        async def evaluate(self, job, options, *, pinned=False):
            self.seen.append((options.kernel_reference, options.reference_limit_s))
            return await super().evaluate(job, options, pinned=pinned)

    ex = Options()
    run(ex, budget=2, max_seconds=40.0)
    (first_ref, first_limit), *rest = ex.seen
    assert not first_ref and first_limit == pytest.approx(4.0)
    assert rest and all(kernel_reference for kernel_reference, _ in rest)
