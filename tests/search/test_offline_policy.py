"""The offline policy's catalog-wide precondition: a kernel with volatile memory among its
parameters gets only the edits that keep every load and store as written (block size, launch
bounds, unrolling, a grid-stride loop, fast math); vectorizing, tiling or staging it would merge,
widen or reorder accesses that `volatile` says must each happen."""

from __future__ import annotations

from optiml.search.catalog import CATALOG
from optiml.search.policy import OfflinePolicy, Request
from optiml.search.variant import Variant
from tests.support import FIXTURES


def _transforms(text: str, file: str, kernel: str) -> set[str]:
    request = Request(variant=Variant(text), path=str(FIXTURES / file), kernel=kernel)
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
    from optiml.cuda.source import SourceFile

    src = SourceFile(
        "__global__ void k(const volatile float* a, float* volatile b, float volatile* c, int n)"
        " {}",
        "k.cu",
    )
    params = {p.name: p for p in src.kernels[0].params}
    assert [params[n].volatile_pointee for n in "abcn"] == [True, False, True, False]
    assert params["a"].declared == "const volatile float*"
    assert params["b"].declared == "float*"
