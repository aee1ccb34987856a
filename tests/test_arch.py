"""GPU targets: what the installed nvcc accepts, asked once per toolkit, and `native`."""

from __future__ import annotations

import pytest

import optiml.arch as arch_mod
import optiml.harness.gpu as gpu
from optiml.arch import arch_number, arch_problem, nvcc_targets, resolve_arch
from optiml.errors import ExitCode, NoGpu, UsageError

needs_nvcc = pytest.mark.skipif(not nvcc_targets(), reason="needs nvcc to list its targets")


def test_arch_numbers():
    assert [arch_number(a) for a in ("sm_90", "sm_90a", "sm_100f", "sm_121")] == [90, 90, 100, 121]
    assert [arch_number(a) for a in ("sm_9", "compute_90", "sm_90x", "sm_٩٠", "native")] == [
        None
    ] * 5


@needs_nvcc
def test_every_target_of_cuda_13_is_known_with_its_variants():
    targets = nvcc_targets()
    plain = [t for t in targets if t[-1].isdigit()]
    assert plain == sorted(plain, key=arch_number)
    if "sm_121" not in targets:
        pytest.skip("not CUDA 13.0's nvcc")
    for t in ("sm_75", "sm_80", "sm_86", "sm_87", "sm_88", "sm_89", "sm_90", "sm_100", "sm_103"):
        assert t in targets
    for t in ("sm_110", "sm_120", "sm_121", "sm_90a", "sm_100a", "sm_100f", "sm_121f"):
        assert t in targets
    for t in ("sm_70", "sm_80a", "sm_90f"):
        assert t not in targets


@needs_nvcc
def test_nvcc_is_asked_once_per_toolkit():
    arch_mod._listed.cache_clear()
    for _ in range(5):
        assert arch_problem("sm_90") is None
    assert arch_mod._listed.cache_info().misses == 1


@needs_nvcc
@pytest.mark.parametrize("bad", ["banana", "sm_999", "sm_80a", "sm_70"])
def test_a_target_nvcc_does_not_take_is_one_line_naming_what_it_does(bad):
    problem = arch_problem(bad)
    assert problem is not None and "\n" not in problem
    assert f"`{bad}`" in problem
    assert problem.endswith(", ".join(nvcc_targets()))


def test_without_nvcc_only_the_form_is_checked(monkeypatch):
    monkeypatch.setattr(arch_mod, "_toolkit", lambda: None)
    assert arch_problem("sm_999") is None
    assert arch_problem("banana") == (
        "`banana` is not a GPU target; write one like sm_90 (sm_XY, sm_XYa or sm_XYf)"
    )


def test_native_is_the_local_gpus_architecture(monkeypatch):
    monkeypatch.setattr(arch_mod, "arch_problem", lambda arch: None)
    monkeypatch.setattr(gpu, "local_gpus", lambda: (("NVIDIA H200", "sm_90"),))
    assert resolve_arch("native") == "sm_90"
    assert resolve_arch(None) is None


def test_native_without_a_gpu_says_so(monkeypatch):
    monkeypatch.setattr(gpu, "local_gpus", lambda: ())
    with pytest.raises(NoGpu) as e:
        resolve_arch("native")
    assert str(e.value).startswith(
        "--arch native takes the local GPU's architecture, and NVML finds no NVIDIA GPU here"
    )


def test_a_bad_target_is_a_usage_error(monkeypatch):
    monkeypatch.setattr(arch_mod, "_toolkit", lambda: None)
    with pytest.raises(UsageError) as e:
        resolve_arch("banana")
    assert e.value.exit_code == ExitCode.USAGE
    assert str(e.value).startswith("--arch: `banana` is not a GPU target")
