"""On a GPU: what every evaluation checks beyond the outputs of its checked runs. Each candidate
below is a small, real trick against the saxpy fixture that the checked runs alone would pass; each
must get the verdict of the check made for it, and an honest rewrite must pass all of them. (The
whole corpus of tricks and honest controls is fixtures/tricks/, run by benchmarks/tricks.py.)"""

from __future__ import annotations

import pytest

from optiml.cuda.source import SourceFile
from optiml.harness.evaluate import EvalOptions, evaluate
from optiml.harness.gpu import default_arch
from optiml.harness.sanitize import TOOLS, sanitize
from optiml.spec import load
from tests.support import FIXTURES

pytestmark = pytest.mark.gpu

SAXPY = FIXTURES / "saxpy.cu"
TEXT = SAXPY.read_text()
BODY_START = TEXT.index("{", TEXT.index("__global__ void saxpy"))


def candidate(body: str, before: str = "") -> SourceFile:
    """saxpy.cu with the kernel's body replaced (and `before` put above the kernel's spec)."""
    head = TEXT[:BODY_START]
    spec_at = head.index("/* @optiml")
    text = head[:spec_at] + before + head[spec_at:] + "{\n" + body + "\n}\n"
    return SourceFile(text, str(FIXTURES / "saxpy_variant.cu"))


def run(cand: SourceFile | None, **kw):
    source, kernel, spec = load(SAXPY, "saxpy")
    return evaluate(source, kernel, spec, cand, EvalOptions(arch=default_arch(), **kw))


HONEST = """
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
"""


def test_an_honest_candidate_passes_every_check():
    v = run(candidate(HONEST.replace("y[i] = a", "y[i] = a") + "// same work, another text"))
    assert v.status == "ok", v.message
    t = v.cases[0].timing
    assert t.fresh_inputs and t.compared and t.checked_launches >= 2 and t.mismatches == 0
    assert "timed launches' outputs" in v.check
    floor = v.cases[0].floor
    assert floor is not None and 0 < floor.ms < t.candidate.min_ms
    # x read and y read and written: at least x and y's bytes (y's writes may stay in the L2)
    assert floor.bytes >= 2 * 4 * (1 << 26)


def test_work_skipped_after_some_launches_is_caught():
    skip = candidate(
        """
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (launches > 8) return;  // the checks are over: the timing loop gets no work
    if (i == 0) atomicAdd(&launches, 1u);
    if (i < n) y[i] = a * x[i] + y[i];
""",
        before="__device__ unsigned launches;\n",
    )
    v = run(skip)
    # caught by whichever checked run comes after the eighth launch
    assert v.status == "wrong_result" and v.check in ("outputs", "timed launches' outputs"), (
        v.message
    )


def test_outputs_reused_from_an_earlier_launch_are_caught():
    reuse = candidate(
        """
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    if (seen[i % 1024] == x[i % 1024]) { y[i] = cache[i % 4096]; return; }
    float r = a * x[i] + y[i];
    if (i < 1024) seen[i] = x[i];
    if (i < 4096) cache[i] = r;
    y[i] = r;
""",
        before="__device__ float seen[1024];\n__device__ float cache[4096];\n",
    )
    assert run(reuse).status == "wrong_result"


def test_a_candidate_that_writes_its_input_gets_modified_input():
    writes_x = candidate(
        """
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { y[i] = a * x[i] + y[i]; const_cast<float*>(x)[i] = 0.0f; }
"""
    )
    v = run(writes_x)
    assert v.status == "modified_input" and v.check == "input checksums", v.message
    assert "`x`" in v.message


def test_a_write_just_past_the_output_is_caught_by_the_guard_regions():
    past = candidate(
        """
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
    if (i == n) y[n] = 0.0f;  // one element past the end: inside the allocation's padding
"""
    )
    v = run(past, time=False)
    assert v.status == "runtime_error" and v.check == "guard regions", v.message


def test_state_kept_across_launches_shows_when_it_is_reset():
    cached = candidate(
        """
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i] + scale - 1.0f;
""",
        before="__device__ float scale = 1.0f;\n",
    )
    assert run(cached, time=False).status == "ok"
    v = run(cached, time=False, state_poison=True)
    assert v.status == "wrong_result", v.message


def test_the_ceilings_are_measured_once_and_cached():
    from optiml.harness.ceilings import device_ceilings

    v = run(None, time=False)
    first = device_ceilings(v.device)
    assert first is not None and 1000 < first.best_gbs < 20000  # GB/s, of some real device
    assert device_ceilings(v.device) == first


