"""A large file costs in proportion to its size: the Python side of `optiml check` (the parse, every
spec, every kernel's node and notes, ptxas's report matched to the kernels) on a generated
2,000-line file takes about ten times what it takes on a 200-line one, not a hundred times. The
indexes that make it so give what the walks and searches they replace gave.
(benchmarks/large_file.py times the whole of it, nvcc included, on a 20,000-line file.)"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from benchmarks.large_file import generate
from optiml.cuda.kernel_ast import KernelAST, walk
from optiml.cuda.source import SourceFile
from optiml.harness.build import ResourceIndex, kernel_resources
from optiml.harness.nvcc import Resources
from optiml.profile.numerics import rounding_notes
from optiml.spec import parse_spec
from tests.support import FIXTURES


def _ptxas_report(source: SourceFile) -> list[Resources]:
    """One entry per kernel, as ptxas and the demangler name them, in reverse (the worst case
    for a search from the front)."""
    return [
        Resources(mangled=f"_Z{len(k.name)}{k.name}", name=f"void {k.name}(int)", arch="sm_90")
        for k in reversed(source.kernels)
    ]


def _check_side(text: str) -> int:
    """What `optiml check` does in Python for each kernel of `text`, nvcc left out."""
    source = SourceFile(text, "large.cu")
    found = ResourceIndex(_ptxas_report(source))
    done = 0
    for k in source.kernels:
        spec = parse_spec(source, k)
        rounding_notes(KernelAST(source, k), spec)
        assert found.of(k) is not None
        source.position(k.spec_comment.span.start, k.spec_comment.span.end)
        done += 1
    return done


def _best_of(runs: int, text: str) -> float:
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        _check_side(text)
        best = min(best, time.perf_counter() - start)
    return best


def test_check_side_work_grows_linearly_with_the_file():
    small, large = generate(17), generate(167)  # 207 and 2,007 lines
    assert large.count("\n") > 9 * small.count("\n")
    _check_side(small)  # imports and first-use caches out of the way
    t_small, t_large = _best_of(5, small), _best_of(3, large)
    # ~10x the kernels: linear is ~10x the time; one walk of the tree per kernel was ~50-100x
    assert t_large / t_small < 30, f"200 lines: {t_small:.3f} s, 2,000 lines: {t_large:.3f} s"


@pytest.mark.parametrize("path", sorted(FIXTURES.glob("**/*.cu")), ids=lambda p: p.name)
def test_indexes_give_what_the_walks_gave(path: Path):
    source = SourceFile.read(path)
    for k in source.kernels:
        start = k.body_span.start
        walked = next(
            n
            for n in walk(source.tree.root_node)
            if n.type == "function_definition"
            and (body := n.child_by_field_name("body")) is not None
            and source._offset(body.start_byte) == start
        )
        assert source.definition(k) == walked
    text = source.text
    for offset in {0, len(text), *range(0, len(text) + 1, 97)}:
        line = text.count("\n", 0, offset)
        assert source.line_col(offset) == (line, offset - (text.rfind("\n", 0, offset) + 1))


def test_resource_index_is_the_first_match():
    source = SourceFile(
        '__global__ void k(int n) {}\nextern "C" __global__ void plain(int n) {}\n'
        "namespace ns { __global__ void k(int n) {} }\n"
    )
    found = [
        Resources(mangled="_Z1ki", name="void k(int)", arch="sm_90", registers=1),
        Resources(mangled="plain", name="plain", arch="sm_90", registers=2),
        Resources(mangled="_ZN2ns1kEi", name="void ns::k(int)", arch="sm_90", registers=3),
        Resources(mangled="_Z1ki", name="void k(int)", arch="sm_90", registers=4),
    ]
    index = ResourceIndex(found)
    for k in source.kernels:
        assert index.of(k) is kernel_resources(found, k)
    assert ResourceIndex([]).of(source.kernels[0]) is None
