"""How the host runs a block's threads (optiml/harness/host.py, `host_mode`): one after another
where none waits for another, as fibers switched at barriers and shuffles, as an OS thread each
where a thread may spin on memory another writes; a barrier that some threads never reach is a
runtime error that says so, not a hang."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from optiml.generate.agreement import make_inputs
from optiml.harness.host import host_mode, run_on_host
from optiml.spec import load

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")

# Per block of 128: the sum of its x through shared memory and barriers, then the warp's sum of
# its lanes through shuffles, each warp's written by its lane 0.
REDUCE = r"""
/* @optiml
 *   args:   x: in float[n], block_sum: out float[cdiv(n, 128)], warp_sum: out float[cdiv(n, 32)]
 *   launch: grid = cdiv(n, 128), block = 128
 *   sizes:  n = 1000, 333
 */
__global__ void sums(const float* x, float* block_sum, float* warp_sum, int n)
{
    __shared__ float s[128];
    int i = blockIdx.x * 128 + threadIdx.x;
    float v = i < n ? x[i] : 0.0f;
    s[threadIdx.x] = v;
    __syncthreads();
    for (int h = 64; h > 0; h /= 2) {
        if (threadIdx.x < h) s[threadIdx.x] += s[threadIdx.x + h];
        __syncthreads();
    }
    if (threadIdx.x == 0) block_sum[blockIdx.x] = s[0];
    for (int d = 16; d > 0; d /= 2) v += __shfl_down_sync(0xffffffffu, v, d);
    if (threadIdx.x % 32 == 0 && i < n + 31) {
        int w = i / 32;
        if (w * 32 < n) warp_sum[w] = v;
    }
}
"""

# Thread 0 publishes a value; the others spin on a volatile flag until it is there (no barrier).
SPIN = r"""
/* @optiml
 *   args:   x: in float[blocks], y: out float[blocks * 64]
 *   launch: grid = blocks, block = 64
 *   sizes:  blocks = 5, 3
 */
__global__ void publish(const float* x, float* y, int blocks)
{
    __shared__ volatile int ready;
    __shared__ volatile float value;
    if (threadIdx.x == 0) {
        value = 2.0f * x[blockIdx.x];
        __threadfence();
        ready = blockIdx.x + 1;
    }
    while (ready != (int)blockIdx.x + 1) {
    }
    y[blockIdx.x * 64 + threadIdx.x] = value;
}
"""

# Lane 0 waits at the block's barrier, the other lanes at the warp's: neither is ever complete.
DEADLOCK = r"""
/* @optiml
 *   args:   y: out float[n]
 *   launch: grid = cdiv(n, 32), block = 32
 *   sizes:  n = 32, 17
 */
__global__ void stuck(float* y, int n)
{
    if (threadIdx.x == 0)
        __syncthreads();
    else
        __syncwarp();
    if (threadIdx.x < n)
        y[threadIdx.x] = 1.0f;
}
"""


def _run(tmp_path, text: str, name: str):
    path = tmp_path / f"{name}.cu"
    path.write_text(text)
    source, _, spec = load(path, name)
    cases = [spec.case(s) for s in spec.sizes]
    make_inputs(spec, cases, tmp_path / "in")
    inputs = {
        (n, b.name): np.fromfile(tmp_path / "in" / f"{n}.{b.name}", dtype=np.float32)
        for n in range(len(cases))
        for b in spec.buffers
        if b.role == "in"
    }
    return (
        source,
        run_on_host(source, name, spec, cases, tmp_path / "in", tmp_path / "work"),
        inputs,
    )


def test_barriers_and_shuffles_run_as_fibers_and_compute_the_sums(tmp_path):
    assert host_mode(REDUCE) == "host_mode = 1;"
    _, ran, inputs = _run(tmp_path, REDUCE, "sums")
    assert ran.status == "ok", ran.detail
    for n, out in enumerate(ran.outputs):
        x = inputs[(n, "x")].astype(np.float64)
        padded = np.concatenate([x, np.zeros(-len(x) % 128)])
        np.testing.assert_allclose(out["block_sum"], padded.reshape(-1, 128).sum(1), rtol=1e-5)
        warps = np.concatenate([x, np.zeros(-len(x) % 32)]).reshape(-1, 32).sum(1)
        np.testing.assert_allclose(out["warp_sum"], warps, rtol=1e-5)


def test_a_spin_on_a_volatile_flag_runs_on_os_threads_and_finishes(tmp_path):
    assert host_mode(SPIN) == "host_mode = 2;"
    _, ran, inputs = _run(tmp_path, SPIN, "publish")
    assert ran.status == "ok", ran.detail
    for n, out in enumerate(ran.outputs):
        want = np.repeat(2.0 * inputs[(n, "x")].astype(np.float64), 64)
        np.testing.assert_array_equal(out["y"], want)


def test_a_barrier_some_threads_never_reach_is_a_deadlock_not_a_hang(tmp_path):
    assert host_mode(DEADLOCK) == "host_mode = 1;"
    _, ran, _ = _run(tmp_path, DEADLOCK, "stuck")
    assert ran.status == "runtime_error"
    assert "deadlock" in ran.detail and "waits at a barrier" in ran.detail


def test_code_without_a_wait_runs_its_threads_one_after_another():
    assert host_mode("__global__ void f(float* y) { y[threadIdx.x] = 1.0f; }") == "host_mode = 0;"