@pytest.mark.parametrize("tool", TOOLS)
def test_every_sanitizer_runs_clean_on_the_fixture_at_two_sizes(tool):
    source, kernel, spec = load(SAXPY, "saxpy")
    report = sanitize(source, kernel, spec, tool, sizes=[{"n": 1000003}, {"n": 4099}])
    assert report.ok, report.messages
    assert report.size == "n=1000003; n=4099"


def test_initcheck_sees_an_output_read_before_it_is_written():
    source = SourceFile(
        """
/* @optiml
 *   args: x: in float[n], y: out float[n]
 *   launch: grid = cdiv(n, 256), block = 256
 *   sizes: n = 100003, 4099
 */
__global__ void accumulate(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 0.0f * y[i] + x[i];  // reads y before anything wrote it
}
""",
        str(FIXTURES / "reads_output.cu"),
    )
    kernel = source.kernel("accumulate")
    from optiml.spec import parse_spec

    spec = parse_spec(source, kernel)
    assert not sanitize(source, kernel, spec, "initcheck").ok
    assert sanitize(source, kernel, spec, "memcheck").ok


def test_an_output_kept_for_inputs_that_look_the_same_is_caught_at_a_near_repeat():
    # keyed on the first and last elements of x: fresh inputs always miss, a launch on the previous
    # launch's inputs with one element changed elsewhere hits and returns the kept output
    keyed = candidate(
        """
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (key[0] == x[0] && key[1] == x[n - 1]) { if (i < n) y[i] = kept[i % 4096]; return; }
    if (i < n) { float r = a * x[i] + y[i]; if (i < 4096) kept[i] = r; y[i] = r; }
    if (i == 0) { key[0] = x[0]; key[1] = x[n - 1]; }
""",
        before="__device__ float kept[4096];\n__device__ float key[2];\n",
    )
    v = run(keyed, sizes=[{"n": 4096}], timed_checks=1.0)
    assert v.status == "wrong_result" and v.check == "timed launches' outputs", v.message
    assert "one element changed" in v.message


EDGE = """
/* @optiml
 *   args:   y: out float[n], x: in float[n] in [0, 1)
 *   launch: grid = cdiv(n, 256), block = 256
 *   sizes:  n = 1 << 22, 262147
 */
__global__ void bins(float* y, const float* x, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = floorf(x[i] * 4096.0f);
}
"""


def _bins(tmp_path, expr: str, **options):
    original = tmp_path / "bins.cu"
    original.write_text(EDGE)
    source, kernel, spec = load(original, "bins")
    cand = SourceFile(EDGE.replace("floorf(x[i] * 4096.0f)", expr), str(tmp_path / "variant.cu"))
    options = {"time": False, "seeds": (1, 2), **options}
    return evaluate(source, kernel, spec, cand, EvalOptions(arch=default_arch(), **options))


def test_a_result_within_rounding_of_its_edge_is_not_held_against_a_candidate(tmp_path):
    # The reference's product is exact (a power of two), so it is never off; the candidate's
    # factor is one unit in the last place larger: it differs where 4096x lies within rounding of
    # an integer, where the exact result itself jumps when x moves by rounding — about a thousand
    # of the 2^22 inputs, each off by a whole bin, far outside the tolerance.
    v = _bins(tmp_path, "floorf(x[i] * 4096.0005f)")
    assert v.status == "ok", v.message
    # and on the timed launches' fresh inputs, every one of them checked
    v = _bins(
        tmp_path, "floorf(x[i] * 4096.0005f)", time=True, timed_checks=1.0, reps_min=8, reps_max=8
    )
    assert v.status == "ok", v.message
    assert v.cases[0].timing.checked_launches >= 8


def test_a_wrong_result_near_an_edge_is_still_wrong(tmp_path):
    # Off by far more than rounding: the edges move by a hundredth of a bin.
    v = _bins(tmp_path, "floorf(x[i] * 4096.0f + 0.01f)")
    assert v.status == "wrong_result", v.message
    assert "where the exact result's own movement under rounding" in v.message


def test_a_timed_launch_that_is_wrong_only_every_other_launch_stays_wrong():
    # The oracle's second look at a timed launch runs both kernels again on its inputs; a
    # candidate whose wrong answers depend on a launch count would be right in that run. The
    # difference must come back as it was, or it stands.
    alternate = candidate(
        """
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    bool odd = launches & 1u;
    __syncthreads();
    if (i == 0 && blockIdx.x == 0) atomicAdd(&launches, 1u);
    if (i < n) y[i] = a * x[i] + y[i] + (odd && launches > 8 ? 1.0f : 0.0f);
""",
        before="__device__ unsigned launches;\n",
    )
    v = run(alternate, timed_checks=1.0)
    assert v.status == "wrong_result", v.message
