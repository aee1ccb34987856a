"""The local executor's scheduling, without a GPU: several GPU slots, compiles on the CPU pool while
every slot is busy, never two runs on one GPU at a time, and `--gpus` parsing."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from optiml.cuda.source import SourceFile
from optiml.errors import OptimlError
from optiml.executors import LocalExecutor, parse_gpus
from optiml.harness.evaluate import EvalOptions, build_candidate
from optiml.search.catalog import CATALOG, Context
from optiml.search.variant import Variant
from optiml.spec import load
from tests.support import FIXTURES


def test_gpus_option():
    assert parse_gpus("all") is None and parse_gpus(None) is None
    assert parse_gpus("0,2") == [0, 2]
    for bad in ("x", "0,0", "-1", ","):
        with pytest.raises(OptimlError):
            parse_gpus(bad)
    with pytest.raises(OptimlError, match="no GPU 3"):
        LocalExecutor([0, 3], device_count=2)


def test_each_gpu_runs_one_candidate_at_a_time_and_all_are_kept_busy():
    ex = LocalExecutor([0, 1, 2, 3], device_count=4, compile_workers=2)
    busy: dict[str, int] = {}
    peak = {"slots": 0}
    lock = threading.Lock()
    log: list[str] = []

    def work(env: dict[str, str]) -> str:
        gpu = env["CUDA_VISIBLE_DEVICES"]
        with lock:
            assert busy.get(gpu, 0) == 0, f"two runs on GPU {gpu}"
            busy[gpu] = 1
            peak["slots"] = max(peak["slots"], sum(busy.values()))
        time.sleep(0.05)
        with lock:
            busy[gpu] = 0
            log.append(gpu)
        return gpu

    async def main():
        return await asyncio.gather(*(ex.run_on_gpu(work) for _ in range(16)))

    used = asyncio.run(main())
    assert sorted(set(used)) == ["0", "1", "2", "3"]
    assert peak["slots"] == 4 and len(log) == 16


def test_compiles_overlap_with_gpu_runs():
    """Compile-only work of several candidates on the CPU pool while the (stand-in) GPU slots run:
    real nvcc builds of catalog variants of saxpy, two at a time, during 0.2 s GPU runs."""
    source, kernel, spec = load(FIXTURES / "saxpy.cu", "saxpy")
    ctx = Context.of(Variant(source.text), source.path, "saxpy")
    variants = [p.variant for t in CATALOG.values() for p in t.propose(ctx)][:4]
    ex = LocalExecutor([0, 1], device_count=2, compile_workers=2)
    spans: dict[str, list[tuple[float, float]]] = {"compile": [], "gpu": []}

    def compile_one(v: Variant):
        t0 = time.perf_counter()
        b = build_candidate(
            source, kernel, spec, SourceFile(v.text, source.path), EvalOptions(arch="sm_90")
        )
        spans["compile"].append((t0, time.perf_counter()))
        return b.ok

    def gpu_run(env):
        t0 = time.perf_counter()
        time.sleep(0.2)
        spans["gpu"].append((t0, time.perf_counter()))

    async def main():
        loop = asyncio.get_running_loop()
        gpu = [asyncio.create_task(ex.run_on_gpu(gpu_run)) for _ in range(6)]
        builds = [loop.run_in_executor(ex._compile, compile_one, v) for v in variants]
        ok = await asyncio.gather(*builds)
        await asyncio.gather(*gpu)
        return ok

    assert all(asyncio.run(main()))
    first_gpu_end = min(e for _, e in spans["gpu"])
    assert min(s for s, _ in spans["compile"]) < first_gpu_end  # compiling while GPUs run


def test_pinned_runs_share_the_first_gpu():
    ex = LocalExecutor([2, 3], device_count=4)

    async def main():
        return await asyncio.gather(
            *(ex.run_on_gpu(lambda env: env["CUDA_VISIBLE_DEVICES"], pinned=True) for _ in range(5))
        )

    assert asyncio.run(main()) == ["2"] * 5


def test_a_catalog_variant_is_a_job_whose_target_is_the_variant():
    from optiml.executors.base import Job

    source, kernel, spec = load(FIXTURES / "saxpy.cu", "saxpy")
    ctx = Context.of(Variant(source.text), source.path, "saxpy")
    proposal = CATALOG["vector_map"].propose(ctx)[0]
    job = Job.of_variant(source, kernel, spec, proposal.variant)
    assert job.candidate.text == proposal.variant.text and job.candidate.path == source.path
    assert job.flags == proposal.variant.flags
    assert job.target[0] is job.candidate and job.target[1].name == "saxpy"


def test_a_precompile_and_the_evaluation_after_it_share_one_build(monkeypatch):
    """`precompile` (while the input is measured) starts the candidate's build on the CPU pool;
    an evaluation of the same candidate while it runs waits for that build instead of starting
    another, and a candidate that does not compile is no error of `precompile`'s."""
    import optiml.executors.local as local
    from optiml.executors.base import Job

    source, kernel, spec = load(FIXTURES / "saxpy.cu", "saxpy")
    ctx = Context.of(Variant(source.text), source.path, "saxpy")
    job = Job.of_variant(source, kernel, spec, CATALOG["vector_map"].propose(ctx)[0].variant)
    built: list[str] = []

    def slow_build(src, k, sp, candidate, opts):
        time.sleep(0.3)
        built.append(candidate.text)
        if "BROKEN" in candidate.text:
            raise OptimlError("does not compile")
        return None

    monkeypatch.setattr(local, "build_candidate", slow_build)
    monkeypatch.setattr(local, "evaluate", lambda *a, **k: _verdict("verdict"))
    ex = LocalExecutor([0], device_count=1, compile_workers=4)
    options = EvalOptions(arch="sm_90")

    async def main():
        pre = asyncio.create_task(ex.precompile(job, options))
        await asyncio.sleep(0.05)  # the build is running
        verdict = await ex.evaluate(job, options)
        await pre
        broken = Job(source, kernel, spec, SourceFile("BROKEN" + job.candidate.text, source.path))
        await ex.precompile(broken, options)  # no exception
        return verdict

    assert asyncio.run(main()).message == "verdict"
    assert built.count(job.candidate.text) == 1
    assert ex._building == {}  # nothing left behind


