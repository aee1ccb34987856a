"""tree_reduce: a block's shared-memory tree reduction, in the forms people write it, becomes warp
shuffles — the rewrite compiles for sm_90 and computes what the original does (run as host C++);
loops that are not such a tree, or that the block cannot run as whole warps, get no proposal."""

from __future__ import annotations

import shutil

import pytest

from optiml.harness.build import build_kernel
from optiml.search.catalog import Context, by_name
from optiml.search.variant import Variant
from optiml.spec import parse_spec
from tests.host_cuda import mismatches
from tests.support import FIXTURES

TREE = by_name("tree_reduce")
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")

SPEC = """/* @optiml
 *   args:   x: in float[n], partial: out float[cdiv(n, {block})]
 *   launch: grid = cdiv(n, {block}), block = {block}
 *   sizes:  n = 1 << 20, 1000003
 *   tol:    rtol = 1e-5, atol = 1e-5
 */
"""

# Harris's reduce0 (interleaved addressing, `tid % (2 * s)`) is fixtures/wild/block_sum_tree.cu.
WILD = FIXTURES / "wild" / "block_sum_tree.cu"

# reduce1: a strided index instead of the modulo.
STRIDED = """__global__ void reduce1(const float* x, float* partial, int n) {
  __shared__ float buf[256];
  int t = threadIdx.x;
  int g = blockIdx.x * 256 + t;
  buf[t] = g < n ? x[g] : 0.f;
  __syncthreads();
  for (int s = 1; s < 256; s <<= 1) {
    int index = 2 * s * t;
    if (index < blockDim.x) {
      buf[index] = buf[index] + buf[index + s];
    }
    __syncthreads();
  }
  if (t == 0) { partial[blockIdx.x] = buf[0]; }
}
"""

# reduce2: sequential addressing, halving, the thread index used directly; a max.
SEQUENTIAL_MAX = """__global__ void block_max(const float* x, float* partial, int n)
{
    __shared__ float s_m[512];
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    s_m[threadIdx.x] = i < n ? x[i] : -INFINITY;
    __syncthreads();
    for (int stride = blockDim.x / 2; stride > 0; stride >>= 1) {
        if (threadIdx.x < stride)
            s_m[threadIdx.x] = fmaxf(s_m[threadIdx.x], s_m[threadIdx.x + stride]);
        __syncthreads();
    }
    if (threadIdx.x == 0) partial[blockIdx.x] = s_m[0];
}
"""

# The block's result added into one total (kept as it is).
INTO_ONE = """__global__ void sum_all(const float* x, float* partial, int n)
{
    __shared__ float cache[128];
    int tid = threadIdx.x;
    int i = blockIdx.x * blockDim.x + tid;
    float v = 0.0f;
    if (i < n) v = x[i] * x[i];
    cache[tid] = v;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s /= 2) {
        if (tid < s) {
            cache[tid] += cache[tid + s];
        }
        __syncthreads();
    }
    if (tid == 0) atomicAdd(&partial[0], cache[0]);
}
"""

KERNELS = {
    "block_sum": (None, 256),
    "reduce1": (STRIDED, 256),
    "block_max": (SEQUENTIAL_MAX, 512),
    "sum_all": (INTO_ONE, 128),
}


