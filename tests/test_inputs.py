"""The runner's input generator and the NumPy copy a NumPy reference uses agree bit for bit."""

from __future__ import annotations

import subprocess
from importlib import resources

import numpy as np
import pytest

from optiml.cuda.types import DTYPES
from optiml.harness.inputs import generate

PROGRAM = r"""
#include "values.h"
#include <cstdio>
#include <cmath>
#include <cstdlib>
#include <string>
int main(int argc, char** argv) {
  std::string code = argv[1];
  unsigned long long seed = strtoull(argv[2], 0, 10), buffer = strtoull(argv[3], 0, 10);
  double lo = atof(argv[4]), hi = atof(argv[5]);
  for (int i = 0; i < 1000; ++i) {
    double u = uniform01(seed, buffer, i);
    if (code == "f64") printf("%.17g\n", lo + u * (hi - lo));
    else if (code == "f32") printf("%.9g\n", (float)(lo + u * (hi - lo)));
    else if (code == "f16") printf("%u\n", float_to_half_bits((float)(lo + u * (hi - lo))));
    else if (code == "bf16") printf("%u\n", float_to_bf16_bits((float)(lo + u * (hi - lo))));
    else printf("%lld\n", (long long)lo + (long long)std::floor(u * (hi - lo)));
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
    ("code", "lo", "hi"),
    [
        ("f64", -1, 1),
        ("f32", -1, 1),
        ("f16", -1, 1),
        ("bf16", -3, 5),
        ("i32", -100, 100),
        ("u8", 0, 200),
        ("i64", 0, 7),
    ],
)
def test_numpy_reproduces_the_runner(generator, code, lo, hi):
    for seed, buffer in [(1, 0), (2, 3)]:
        out = subprocess.run(
            [str(generator), code, str(seed), str(buffer), str(lo), str(hi)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        ours = generate(code, buffer, 1000, seed, lo, hi)
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