def _verdict(message: str, compile_s: float = 0.0):
    from optiml.harness.verdict import Verdict

    return Verdict(
        status="ok",
        message=message,
        compile_s=compile_s,
        file="saxpy.cu",
        kernel="saxpy",
        reference="self",
        arch="sm_90",
        nvcc_version="13.0",
        date="2026-12-07",
    )


def test_an_evaluation_says_where_it_waited(monkeypatch):
    """Two candidates on one compile worker and one GPU, a 0.4 s run already holding the GPU:
    the second's build waited for the first's (its build 0.6 s, its nvcc 0.3 s), and the first's
    run for the GPU; a verdict names both waits, which its steps do not count."""
    from types import SimpleNamespace

    import optiml.executors.local as local
    from optiml.executors.base import Job

    source, kernel, spec = load(FIXTURES / "saxpy.cu", "saxpy")
    ctx = Context.of(Variant(source.text), source.path, "saxpy")
    jobs = [
        Job.of_variant(source, kernel, spec, p.variant)
        for p in CATALOG["vector_map"].propose(ctx)[:2]
    ]
    assert jobs[0].candidate.text != jobs[1].candidate.text

    def build(*a):
        time.sleep(0.3)
        return SimpleNamespace(seconds=0.3)

    def run(*a, **k):
        time.sleep(0.1)
        return _verdict("run", compile_s=0.01)

    monkeypatch.setattr(local, "build_candidate", build)
    monkeypatch.setattr(local, "evaluate", run)
    ex = LocalExecutor([0], device_count=1, compile_workers=1)
    options = EvalOptions(arch="sm_90")

    async def main():
        held = asyncio.create_task(ex.run_on_gpu(lambda env: time.sleep(0.4)))
        await asyncio.sleep(0.01)
        return await asyncio.gather(*(ex.evaluate(j, options) for j in jobs)), await held

    (first, second), _ = asyncio.run(main())
    assert first.compile_s == second.compile_s == 0.3
    assert first.build_s >= 0.28 and second.build_s >= first.build_s + 0.25  # queued behind it
    assert second.build_s - second.compile_s >= 0.25  # a wait that nvcc's time does not hold
    assert first.gpu_wait_s >= 0.05  # the held run's last 0.1 s
    # in the trajectory's measurement too
    from optiml.search.trajectory import Measurement

    m = Measurement.of(second)
    assert (m.build_s, m.gpu_wait_s) == (second.build_s, second.gpu_wait_s)


def test_an_evaluation_says_what_its_candidates_compile_took(monkeypatch):
    """The candidate compiles on the CPU pool before its run, which then finds it in the cache: the
    verdict's compile time is nvcc's, not the cache lookup's."""
    from types import SimpleNamespace

    import optiml.executors.local as local
    from optiml.executors.base import Job
    from optiml.harness.verdict import Verdict

    source, kernel, spec = load(FIXTURES / "saxpy.cu", "saxpy")
    ctx = Context.of(Variant(source.text), source.path, "saxpy")
    job = Job.of_variant(source, kernel, spec, CATALOG["vector_map"].propose(ctx)[0].variant)
    monkeypatch.setattr(local, "build_candidate", lambda *a: SimpleNamespace(seconds=2.5))
    base = dict(
        file="saxpy.cu",
        kernel="saxpy",
        reference="self",
        arch="sm_90",
        nvcc_version="13.0",
        date="2026-12-06",
    )
    found = Verdict(status="ok", message="correct", compile_s=0.01, **base)
    monkeypatch.setattr(local, "evaluate", lambda *a, **k: found)
    ex = LocalExecutor([0], device_count=1, compile_workers=1)
    assert asyncio.run(ex.evaluate(job, EvalOptions(arch="sm_90"))).compile_s == 2.5


def test_a_cancelled_run_holds_its_gpu_until_its_processes_are_killed():
    """A cancel does not stop the thread that runs on the GPU: its processes (a runner) are
    killed, and the next run there waits until the thread has seen them end, so that it is not
    timed beside them; another run's processes live on."""
    from optiml.harness import procs

    ex = LocalExecutor([0, 1], device_count=2)
    spans: list[tuple[float, float]] = []

    def gpu_run(env):
        t0 = time.perf_counter()
        with procs.spawned(["sleep", "30"]) as proc:
            proc.wait()
        spans.append((t0, time.perf_counter()))
        return env["CUDA_VISIBLE_DEVICES"]

    async def main():
        first = asyncio.create_task(ex.run_on_gpu(gpu_run, pinned=True))
        other = asyncio.create_task(ex.run_on_gpu(gpu_run))  # on the other GPU
        await asyncio.sleep(0.5)  # both running
        first.cancel()
        started = time.perf_counter()
        with pytest.raises(asyncio.CancelledError):
            await first
        waited = time.perf_counter() - started
        assert len(spans) == 1  # its thread has ended by then: the GPU is free of it
        assert not other.done()
        other.cancel()
        with pytest.raises(asyncio.CancelledError):
            await other
        return waited

    waited = asyncio.run(main())
    assert waited < 10  # killed, not waited out (30 s)
    assert len(spans) == 2 and all(e - s < 10 for s, e in spans)
