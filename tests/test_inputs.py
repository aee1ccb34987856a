"""The runner's input generator and the NumPy copy a NumPy reference uses agree bit for bit."""

from __future__ import annotations

import subprocess
from importlib import resources

import numpy as np
import pytest

from optiml.cuda.types import DTYPES
from optiml.harness.inputs import Mode, generate

PROGRAM = r"""
#include "values.h"
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>
// The runner's own element maker (values.h's fill_value), printed one element a line.
int main(int argc, char** argv) {
  std::string code = argv[1];
  unsigned long long seed = strtoull(argv[2], 0, 10), buffer = strtoull(argv[3], 0, 10);
  Dist d;
  d.lo = atof(argv[4]);
  d.hi = atof(argv[5]);
  d.mode = atoi(argv[6]);
  d.extra = atof(argv[7]);
  const char* names[] = {"f64", "f32", "f16", "bf16", "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64"};
  const size_t sizes[] = {8, 4, 2, 2, 1, 2, 4, 8, 1, 2, 4, 8};
  int c = 0;
  while (code != names[c]) ++c;
  const size_t n = argc > 8 ? strtoull(argv[8], 0, 10) : 1000;
  std::vector<unsigned char> data(n * sizes[c]);
  for (size_t i = 0; i < n; ++i)
    fill_value((Code)c, c < 4, sizes[c], data.data(), i, n, d, seed, buffer);
  for (size_t i = 0; i < n; ++i) {
    const unsigned char* p = data.data() + i * sizes[c];
    if (code == "f64") printf("%.17g\n", get<double>(p));
    else if (code == "f32") printf("%.9g\n", get<float>(p));
    else if (code == "f16" || code == "bf16") printf("%u\n", get<uint16_t>(p));
    else if (code == "i32") printf("%d\n", get<int32_t>(p));
    else if (code == "i64") printf("%lld\n", (long long)get<int64_t>(p));
    else if (code == "u8") printf("%u\n", get<uint8_t>(p));
  }
}
"""


@pytest.fixture(scope="module")
def generator(tmp_path_factory):
    d = tmp_path_factory.mktemp("values")
    header = resources.files("optiml.harness").joinpath("values.h").read_text()
    (d / "values.h").write_text(header)
    (d / "gen.cpp").write_text(PROGRAM)
    subprocess.run(
        ["g++", "-O2", "-std=c++17", "-o", str(d / "gen"), str(d / "gen.cpp")], check=True
    )
    return d / "gen"


