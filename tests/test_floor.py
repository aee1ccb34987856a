"""The physical floor under a case, without a GPU: the bytes its work must move (from the spec and
the dependence probes) over the device's bandwidth ceiling, and the verdict when a timed launch
beats it."""

from __future__ import annotations

import json

import pytest

from optiml.harness import ceilings as ceilings_module
from optiml.harness.ceilings import CEILING_ALLOWANCE, Ceilings, device_ceilings, floor_of
from optiml.harness.evaluate import EvalOptions, _below_floor
from optiml.harness.verdict import (
    CaseResult,
    CaseTiming,
    Dependence,
    DeviceInfo,
    LaunchConfig,
    TimingStats,
    Verdict,
)
from optiml.harness.work import least_bytes, read_fraction
from optiml.spec import load
from tests.support import FIXTURES

L2 = 60 << 20
DEVICE = DeviceInfo(
    name="Test GPU",
    compute_capability="9.0",
    sm_count=132,
    l2_bytes=L2,
    memory_bytes=141 << 30,
    driver_version=13000,
    runtime_version=13000,
    sm_clock_idle_mhz=345,
)


def all_read(spec, samples=16):
    return [Dependence(buffer=b.name, samples=samples, sensitive=samples) for b in spec.buffers]


def test_inputs_the_outputs_depend_on_count_whole_writes_beyond_the_l2():
    _, _, spec = load(FIXTURES / "saxpy.cu", "saxpy")  # x in, y inout
    case = spec.case({"n": 1 << 26})
    assert least_bytes(spec, case, all_read(spec), L2) == 2 * 4 * (1 << 26)
    # nothing probed: nothing counted
    assert least_bytes(spec, case, [], L2) == 0
    _, _, softmax = load(FIXTURES / "softmax.cu", "softmax_rows")  # input in, output out
    case = softmax.case({"rows": 32768, "cols": 1024})
    size = 4 * 32768 * 1024
    assert least_bytes(softmax, case, all_read(softmax), L2) == size + size - L2


def test_a_partly_read_input_counts_at_half_its_observed_share():
    assert read_fraction(Dependence(buffer="t", samples=16, sensitive=16)) == 1.0
    assert read_fraction(Dependence(buffer="t", samples=16, sensitive=4)) == 0.125
    assert read_fraction(None) == 0.0


def test_the_ceiling_is_the_larger_of_the_peak_and_the_best_measured():
    measured = Ceilings(device="g", read_gbs=4400, write_gbs=4000, copy_gbs=4200, peak_gbs=0)
    assert measured.best_gbs == pytest.approx(4400 * CEILING_ALLOWANCE)
    with_peak = measured.model_copy(update={"peak_gbs": 5500.0})
    assert with_peak.best_gbs == 5500.0
    # a measurement slowed by another process cannot lower the floor's divisor below the peak
    slowed = with_peak.model_copy(update={"read_gbs": 900.0, "copy_gbs": 800.0, "write_gbs": 700.0})
    assert slowed.best_gbs == 5500.0
    f = floor_of(int(5.5e9), with_peak)
    assert f.ms == pytest.approx(1.0)


def test_ceilings_are_read_from_the_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(ceilings_module, "cache_dir", lambda: tmp_path)
    cached = Ceilings(device=DEVICE.name, read_gbs=1.0, write_gbs=2.0, copy_gbs=3.0, peak_gbs=4.0)
    key = f"{DEVICE.name}|{DEVICE.driver_version}|{DEVICE.runtime_version}"
    (tmp_path / "ceilings.json").write_text(json.dumps({key: cached.model_dump()}))
    assert device_ceilings(DEVICE) == cached


def verdict_with(ms: float, dependence) -> Verdict:
    t = TimingStats(median_ms=ms, q1_ms=ms, q3_ms=ms, min_ms=ms, reps=20)
    case = CaseResult(
        label="n=67108864",
        launch={"candidate": LaunchConfig(grid=[1, 1, 1], block=[1, 1, 1], smem=0)},
        seeds=[],
        timing=CaseTiming(candidate=t, reference=t, warmup_rounds=1, sm_clock_mhz=[1, 1]),
        dependence=dependence,
    )
    return Verdict(
        status="ok",
        message="",
        file="saxpy.cu",
        kernel="saxpy",
        reference="saxpy",
        arch="sm_90",
        nvcc_version="13.0",
        date="2026-12-04",
        device=DEVICE,
        cases=[case],
    )


def test_a_time_below_the_floor_is_its_own_verdict(monkeypatch):
    _, _, spec = load(FIXTURES / "saxpy.cu", "saxpy")
    monkeypatch.setattr(
        "optiml.harness.evaluate.device_ceilings",
        lambda device, env=None: Ceilings(
            device=device.name, read_gbs=4000, write_gbs=4000, copy_gbs=4000, peak_gbs=5000
        ),
    )
    cases = [spec.case({"n": 1 << 26})]
    # 512 MB at 5 TB/s is 0.107 ms
    honest = verdict_with(0.19, all_read(spec))
    assert _below_floor(honest, spec, cases, EvalOptions()) is None
    assert honest.cases[0].floor.ms == pytest.approx(2 * 4 * (1 << 26) / 5e12 * 1e3)
    skipped = _below_floor(verdict_with(0.05, all_read(spec)), spec, cases, EvalOptions())
    assert skipped.status == "below_floor" and skipped.check == "physical floor"
    assert "work was skipped" in skipped.message
