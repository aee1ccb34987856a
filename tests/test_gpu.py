"""On a GPU: every fixture gets its right verdict, a faulting candidate leaves the next evaluation
working, candidates are checked against the original, and a NumPy reference works end to end."""

from __future__ import annotations

import pytest

from optiml.cuda.source import SourceFile
from optiml.harness.evaluate import EvalOptions, evaluate
from optiml.harness.gpu import default_arch
from optiml.profile.static import occupancy
from optiml.spec import load, parse_spec
from tests.support import BROKEN, FIXTURES, GOOD, fixture_ids

pytestmark = pytest.mark.gpu


def opts(**kw) -> EvalOptions:
    return EvalOptions(arch=default_arch(), **kw)


def run_fixture(entry, **kw):
    source = SourceFile.read(FIXTURES / entry["file"])
    kernel = source.kernel(entry["kernel"])
    spec = parse_spec(source, kernel)
    return evaluate(source, kernel, spec, None, opts(**kw))


@pytest.mark.parametrize("entry", GOOD, ids=fixture_ids(GOOD))
def test_good_fixture_is_ok(entry):
    v = run_fixture(entry, time=False)
    assert v.status == "ok", v.message
    assert v.device is not None and v.device.sm_count > 0
    for case in v.cases:
        assert len(case.seeds) >= 2
        attrs = case.attributes["candidate"]
        launch = case.launch["candidate"]
        predicted = occupancy(
            default_arch(), launch.threads, attrs.registers, attrs.static_smem + launch.smem
        )
        assert predicted.blocks_per_sm == attrs.blocks_per_sm  # our formula vs the CUDA runtime's


# A hung kernel's process killed at the time limit, or a faulting one, can disturb kernels of other
# processes on the same GPU (the search runs one at a time); run in parallel (pytest-xdist), these
# stay on one worker: `-n N --dist loadgroup`.
FAULTS = pytest.mark.xdist_group("faults")


@FAULTS
@pytest.mark.parametrize("entry", BROKEN, ids=fixture_ids(BROKEN))
def test_broken_fixture_gets_its_verdict(entry):
    v = run_fixture(entry, time=False, timeout_s=10)
    assert v.status == entry["verdict"], v.message
    if v.status == "compile_error":
        assert v.messages[0].line == entry["error_line"]
    if v.status == "runtime_error":
        assert "cudaErrorIllegalAddress" in v.message
    if v.status == "timeout":
        assert "while running the kernel at" in v.message
    if v.status == "wrong_result":
        bad = [b for c in v.cases for s in c.seeds for b in s.buffers if b.mismatches]
        assert bad and bad[0].first, v.message


def test_unwritten_elements_are_named():
    entry = next(e for e in BROKEN if e["file"] == "broken/unwritten_output.cu")
    v = run_fixture(entry, time=False)
    assert v.status == "wrong_result" and "was not written" in v.message
    tail = v.cases[-1].seeds[0].buffers[0]
    assert tail.unwritten == 3 and all(m.unwritten and m.got == "(unwritten)" for m in tail.first)


@FAULTS
def test_a_good_kernel_still_passes_after_faulting_ones():
    faulting = [e for e in BROKEN if e["verdict"] in ("runtime_error", "timeout")]
    saxpy = next(e for e in GOOD if e["file"] == "saxpy.cu")
    for entry in faulting:
        v = run_fixture(entry, time=False, timeout_s=10)
        assert v.status == entry["verdict"], v.message
        v = run_fixture(saxpy, time=False)
        assert v.status == "ok", v.message


def test_a_faster_candidate_is_correct_and_timed():
    source, kernel, spec = load(FIXTURES / "saxpy.cu", "saxpy")
    candidate = SourceFile.read(FIXTURES / "candidates" / "saxpy_float4.cu")
    v = evaluate(source, kernel, spec, candidate, opts())
    assert v.status == "ok", v.message
    t = v.cases[0].timing
    assert t.candidate.reps >= 20 and t.reference.reps >= 20
    assert t.candidate.q1_ms <= t.candidate.median_ms <= t.candidate.q3_ms
    assert v.cases[0].launch["candidate"].grid[0] * 4 == pytest.approx(
        v.cases[0].launch["reference"].grid[0], abs=4
    )
    assert v.speedup is not None and v.speedup > 1.0
    assert all(mhz > 0 for mhz in t.sm_clock_mhz)


def test_a_slow_round_is_its_own_warm_up_and_is_timed_briefly():
    # every round counts as slow here: one launch each warms up, then 10 target times (none)
    # give the least, 5 launches, and reps_min no more than that
    source, kernel, spec = load(FIXTURES / "saxpy.cu", "saxpy")
    candidate = SourceFile.read(FIXTURES / "candidates" / "saxpy_float4.cu")
    v = evaluate(
        source, kernel, spec, candidate, opts(slow_round_ms=1e-9, target_ms=1e-9, reps_min=8)
    )
    assert v.status == "ok", v.message
    t = v.cases[0].timing
    assert t.warmup_rounds == 0 and t.candidate.reps == 5 and t.reference.reps == 5
    # not slow: rounds of 5 until two agree, and then at least reps_min
    v = evaluate(source, kernel, spec, candidate, opts(slow_round_ms=None, reps_min=8))
    t = v.cases[0].timing
    assert t.warmup_rounds >= 1 and t.candidate.reps >= 8


