"""Profile parsing and bottleneck diagnosis on real Nsight Compute output recorded on the H200
(tests/data/ncu/README.md): search-set reports as read by ncu_report, and full-set CSV exports."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from optiml.profile.model import build_profile
from optiml.profile.ncu import (
    PcCounters,
    ReportData,
    collection_args,
    parse_details_csv,
    parse_number,
    parse_raw_csv,
    parse_source_csv,
)
from tests.support import FIXTURES, MANIFEST

DATA = Path(__file__).parent / "data" / "ncu"
GROUPS = {"l1_shared": "l1_l2", "l2": "l1_l2"}


def expected_for(stem: str) -> str | None:
    for e in MANIFEST:
        if f"{Path(e['file']).stem}-{e['kernel']}" == stem:
            return e.get("bottleneck")
    raise KeyError(stem)


SEARCH = sorted((DATA / "search").glob("*.json"))
FULL = sorted(DATA.glob("*.raw.csv"))


def test_numbers_as_ncu_prints_them():
    assert parse_number("3,199,066,370.86") == pytest.approx(3199066370.86)
    assert parse_number("") is None and parse_number("n/a") is None
    assert parse_number("(256, 1, 1)") == "(256, 1, 1)"


def test_prof_lines_around_the_csv_are_ignored():
    text = (DATA / "saxpy-saxpy.raw.csv").read_text()
    noisy = "==PROF== Connected to process 1\n" + text + "==PROF== Disconnected\n"
    assert parse_raw_csv(noisy)[0].number("gpu__time_duration.sum") == parse_raw_csv(text)[
        0
    ].number("gpu__time_duration.sum")


@pytest.mark.parametrize("path", SEARCH, ids=[p.stem for p in SEARCH])
def test_search_set_reports_get_their_bottleneck(path):
    expected = expected_for(path.stem)
    p = build_profile(ReportData.model_validate_json(path.read_text()), device="NVIDIA H200")
    if expected is None:
        pytest.skip(f"no agreed bottleneck for {path.stem} (diagnosed: {p.bottleneck.kind})")
    assert GROUPS.get(p.bottleneck.kind, p.bottleneck.kind) == expected, p.bottleneck.explanation
    assert p.duration_ms > 0 and p.sol_memory_pct is not None and p.occupancy.limiter


def collected_by_the_search_set(name: str) -> bool:
    args = collection_args(False)
    assert "--section" not in args  # named metrics only: no sections, so no rules
    wanted = args[args.index("--metrics") + 1].split(",")
    return any(
        re.fullmatch(w.removeprefix("regex:"), name) if w.startswith("regex:") else w == name
        for w in wanted
    )


@pytest.mark.parametrize("path", SEARCH, ids=[p.stem for p in SEARCH])
def test_the_search_sets_metrics_are_all_the_diagnosis_reads(path):
    """Reports recorded with whole sections, cut down to the metrics the search set names: the
    same profile figures and the same bottleneck, so no metric the diagnosis reads is left out —
    but the share of excess sectors, which comes from source counters (the full set's)."""
    data = ReportData.model_validate_json(path.read_text())
    whole = build_profile(data, device="NVIDIA H200")
    cut = data.model_copy(
        update={
            "metrics": {k: v for k, v in data.metrics.items() if collected_by_the_search_set(k)},
            "rules": [],
        }
    )
    assert len(cut.metrics) < len(data.metrics)
    named = build_profile(cut, device="NVIDIA H200")
    assert (named.bottleneck.kind, named.bottleneck.detail) == (
        whole.bottleneck.kind,
        whole.bottleneck.detail,
    )
    for figure in ("duration_ms", "sol_compute_pct", "sol_memory_pct", "dram_tbps"):
        assert getattr(named, figure) == getattr(whole, figure), figure
    # FLOP counts are the full set's (a replay pass of their own): no roofline intensity here.
    assert whole.flops is not None and named.flops is None
    assert named.roofline.arithmetic_intensity is None
    assert named.occupancy == whole.occupancy and named.stalls == whole.stalls
    assert named.coalescing.model_dump(exclude={"excessive_sector_fraction"}) == (
        whole.coalescing.model_dump(exclude={"excessive_sector_fraction"})
    )
    assert named.coalescing.excessive_sector_fraction is None and named.rules == []


@pytest.mark.parametrize("path", FULL, ids=[p.name.split(".")[0] for p in FULL])
def test_full_set_csv_gets_its_bottleneck(path):
    data = parse_raw_csv(path.read_text())[0]
    data.rules = parse_details_csv(
        (path.parent / path.name.replace(".raw.", ".details.")).read_text()
    )[1]
    p = build_profile(data, device="NVIDIA H200")
    expected = expected_for(path.name.split(".")[0])
    assert GROUPS.get(p.bottleneck.kind, p.bottleneck.kind) == expected, p.bottleneck.explanation
    assert any(r.name == "SOLBottleneck" for r in p.rules)


def test_explanations_carry_the_numbers_that_decided_them():
    def diag(stem):
        return build_profile(
            ReportData.model_validate_json((DATA / "search" / f"{stem}.json").read_text()),
            device="NVIDIA H200",
        )

    t = diag("transpose-transpose_naive")
    assert t.coalescing.store_sectors_per_request == pytest.approx(32.0)
    assert t.coalescing.load_sectors_per_request == pytest.approx(4.0)
    assert "stores use 32.0 sectors per request" in t.bottleneck.explanation
    b = diag("bank_conflicts-transpose_smem")
    assert "32-way" in b.bottleneck.explanation
    s = diag("saxpy-saxpy")
    assert 3.3 < s.dram_tbps < 3.5 and s.roofline.bound == "memory"
    assert s.flops == pytest.approx(2 * (1 << 26), rel=1e-3)  # one FMA per element
    assert "DRAM-bound" in s.markdown() and "of 4.3 TB/s measured" in s.markdown()


def test_hotspots_sum_per_line_of_the_users_file_only(tmp_path):
    user = tmp_path / "k.cu"
    user.write_text("line1\nline2\n    out[x * rows + y] = in[y * cols + x];\n")
    data = ReportData.model_validate_json(
        (DATA / "search" / "transpose-transpose_naive.json").read_text()
    )
    stall = "smsp__pcsamp_warps_issue_stalled_long_scoreboard"
    data.per_pc = [
        PcCounters(
            pc=0x10,
            file=str(user),
            line=3,
            counters={stall: 40, "memory_l2_theoretical_sectors_global_excessive": 900},
        ),
        PcCounters(pc=0x20, file=str(user), line=3, counters={stall: 10, "inst_executed": 5}),
        PcCounters(pc=0x30, file=str(user), line=2, counters={stall: 5}),
        PcCounters(pc=0x40, file="optiml-launcher", line=1, counters={stall: 1000}),
    ]
    p = build_profile(data, device="NVIDIA H200", user_file=str(user))
    assert [(h.line, h.stall_samples) for h in p.hotspots] == [(3, 50), (2, 5)]
    assert p.hotspots[0].excessive_sectors == 900 and p.hotspots[0].top_stall == "long_scoreboard"
    assert p.bottleneck.explanation.endswith(
        "(worst at line 3: `out[x * rows + y] = in[y * cols + x];`)"
    )


def test_profile_without_ncu_is_one_clear_line():
    env = {**os.environ, "OPTIML_NCU": "", "PATH": os.path.dirname(sys.executable)}
    if Path("/opt/nvidia/nsight-compute").exists():
        pytest.skip("this machine has Nsight Compute")
    p = subprocess.run(
        [sys.executable, "-m", "optiml.cli", "profile", str(FIXTURES / "saxpy.cu"), "-k", "saxpy"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert p.returncode == 12
    assert (
        p.stderr.strip()
        == "optiml: error: ncu (Nsight Compute) not found: install it or put it on PATH (or set OPTIML_NCU)"
    )


SOURCE = sorted(DATA.glob("*.source.csv"))


def hotspot_for(stem: str) -> tuple[dict, int | None]:
    for e in MANIFEST:
        if f"{Path(e['file']).stem}-{e['kernel']}" == stem:
            return e, e.get("hotspot_line")
    raise KeyError(stem)


@pytest.mark.parametrize("path", SOURCE, ids=[p.name.split(".")[0] for p in SOURCE])
def test_source_page_hotspots_land_on_the_users_line(path):
    """The recorded source pages name the fixture file by the path it had on the GPU host; the
    hotspots are mapped to the same file here, and the worst line is the manifest's."""
    stem = path.name.split(".")[0]
    entry, expected = hotspot_for(stem)
    per_line = parse_source_csv(path.read_text())
    assert per_line and all(pc.line and pc.file for pc in per_line)
    recorded = per_line[0].file
    assert all(pc.file == recorded for pc in per_line)
    user = FIXTURES / entry["file"]
    for pc in per_line:
        pc.file = str(user)
    raw = DATA / f"{stem}.raw.csv"
    data = (
        parse_raw_csv(raw.read_text())[0] if raw.exists() else ReportData(kernel=stem, metrics={})
    )
    data.per_pc = per_line
    p = build_profile(data, device="NVIDIA H200", user_file=str(user))
    if expected is None:
        pytest.skip(f"no agreed hotspot line for {stem} (worst: {p.hotspots[0].line})")
    by = "excessive_sectors" if p.bottleneck.kind == "uncoalesced" else "stall_samples"
    worst = max(p.hotspots, key=lambda h: getattr(h, by))
    assert worst.line == expected
    text = user.read_text().splitlines()[expected - 1].strip()
    if raw.exists():  # with the kernel's metrics, the diagnosis quotes the line
        assert p.bottleneck.explanation.endswith(f"(worst at line {expected}: `{text[:80]}`)")


def test_exit_drain_is_not_a_hotspot():
    """Stores draining at the kernel's end are charged to its closing brace; that is not the line
    to fix (the naive transpose's `}` has more samples than its store)."""
    per_line = parse_source_csv((DATA / "transpose-transpose_naive.source.csv").read_text())
    brace = next(pc for pc in per_line if pc.line == 20)
    assert brace.counters["smsp__pcsamp_warps_issue_stalled_drain"] > 60000
    data = ReportData(kernel="transpose_naive", metrics={}, per_pc=per_line)
    spots = build_profile(data).hotspots
    assert spots[0].line == 18 and all(h.line != 20 or h.stall_samples < 1000 for h in spots)


@pytest.mark.parametrize("stem", ["transpose-transpose_naive", "softmax-softmax_rows"])
def test_search_set_without_source_counters_still_sees_uncoalesced_access(stem):
    """The search set has no SourceCounters, so no excess-sector counts: the sectors per request
    decide (on the H200 the search set called the naive transpose L1-bound and the row-per-thread
    softmax L2/latency-bound before)."""
    data = ReportData.model_validate_json((DATA / "search" / f"{stem}.json").read_text())
    data.metrics = {k: v for k, v in data.metrics.items() if "excessive" not in k}
    p = build_profile(data, device="NVIDIA H200")
    assert p.coalescing.excessive_sector_fraction is None
    assert p.bottleneck.kind == "uncoalesced", p.bottleneck.explanation
    assert "sectors per request" in p.bottleneck.explanation


FULL_H200 = sorted((DATA / "full-h200").glob("*.json"))


@pytest.mark.parametrize("path", FULL_H200, ids=[p.stem for p in FULL_H200])
def test_the_search_set_names_what_the_full_set_names(path):
    """Full-set reports of every fixture, cut down to what the search set collects (no sections,
    no FLOP counts, no pipes): the same bottleneck. Recorded on the H200 after the search set had
    named the 2-D scale latency-bound for want of the roofline's FLOP counts."""
    data = ReportData.model_validate_json(path.read_text())
    whole = build_profile(data, device="NVIDIA H200")
    expected = expected_for(path.stem)
    assert expected in (None, GROUPS.get(whole.bottleneck.kind, whole.bottleneck.kind))
    cut = data.model_copy(
        update={
            "metrics": {k: v for k, v in data.metrics.items() if collected_by_the_search_set(k)},
            "rules": [],
        }
    )
    named = build_profile(cut, device="NVIDIA H200")
    assert named.bottleneck.kind == whole.bottleneck.kind, named.bottleneck.explanation
    if whole.bottleneck.kind != "compute":  # the busiest pipe is the full set's
        assert named.bottleneck.detail == whole.bottleneck.detail
    assert named.flops is None and whole.flops is not None
