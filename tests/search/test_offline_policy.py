"""The offline policy's catalog-wide precondition: a kernel that reaches a parameter's memory as
volatile (declared so, or through a local volatile pointer or cast) gets only the edits that keep
every load and store as written (block size, launch bounds, unrolling, a grid-stride loop, fast
math); vectorizing, tiling or staging it would merge, widen or reorder accesses that `volatile`
says must each happen."""

from __future__ import annotations

import pytest

from optiml.cuda.kernel_ast import KernelAST
from optiml.cuda.source import SourceFile
from optiml.search.catalog import CATALOG
from optiml.search.policy import NodeView, OfflinePolicy
from optiml.search.variant import Variant
from tests.support import FIXTURES


def _transforms(text: str, file: str, kernel: str) -> set[str]:
    request = NodeView(variant=Variant(text), path=str(FIXTURES / file), kernel=kernel)
    return {c.edit.transform for c in OfflinePolicy().candidates(request)}


def _with(text: str, old: str, new: str) -> str:
    assert old in text
    return text.replace(old, new, 1)


def test_volatile_memory_gets_only_edits_that_keep_its_accesses():
    keeping = {name for name, t in CATALOG.items() if t.keeps_accesses}
    assert keeping == {"block_size", "launch_bounds", "unroll", "grid_stride", "fast_math"}
    for file, kernel, old, new in [
        ("saxpy.cu", "saxpy", "float* y)", "volatile float* y)"),
        ("stencil2d.cu", "jacobi_step", "const float* u,", "const volatile float* u,"),
    ]:
        text = (FIXTURES / file).read_text()
        plain = _transforms(text, file, kernel)
        volatile = _with(text, old, new)
        kept = _transforms(volatile, file, kernel)
        assert plain - keeping, file  # rewrites apply to the kernel as it is
        assert kept and kept <= keeping and kept == plain & keeping, (file, kept)


def test_volatile_is_read_off_the_pointee_not_the_pointer():
    src = SourceFile(
        "__global__ void k(const volatile float* a, float* volatile b, float volatile* c, int n)"
        " {}",
        "k.cu",
    )
    params = {p.name: p for p in src.kernels[0].params}
    assert [params[n].volatile_pointee for n in "abcn"] == [True, False, True, False]
    assert params["a"].declared == "const volatile float*"
    assert params["b"].declared == "float*"


@pytest.mark.parametrize(
    "body,volatile",
    [
        ("b[0] = a[0];", set()),
        # a spin on a flag in global memory, through a local pointer or a cast
        ("const volatile int* f = flags + blockIdx.x; while (*f < 1) {} b[0] = 1;", {"flags"}),
        ("while (((volatile int*)flags)[blockIdx.x] < 1) {} b[0] = 1;", {"flags"}),
        # warp-synchronous code on shared memory, a volatile scalar: no volatile global memory
        (
            "__shared__ float s[64]; volatile float* v = s; v[threadIdx.x] = a[0]; b[0] = v[0];",
            set(),
        ),
        ("volatile float x = a[0]; b[0] = x;", set()),
    ],
    ids=["plain", "local-pointer", "cast", "shared", "scalar"],
)
def test_volatile_memory_is_found_where_the_kernel_reaches_it(body, volatile):
    text = f"__global__ void k(const float* a, float* b, int* flags) {{ {body} }}"
    src = SourceFile(text, "k.cu")
    assert KernelAST(src, src.kernels[0]).volatile_memory == volatile


def test_the_spinning_fixture_gets_only_edits_that_keep_its_accesses():
    """Its blocks spin on `const volatile int* flag = ready + blockIdx.x`; without `volatile` the
    catalog would vectorize it."""
    file = "broken/infinite_loop.cu"
    text = (FIXTURES / file).read_text()
    keeping = {name for name, t in CATALOG.items() if t.keeps_accesses}
    kept = _transforms(text, file, "wait_and_scale")
    plain = _transforms(
        _with(text, "const volatile int* flag", "const int* flag"), file, "wait_and_scale"
    )
    assert kept and kept <= keeping and "vectorize" in plain


def test_a_nodes_proposals_are_computed_once_however_often_it_is_widened(monkeypatch):
    # the search widens a node one child at a time to fill its slots: the catalog runs once per
    # node as the policy sees it (another profile, another count of SMs: again)
    import asyncio
    import random

    policy = OfflinePolicy()
    calls = []
    inner = policy.candidates
    monkeypatch.setattr(policy, "candidates", lambda r: calls.append(r) or inner(r))
    text = (FIXTURES / "saxpy.cu").read_text()
    request = NodeView(variant=Variant(text), path=str(FIXTURES / "saxpy.cu"), kernel="saxpy")
    first = asyncio.run(policy.propose(request, 4, random.Random(0)))
    again = asyncio.run(policy.propose(request, 4, random.Random(0)))
    assert len(calls) == 1 and first and [c.edit for c in again] == [c.edit for c in first]
    other = NodeView(request.variant, request.path, request.kernel, sm_count=8)
    asyncio.run(policy.propose(other, 4, random.Random(0)))
    assert len(calls) == 2


def test_a_transformation_that_never_returns_is_left_behind(monkeypatch, caplog):
    """A bug that loops forever in one transformation (fast_math once halved INFINITY without
    end) costs the search that transformation, not the run: the others' proposals come back."""
    import threading

    from optiml.search import policy as policy_module
    from optiml.search.catalog.base import Transformation

    stuck = threading.Event()

    class Stuck(Transformation):
        name = "stuck"
        addresses = frozenset({"dram"})
        description = "never returns"

        def propose(self, ctx):
            stuck.wait()  # released at the end of the test
            return []

    monkeypatch.setattr(policy_module, "PROPOSE_LIMIT_S", 0.5)
    catalog = {"stuck": Stuck(), "vectorize": CATALOG["vectorize"], "unroll": CATALOG["unroll"]}
    text = (FIXTURES / "saxpy.cu").read_text()
    request = NodeView(variant=Variant(text), path=str(FIXTURES / "saxpy.cu"), kernel="saxpy")
    try:
        with caplog.at_level("ERROR"):
            found = OfflinePolicy(catalog).candidates(request)
    finally:
        stuck.set()
    assert {c.edit.transform for c in found} <= {"vectorize", "unroll"} and found
    assert "transformation stuck did not return within" in caplog.text