def test_a_candidate_far_slower_than_its_reference_is_timed_by_its_first_round():
    """With `give_up` and a slow round (both made to hold here) the first round is the timing;
    without `give_up`, the slow round's own timing (5 launches)."""
    source, kernel, spec = load(FIXTURES / "saxpy.cu", "saxpy")
    candidate = SourceFile.read(FIXTURES / "candidates" / "saxpy_float4.cu")
    slow = opts(slow_round_ms=1e-9, target_ms=1e-9, reps_min=8)  # without give_up
    v = evaluate(
        source,
        kernel,
        spec,
        candidate,
        opts(slow_round_ms=1e-9, target_ms=1e-9, reps_min=8, give_up=1e-9),
    )
    assert v.status == "ok", v.message
    t = v.cases[0].timing
    assert t.coarse and t.candidate.reps == 1 and t.reference.reps == 1
    assert "timed by one launch" in v.message
    t = evaluate(source, kernel, spec, candidate, slow).cases[0].timing
    assert not t.coarse and t.candidate.reps == 5


def test_a_reference_time_measured_before_is_not_measured_again():
    """`reference_ms`: the reference is not timed beside the candidate (its stats are that time,
    0 launches) and the timed launches' outputs are not compared; the seeds' runs still are (a
    wrong candidate is still wrong)."""
    source, kernel, spec = load(FIXTURES / "saxpy.cu", "saxpy")
    candidate = SourceFile.read(FIXTURES / "candidates" / "saxpy_float4.cu")
    before = opts(time_all_sizes=False, reference_ms=123.0)
    v = evaluate(source, kernel, spec, candidate, before)
    assert v.status == "ok", v.message
    t = v.cases[0].timing
    assert t.reference_before and t.reference.median_ms == 123.0 and t.reference.reps == 0
    assert not t.compared and t.candidate.reps >= 5 and "measured before" in v.message
    wrong = SourceFile(candidate.text.replace("a * xv.x + yv.x", "a * xv.x - yv.x"), "w.cu")
    assert wrong.text != candidate.text
    assert evaluate(source, kernel, spec, wrong, before).status == "wrong_result"


def test_a_launch_slower_than_any_floor_is_not_probed():
    """The dependence probes lower the floor's bound only: a launch slower than a slow round and
    than all its bytes at 20 TB/s makes none (samples 0), one that is not slow makes them."""
    source, kernel, spec = load(FIXTURES / "saxpy.cu", "saxpy")
    candidate = SourceFile.read(FIXTURES / "candidates" / "saxpy_float4.cu")
    slow = evaluate(source, kernel, spec, candidate, opts(slow_round_ms=1e-9, reps_min=5))
    assert slow.status == "ok", slow.message
    assert slow.cases[0].dependence and all(d.samples == 0 for d in slow.cases[0].dependence)
    plain = evaluate(source, kernel, spec, candidate, opts(slow_round_ms=None, reps_min=5))
    assert plain.cases[0].dependence and all(d.samples > 0 for d in plain.cases[0].dependence)


def test_static_and_dynamic_shared_memory_over_48_kb_together_are_opted_in(tmp_path):
    """40 KB declared in the kernel and 16 KB at launch: each under 48 KB, together over it, which
    a launch without the opt-in refuses (invalid argument)."""
    source, kernel, spec = load(FIXTURES / "saxpy.cu", "saxpy")
    text = source.text.replace(
        "launch: grid = cdiv(n, 256), block = 256",
        "launch: grid = cdiv(n, 256), block = 256, smem = 16384",
    ).replace(
        "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n",
        "    __shared__ float stat[10240];\n"
        "    extern __shared__ float dyn[];\n"
        "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
        "    stat[threadIdx.x] = a;\n"
        "    dyn[threadIdx.x + 3840] = stat[threadIdx.x];\n"
        "    __syncthreads();\n"
        "    a = dyn[threadIdx.x + 3840];\n",
    )
    assert "smem = 16384" in text and "stat[10240]" in text
    (tmp_path / "saxpy.cu").write_text(text)
    v = evaluate(source, kernel, spec, SourceFile.read(tmp_path / "saxpy.cu"), opts(time=False))
    assert v.status == "ok", v.message


