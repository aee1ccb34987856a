"""On a GPU with Nsight Compute: `optiml profile` names the expected bottleneck and hotspot line."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from optiml.profile.run import profile_kernel
from optiml.spec import load
from tests.support import FIXTURES, GOOD, fixture_ids

pytestmark = pytest.mark.gpu
GROUPS = {"l1_shared": "l1_l2", "l2": "l1_l2"}
KNOWN = [e for e in GOOD if "bottleneck" in e and "numpy_ref" not in e["file"]]


@pytest.fixture(autouse=True)
def needs_ncu():
    if not shutil.which("ncu") and not list(Path("/opt/nvidia/nsight-compute").glob("*/ncu")):
        pytest.skip("needs Nsight Compute (ncu)")


@pytest.mark.parametrize("entry", KNOWN, ids=fixture_ids(KNOWN))
def test_profile_names_the_bottleneck_and_the_line(entry):
    source, kernel, spec = load(FIXTURES / entry["file"], entry["kernel"])
    p = profile_kernel(source, kernel, spec)
    assert GROUPS.get(p.bottleneck.kind, p.bottleneck.kind) == entry["bottleneck"], (
        p.bottleneck.explanation
    )
    assert p.duration_ms and p.duration_ms > 0
    assert all(
        h.file == str(FIXTURES / entry["file"]) or h.file.endswith(entry["file"])
        for h in p.hotspots
    )
    if "hotspot_line" in entry:
        if not p.hotspots:
            pytest.xfail(
                "per-line hotspots: the report reader gets no per-instruction counters yet"
            )
        by = "excessive_sectors" if p.bottleneck.kind == "uncoalesced" else "stall_samples"
        worst = max(p.hotspots, key=lambda h: getattr(h, by))
        assert worst.line == entry["hotspot_line"], [h.model_dump() for h in p.hotspots]
