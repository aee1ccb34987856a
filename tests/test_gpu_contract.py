"""On a GPU: the contract's forms (structured inputs, four size variables, vector types, typedefs,
structs by value, device values in the launch) carried through the harness, each fixture of
fixtures/contract/ equal to its reference, and a wrong variant of each caught."""

from __future__ import annotations

import pytest

from optiml.cuda.source import SourceFile
from optiml.harness.device import device_values
from optiml.harness.evaluate import EvalOptions, evaluate
from optiml.harness.gpu import default_arch
from optiml.spec import parse_spec
from tests.support import FIXTURES

pytestmark = pytest.mark.gpu

CONTRACT = FIXTURES / "contract"
# file -> (kernel, a line of its body and a wrong version of it)
KERNELS = {
    "spmv_csr.cu": ("spmv_csr", "j < row_ptr[r + 1]", "j + 1 < row_ptr[r + 1]"),
    "permute4d.cu": (
        "permute4d",
        "((long)b * T + t) * H + h",
        "((long)b * T + t) * H + (H - 1 - h)",
    ),
    "attention_scores.cu": ("attention_scores", "d < HS", "d < HS - 1"),
    "vector_float4.cu": ("saxpy4", "a * v.w + w.w", "a * v.z + w.w"),
    "typedef_element.cu": ("add_bias", "inp[i] + bias[i]", "inp[i] - bias[i]"),
    "struct_param.cu": ("scale_shift_struct", "p.scale + p.shift", "p.scale + p.scale"),
    "sm_count_launch.cu": ("scale_stride", "3.0f * x[i]", "3.0f * x[i % 1000000]"),
}


def _evaluate(name: str, candidate_text: str | None = None):
    kernel_name = KERNELS[name][0]
    source = SourceFile.read(CONTRACT / name)
    kernel = source.kernel(kernel_name)
    spec = parse_spec(source, kernel)
    candidate = (
        SourceFile(candidate_text, str(CONTRACT / f"wrong_{name}")) if candidate_text else None
    )
    return evaluate(source, kernel, spec, candidate, EvalOptions(arch=default_arch(), time=False))


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_contract_fixture_equals_its_reference(name):
    v = _evaluate(name)
    assert v.status == "ok", v.message
    assert all(len(c.seeds) >= 2 for c in v.cases)


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_a_wrong_variant_is_caught(name):
    _, right, wrong = KERNELS[name]
    text = (CONTRACT / name).read_text()
    assert right in text
    v = _evaluate(name, text.replace(right, wrong, 1))
    assert v.status == "wrong_result", v.message


def test_sm_count_is_the_devices():
    v = _evaluate("sm_count_launch.cu")
    device = device_values()
    assert v.device is not None and device.sm_count == v.device.sm_count
    want = device.sm_count * (device.max_threads_per_sm // 256)
    assert all(c.launch["candidate"].grid[0] == want for c in v.cases)