def test_a_wrong_candidate_is_caught_at_its_first_bad_element(tmp_path):
    source, kernel, spec = load(FIXTURES / "saxpy.cu", "saxpy")
    text = source.text.replace("if (i < n)", "if (i < n && i != 777)")
    (tmp_path / "saxpy.cu").write_text(text)
    v = evaluate(source, kernel, spec, SourceFile.read(tmp_path / "saxpy.cu"), opts(time=False))
    assert v.status == "wrong_result"
    first = v.cases[0].seeds[0].buffers[0].first[0]
    assert first.index == 777 and "y[777]" in v.message


def test_a_candidate_that_changes_the_signature_is_rejected(tmp_path):
    source, kernel, spec = load(FIXTURES / "saxpy.cu", "saxpy")
    (tmp_path / "saxpy.cu").write_text(source.text.replace("float a,", "double a,"))
    v = evaluate(source, kernel, spec, SourceFile.read(tmp_path / "saxpy.cu"), opts(time=False))
    assert v.status == "compile_error" and "must keep the parameters" in v.message


def test_numpy_reference_end_to_end(tmp_path):
    source, kernel, spec = load(FIXTURES / "numpy_ref" / "rmsnorm.cu", "rmsnorm")
    assert spec.reference.kind == "numpy"
    assert evaluate(source, kernel, spec, None, opts(time=False)).status == "ok"
    wrong = tmp_path / "rmsnorm.cu"
    wrong.write_text(source.text.replace("ss / cols + eps", "ss / (cols + 1) + eps"))
    (tmp_path / "rmsnorm_ref.py").write_text(
        (FIXTURES / "numpy_ref" / "rmsnorm_ref.py").read_text()
    )
    v = evaluate(source, kernel, spec, SourceFile.read(wrong), opts(time=False))
    assert v.status == "wrong_result"


PROBE = """
/* @optiml
 *   args:   x: in float[n] in [-1, 1), k: in int[n] in [-100, 100), d: inout double[n] in [-1, 1),
 *           y: out float[n]
 *   launch: grid = 1, block = 1
 *   sizes:  n = 3000017
 */
__global__ void probe(int n, const float* x, const int* k, double* d, float* y)
{
    const int at[4] = {0, 1, 77777, 3000016};
    const unsigned xs[4] = {%s};
    const int ks[4] = {%s};
    const unsigned long long ds[4] = {%s};
    for (int j = 0; j < 4; ++j) {
        const int i = at[j];
        if (__float_as_uint(x[i]) != xs[j] || k[i] != ks[j] ||
            (unsigned long long)__double_as_longlong(d[i]) != ds[j] ||
            __float_as_uint(y[i]) != 0x7FA5DEADu)
            __trap();
    }
}
"""


def test_a_profilers_inputs_are_the_checks_inputs(tmp_path):
    """The runner makes a profiler's inputs on the device; they are, bit for bit, the inputs the
    checks use (inputs.py's), and its outputs are poisoned alike: the probe traps otherwise."""
    import subprocess

    import numpy as np

    from optiml.harness import inputs
    from optiml.harness.build import build_kernel
    from optiml.harness.evaluate import launch_once

    at, seed, n = [0, 1, 77777, 3000016], 1, 3000017
    x = inputs.generate("f32", 0, n, seed, -1.0, 1.0)[at].view(np.uint32)
    k = inputs.generate("i32", 1, n, seed, -100, 100)[at]
    d = inputs.generate("f64", 2, n, seed, -1.0, 1.0)[at].view(np.uint64)
    text = PROBE % (
        ", ".join(f"{v}u" for v in x),
        ", ".join(str(v) for v in k),
        ", ".join(f"{v}ull" for v in d),
    )
    path = tmp_path / "probe.cu"
    path.write_text(text)
    source = SourceFile.read(path)
    kernel = source.kernel("probe")
    spec = parse_spec(source, kernel)
    build = build_kernel(source, kernel, instantiation=spec.instantiation, arch=default_arch())
    assert build.ok, build.messages
    case, arch = spec.case(spec.sizes[0]), default_arch()
    ok = subprocess.run(
        launch_once(spec, case, arch, build.path, tmp_path, seed=seed),
        capture_output=True,
        text=True,
    )
    assert ok.returncode == 0, ok.stdout + ok.stderr
    # The probe can fail: with other seeds' inputs it traps.
    bad = subprocess.run(
        launch_once(spec, case, arch, build.path, tmp_path, seed=2), capture_output=True, text=True
    )
    assert bad.returncode != 0


def test_the_gpus_limits_from_the_runtime_agree_with_the_table():
    """Where the GPU is the target `optiml check` takes its limits from the CUDA runtime; on a GPU
    the table knows, the two agree (so the table is right where no GPU is there to ask)."""
    from optiml.harness.device import gpu_limits
    from optiml.profile.static import table_for

    found = gpu_limits()
    assert found is not None and found["arch"] == default_arch().rstrip("af")
    from_device, _ = table_for(found["arch"], found)
    table, note = table_for(found["arch"])
    if note is not None:
        pytest.skip(f"the table has no row for {found['arch']}")
    assert from_device == table