def context(name: str) -> Context:
    text, block = KERNELS[name]
    if text is None:
        return Context.of(Variant(WILD.read_text()), str(WILD), name)
    spec = SPEC.format(block=block)
    if name == "sum_all":
        spec = spec.replace("partial: out float[cdiv(n, 128)]", "partial: inout float[1]")
    return Context.of(Variant(spec + text), "kernel.cu", name)


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_the_tree_becomes_warp_shuffles_and_compiles(name):
    ctx = context(name)
    (proposal,) = TREE.propose(ctx)
    text = proposal.variant.text
    assert text.count("__shfl_down_sync(0xffffffffu") == 2
    assert proposal.params == {"warps": KERNELS[name][1] // 32}
    # the loop is gone; what the kernel does with element 0 afterwards is kept
    assert (
        "for (unsigned int s" not in text
        and "for (int s" not in text
        and "stride >>= 1" not in text
    )
    source = proposal.variant.source("candidate.cu")
    k = source.kernel(name)
    build = build_kernel(source, k, instantiation=parse_spec(source, k).instantiation, arch="sm_90")
    assert build.ok, [str(m) for m in build.messages]


@needs_gxx
@pytest.mark.parametrize("name", sorted(KERNELS))
def test_the_rewrite_computes_what_the_original_does(name, tmp_path):
    ctx = context(name)
    (proposal,) = TREE.propose(ctx)
    candidate = Context.of(proposal.variant, ctx.source.path, name)
    assert mismatches(ctx, candidate, [{"n": 1000}, {"n": 77}, {"n": 513}], tmp_path) == 0


@pytest.mark.parametrize(
    "why,name,edit",
    [
        ("a block that is not a power of two", "block_sum", ("block = 256", "block = 192")),
        (
            "a thread that leaves before the barriers",
            "block_sum",
            (
                "unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;",
                "unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; if (i >= n) return;",
            ),
        ),
        (
            "elements other than the result read afterwards",
            "block_sum",
            (
                "if (tid == 0) g_partial[blockIdx.x] = sdata[0];",
                "if (tid == 0) g_partial[blockIdx.x] = sdata[0] + sdata[1];",
            ),
        ),
        (
            "a thread that leaves between two loops, before the tree",
            "sum_all",
            (
                "    cache[tid] = v;",
                "    for (int k = 0; k < 2; ++k) v += 0.0f;\n    if (i >= n) return;\n    cache[tid] = v;",
            ),
        ),
        (
            "the loop's variable read after the loop",
            "sum_all",
            [
                (
                    "for (int s = blockDim.x / 2; s > 0; s /= 2) {",
                    "int s;\n    for (s = blockDim.x / 2; s > 0; s /= 2) {",
                ),
                ("atomicAdd(&partial[0], cache[0]);", "atomicAdd(&partial[0], cache[0] + s);"),
            ],
        ),
        (
            "a scan, not a reduction",
            "reduce2_scan",
            None,
        ),
        (
            "a loop that stops at a warp (the warp-synchronous tail follows)",
            "block_max",
            ("stride > 0; stride >>= 1", "stride > 32; stride >>= 1"),
        ),
        (
            "a product, not one of +, max, min",
            "sum_all",
            ("cache[tid] += cache[tid + s];", "cache[tid] *= cache[tid + s];"),
        ),
        (
            "a tree whose pairs are not (t, t + s)",
            "sum_all",
            ("cache[tid] += cache[tid + s];", "cache[tid] += cache[tid + 2 * s];"),
        ),
    ],
)
def test_not_proposed(why, name, edit):
    if name == "reduce2_scan":
        text = (
            SPEC.format(block=256)
            + """__global__ void reduce2_scan(const float* x, float* partial, int n)
{
    __shared__ float s[256];
    int t = threadIdx.x;
    int i = blockIdx.x * blockDim.x + t;
    s[t] = i < n ? x[i] : 0.0f;
    __syncthreads();
    for (int d = 1; d < blockDim.x; d *= 2) {
        float v = t >= d ? s[t - d] : 0.0f;
        __syncthreads();
        s[t] += v;
        __syncthreads();
    }
    if (t == 0) partial[blockIdx.x] = s[0];
}
"""
        )
        ctx = Context.of(Variant(text), "kernel.cu", name)
    else:
        ctx = context(name)
        text = ctx.source.text
        for old, new in edit if isinstance(edit, list) else [edit]:
            assert old in text, why
            text = text.replace(old, new)
        ctx = Context.of(Variant(text), ctx.source.path, name)
    assert TREE.propose(ctx) == [], why


def test_not_proposed_on_its_own_output():
    ctx = context("block_sum")
    (proposal,) = TREE.propose(ctx)
    assert TREE.propose(Context.of(proposal.variant, ctx.source.path, "block_sum")) == []
