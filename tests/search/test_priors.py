"""The offline policy's family priors: learned by benchmarks/priors.py from the committed GPU
measurements (benchmarks/results/schedules), reproducible from them, and used by the policy to
rank a kernel's rewrites by what they gained on kernels of its family."""

from __future__ import annotations

import json
from pathlib import Path

from optiml.search.policy import NodeView, OfflinePolicy
from optiml.search.priors import family_of, family_priors, gain
from optiml.search.variant import Variant
from tests.support import load_script

ROOT = Path(__file__).resolve().parents[2]
priors = load_script("benchmarks/priors.py", "priors_bench")


def test_the_committed_priors_and_their_check_are_what_the_measurements_give(tmp_path):
    report = priors.main(
        ["--priors", str(tmp_path / "p.json"), "--report", str(tmp_path / "r.json")]
    )
    fresh = json.loads((tmp_path / "p.json").read_text())
    committed = json.loads((ROOT / "optiml/search/family_priors.json").read_text())
    stale = "stale: run python3 benchmarks/priors.py and commit what it writes"
    assert fresh == committed, stale
    assert json.loads((tmp_path / "r.json").read_text()) == json.loads(
        (ROOT / "benchmarks/results/priors-holdout.json").read_text()
    ), stale
    # learned without the holdout kernels, checked on them: the family priors put the best
    # measured rewrite first more often than the catalog's flat gains do
    assert committed["sets"] == ["corpus", "wild"]
    before, after = report["catalog gains"], report["family priors"]
    assert after["kernels"] == before["kernels"] >= 25
    assert after["first_is_best"] > before["first_is_best"]
    assert after["geomean_regret"] < before["geomean_regret"]


def test_a_rewrite_without_a_measurement_in_the_family_keeps_the_catalogs_gain():
    learned = family_priors()
    assert learned["row normalization"]["warp_rows"] > 1.0
    assert gain("row normalization", "warp_rows", 1.0) == learned["row normalization"]["warp_rows"]
    assert gain("row normalization", "no_such_rewrite", 0.5) == 0.5
    assert gain(None, "warp_rows", 1.0) == 1.0
    assert family_of("not cuda at all", "x.cu", "k") is None


def test_the_policy_ranks_a_row_kernels_rewrites_by_their_family():
    path = ROOT / "fixtures" / "holdout" / "row_variance.cu"
    view = NodeView(variant=Variant(path.read_text()), path=str(path), kernel="row_variance")
    ranked = OfflinePolicy().candidates(view)
    rewrites = [
        c.edit.transform
        for c in ranked
        if c.edit.transform in ("warp_rows", "row_parallel", "vectorize")
    ]
    # measured on other row kernels: a warp or block per row gains several times, vectorize loses
    assert rewrites[0] in ("warp_rows", "row_parallel") and rewrites[-1] == "vectorize"
