"""Loops of a constant trip count written out (optiml/lift/unroll.py): a window's taps become
reads at other indices, a skipped step of a running sum stays linear in the window, and loops that
store, run a data-dependent count or run long are left as they are."""

from __future__ import annotations

import pytest

from optiml.cuda.source import SourceFile
from optiml.lift import Lifted, lift
from optiml.lift.model import Load, LoopOut, walk_expr
from optiml.lift.unroll import MAX_TRIPS, NotUnrollable, unrolled
from optiml.spec import parse_spec

WINDOW = """
#define R 4
/* @optiml
 *   args:   y: out float[n], x: in float[n]
 *   launch: grid = cdiv(n, 256), block = 256
 *   sizes:  n = 4096, 1001
 */
__global__ void window(float* y, const float* x, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float s = 0.0f;
        for (int k = -R; k <= R; ++k) {
            int j = i + k;
            if (j >= 0 && j < n) s += x[j];
        }
        y[i] = s / (2 * R + 1);
    }
}
"""


def value(text: str):
    source = SourceFile(text, "window.cu")
    k = source.kernel("window")
    m = lift(source, k, parse_spec(source, k))
    assert isinstance(m, Lifted)
    return m.body[0].value


def test_a_window_is_written_out_tap_by_tap_and_stays_linear():
    out = unrolled(value(WINDOW))
    nodes = list(walk_expr(out, into_loops=False))
    assert not any(isinstance(x, LoopOut) for x in nodes)
    assert len({x for x in nodes if isinstance(x, Load)}) == 9  # x[i-4] ... x[i+4]
    # each tap's running sum is written once: 9 taps, not 2^9 copies
    assert len(nodes) < 400


@pytest.mark.parametrize(
    "old,new",
    [
        ("k <= R", "k <= n"),  # a trip count the data decides
        ("#define R 4", f"#define R {MAX_TRIPS}"),  # a row, not a window
    ],
    ids=["data-dependent", "long"],
)
def test_loops_that_are_not_windows_stay(old, new):
    with pytest.raises(NotUnrollable):
        unrolled(value(WINDOW.replace(old, new)))


def test_a_window_that_doubles_at_every_tap_is_measured_without_writing_it_out():
    # a running max whose skipped taps keep `m` twice (`c ? fmaxf(m, x) : m`) doubles with every
    # tap; its size is counted over the shared steps, at once, and it is too large to write out
    from optiml.lift.unroll import written_size
    from optiml.search.catalog import Context, by_name
    from optiml.search.variant import Variant

    text = (
        WINDOW.replace("#define R 4", "#define R 15")
        .replace("float s = 0.0f;", "float s = -INFINITY;")
        .replace("s += x[j];", "s = fmaxf(s, x[j]);")
        .replace("s / (2 * R + 1)", "s")
    )
    assert written_size(unrolled(value(text))) > 2**30
    ctx = Context.of(Variant(text), "window.cu", "window")
    assert by_name("vector_map").propose(ctx) == []
