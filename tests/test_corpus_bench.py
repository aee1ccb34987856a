"""benchmarks/corpus.py and benchmarks/schedules.py without a GPU: which kernels a run takes, the
copies it optimizes (never the fixtures themselves), the memory-bound floor's bytes and the
summaries' arithmetic. Their GPU steps run on the H200 (benchmarks/results/schedules/)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.support import load_script

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
corpus = load_script("benchmarks/corpus.py", "corpus_bench")
schedules = sys.modules["schedules"]


def test_a_run_without_a_gpu_copies_the_kernels_it_takes_and_writes_its_table(tmp_path):
    before = (ROOT / "fixtures" / "wild" / "vector_add.cu").read_text()
    corpus.main(["--out", str(tmp_path), "--sets", "wild,holdout", "--shard", "1/8", "--no-gpu"])
    table = json.loads((tmp_path / "corpus-1-of-8.json").read_text())
    wild = schedules.kernels(["wild"])
    holdout = schedules.kernels(["holdout"])
    expected = [e["kernel"] for e in (wild + holdout)[::8]]
    assert [r["kernel"] for r in table["rows"]] == expected
    for row in table["rows"]:
        assert "error" not in row, row
        copy = tmp_path / "work" / row["set"] / row["kernel"] / Path(row["file"]).name
        assert copy.read_text() == (ROOT / row["file"]).read_text()
    assert set(table["summary"]) == {"wild", "holdout"}
    assert (ROOT / "fixtures" / "wild" / "vector_add.cu").read_text() == before


def test_bad_arguments_are_usage_errors():
    for bad in (["--sets", "mine"], ["--shard", "0/2"]):
        with pytest.raises(SystemExit) as e:
            corpus.parse_args(["--out", "x", *bad])
        assert e.value.code == 2


def test_the_summary_counts_what_the_bar_asks():
    rows = [
        # 2x faster than PyTorch, at its floor, delivered in 40 s
        {"set": "corpus", "family": "map", "delivered_ms": 1.0, "torch_ms": 2.0, "floor_ms": 1.0}
        | {"optimize_s": 40.0, "winner": True},
        # 2x slower, 2x its floor, 100 s
        {"set": "corpus", "family": "reduction", "delivered_ms": 2.0, "torch_ms": 1.0}
        | {"floor_ms": 1.0, "optimize_s": 100.0, "winner": False},
        # a GEMM: compared with PyTorch, not with a memory-bound floor
        {"set": "corpus", "family": "contraction (matrix-matrix)", "delivered_ms": 1.0}
        | {"torch_ms": 1.0, "floor_ms": 0.1, "optimize_s": 10.0, "winner": True},
        {"set": "corpus", "family": "map", "optimize_error": "timed out after 300 s"},
    ]
    s = corpus.summary(rows)["corpus"]
    assert s["kernels"] == 4 and s["with_a_winner"] == 2
    assert s["geomean_delivered_over_torch"] == pytest.approx(1.0) and s["with_torch"] == 3
    assert (s["memory_bound_within_1.3_of_floor"], s["memory_bound_with_a_floor"]) == (1, 2)
    assert (s["delivered_within_90_s"], s["optimized"]) == (2, 3)


def test_the_memory_bound_floor_reads_what_the_outputs_depend_on():
    from optiml.harness.verdict import Dependence
    from optiml.harness.work import moved_bytes
    from optiml.spec import load

    # an embedding lookup: the table is read where the tokens point, not whole
    _, _, spec = load(ROOT / "fixtures" / "holdout" / "embedding.cu", "embedding_forward")
    case = spec.cases()[0]
    whole = moved_bytes(spec, case, [])
    table = max(spec.buffers, key=lambda b: case.lengths[b.name])
    seen = [Dependence(buffer=table.name, samples=8, sensitive=2)]
    assert moved_bytes(spec, case, seen) < whole
    # a probe that saw nothing move (a maximum) counts its input as read whole
    assert moved_bytes(spec, case, [Dependence(buffer=table.name, samples=8, sensitive=0)]) == whole


def test_schedules_takes_kernels_from_files_outside_the_sets(tmp_path):
    """--files: each given file's kernels that have a spec, named by their path where it lies
    outside the repository (KernelBench's tasks as `optiml generate --from-torch` writes them)."""
    source = (ROOT / "fixtures" / "wild" / "vector_add.cu").read_text()
    (tmp_path / "mine.cu").write_text(source + "\n__global__ void helper(float* p) { *p = 0; }\n")
    entries = schedules.file_kernels([tmp_path / "mine.cu"])
    wild = [e["kernel"] for e in schedules.kernels(["wild"]) if e["file"] == "vector_add.cu"]
    assert wild and [e["kernel"] for e in entries] == wild  # the helper has no spec
    assert {e["set"] for e in entries} == {"files"}
    assert schedules.shown(entries[0]["path"]) == str((tmp_path / "mine.cu").resolve())
    args = schedules.parse_args(["--out", "x", "--files", str(tmp_path / "mine.cu")])
    assert args.files == [tmp_path / "mine.cu"]


def test_schedules_measures_only_the_transformations_asked_for(capsys):
    args = schedules.parse_args(["--out", "x", "--transforms", "window_tile,implicit_gemm"])
    assert args.transforms == ["window_tile", "implicit_gemm"]
    assert schedules.parse_args(["--out", "x"]).transforms == []
    with pytest.raises(SystemExit):
        schedules.parse_args(["--out", "x", "--transforms", "window_tiles"])
    assert "no transformation window_tiles" in capsys.readouterr().err