@pytest.mark.parametrize(
    ("code", "lo", "hi", "mode", "extra"),
    [
        ("f64", -1, 1, Mode.UNIFORM, 0),
        ("f32", -1, 1, Mode.UNIFORM, 0),
        ("f16", -1, 1, Mode.UNIFORM, 0),
        ("bf16", -3, 5, Mode.UNIFORM, 0),
        ("i32", -100, 100, Mode.UNIFORM, 0),
        ("u8", 0, 200, Mode.UNIFORM, 0),
        ("i64", 0, 7, Mode.UNIFORM, 0),
        ("f32", 0.75, 0, Mode.CONSTANT, 0),
        ("i32", 17, 0, Mode.CONSTANT, 0),
        ("f32", -1, 1, Mode.SPIKES, 64),
        ("f64", 2, 3, Mode.SPIKES, 1000),
        ("i32", 0, 256, Mode.SPIKES, 0),
        ("i32", 0, 4096, Mode.SKEWED, 77),
        ("f32", -1, 1, Mode.SKEWED, 0.5),
        ("bf16", -100, 100, Mode.SPIKES, 1e4),
        ("i32", 0, 0, Mode.OFFSETS, 54321),
        ("i64", 0, 0, Mode.OFFSETS, 7),
        ("i32", 0, 0, Mode.PERMUTATION, 0),
        ("i32", -5, 1000, Mode.SORTED, 0),
        ("f32", 0, 1, Mode.SORTED, 0),
        ("f32", -1, 1, Mode.SPARSE, 0.05),
        ("i32", 1, 10, Mode.SPARSE, 0.5),
    ],
)
@pytest.mark.parametrize("n", [1000, 2, 3, 997])
def test_numpy_reproduces_the_runner(generator, code, lo, hi, mode, extra, n):
    if n != 1000 and mode < Mode.OFFSETS:
        pytest.skip("the lengths matter to structured inputs only")
    for seed, buffer in [(1, 0), (2, 3), (2**63 + 12345, 1)]:
        out = subprocess.run(
            [
                str(generator),
                code,
                str(seed),
                str(buffer),
                str(lo),
                str(hi),
                str(int(mode)),
                str(extra),
                str(n),
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        ours = generate(code, buffer, n, seed, lo, hi, mode, extra)
        if code == "f64":
            assert np.array_equal(np.array(out, dtype=np.float64), ours)
        elif code == "f32":
            assert np.array_equal(np.array(out, dtype=np.float32), ours)
        elif code == "f16":
            assert np.array_equal(np.array(out, dtype=np.uint16), ours.view(np.uint16))
        elif code == "bf16":
            assert np.array_equal(np.array(out, dtype=np.uint16), ours)
        else:
            assert np.array_equal(np.array(out, dtype=np.int64), ours.astype(np.int64))


def test_the_modes_draw_what_they_say():
    spiky = generate("f32", 0, 5000, 3, -1, 1, Mode.SPIKES, 64)
    assert set(np.abs(spiky[-40:])) == {64} and set(np.abs(spiky[:4])) == {64}
    inner = spiky[4:-40]
    assert 0 < np.count_nonzero(np.abs(inner) == 64) < 20  # about one in 1021
    keys = generate("i32", 0, 4000, 3, 0, 256, Mode.SKEWED, 9)
    assert 0.4 < np.mean(keys == 9) < 0.6 and keys.min() >= 0 and keys.max() < 256
    ends = generate("i32", 0, 1000, 3, 0, 256, Mode.SPIKES)
    assert set(ends[-40:]) <= {0, 255}
    assert set(generate("f32", 0, 100, 3, 0.75, 0, Mode.CONSTANT)) == {np.float32(0.75)}


@pytest.mark.parametrize("code", list(DTYPES))
def test_inputs_exercise_the_code(code):
    d = DTYPES[code]
    values = (
        generate(code, 0, 4096, 1, d.low, d.high).astype(np.float64)
        if code != "bf16"
        else generate(code, 0, 4096, 1, d.low, d.high)
    )
    if code == "bf16":
        values = (values.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    assert np.count_nonzero(values) > 4000  # not all zeros
    assert len(np.unique(values)) > 100  # not constant
    assert (
        values.min() >= d.low and values.max() <= d.high
    )  # half and bfloat16 may round up to high
    if d.kind != "uint":
        assert values.min() < 0 < values.max()  # mixed signs
    seeds_differ = generate(code, 0, 64, 2, d.low, d.high)
    assert not np.array_equal(seeds_differ, generate(code, 0, 64, 1, d.low, d.high))


@pytest.mark.parametrize("n", [2, 3, 64, 1001, 100_003])
def test_structured_inputs_have_their_structure(n):
    for seed in (1, 7, 2**40 + 3):
        rows = generate("i32", 2, n, seed, 0, 0, Mode.OFFSETS, 5 * n).astype(np.int64)
        assert rows[0] == 0 and rows[-1] == 5 * n and np.all(np.diff(rows) >= 0)
        perm = generate("i64", 1, n, seed, 0, 0, Mode.PERMUTATION)
        assert np.array_equal(np.sort(perm), np.arange(n))
        keys = generate("i32", 0, n, seed, -50, 50, Mode.SORTED)
        assert np.all(np.diff(keys) >= 0) and keys.min() >= -50 and keys.max() < 50
        floats = generate("f32", 0, n, seed, 0, 1, Mode.SORTED)
        assert np.all(np.diff(floats) >= 0)
    if n >= 1001:
        lengths = np.diff(rows)
        assert len(np.unique(lengths)) > 3  # rows of different lengths, not a fixed stride
        assert not np.array_equal(perm, np.arange(n))  # a shuffle, not the identity
        sparse = generate("f32", 0, n, 5, -1, 1, Mode.SPARSE, 0.1)
        assert 0.07 < np.count_nonzero(sparse) / n < 0.13
