"""benchmarks/generated_table.py without a GPU: shards of the intents and KernelBench benchmarks
merged (the latest row of a name wins, the summary recomputed by the benchmark's own function)
into JSON and a Markdown table."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from tests.support import load_script

ROOT = Path(__file__).resolve().parents[1]
table = load_script("benchmarks/generated_table.py", "generated_table")


def test_intents_shards_merge_with_the_latest_row_of_each_intent(tmp_path):
    first = json.loads((ROOT / "benchmarks/results/intents-h200-1-of-3-partial.json").read_text())
    second = copy.deepcopy(first)
    redo = copy.deepcopy(first["rows"][0])  # relu measured again, now faster than eager
    redo.update(delivered_ms=0.03, speedup_vs_eager=redo["eager_ms"] / 0.03, over_floor=1.1)
    redo["search"] = {
        "stop": "time",
        "evaluations": 9,
        "nodes": [{"edit": "vector_map", "status": "ok", "speedup": 1.8}],
    }
    extra = copy.deepcopy(first["rows"][1]) | {"intent": "silu_again"}
    second["rows"] = [redo, extra]
    second["date"] = "2026-12-07T00:00:00+00:00"
    merged = table.merge("intents", [first, second])
    names = [r["intent"] for r in merged["rows"]]
    assert names == [r["intent"] for r in first["rows"]] + ["silu_again"]
    assert merged["rows"][0]["delivered_ms"] == 0.03  # the later run's row
    assert merged["summary"]["intents"] == len(first["rows"]) + 1
    assert merged["summary"]["rows_vs_eager"] == len(first["rows"]) + 1
    md = table.markdown("intents", merged)
    assert "on NVIDIA H200" in md and "2026-12-07" in md
    assert "| `relu` | 0.03 |" in md and "9 evaluated, 1 correct, best 1.80×, stopped: time" in md
    assert md.count("\n| `") == len(merged["rows"])


def test_a_kernelbench_row_that_did_not_translate_says_why(tmp_path):
    run = {
        "date": "2026-12-07T00:00:00+00:00",
        "device": "NVIDIA H200",
        "args": {"budget": 48, "time": 90},
        "rows": [
            {"task": "92_roll.py", "number": 92, "translated": False, "why": "a | b: not covered"},
            {
                "task": "19_ReLU.py",
                "number": 19,
                "translated": True,
                "delivered_ms": 0.5,
                "eager_ms": 0.6,
                "speedup_vs_eager": 1.2,
            },
        ],  # fmt: skip
    }
    out, md = tmp_path / "kb.json", tmp_path / "kb.md"
    table.main(["kernelbench", str(_write(tmp_path / "run.json", run)), "--out", str(out),
                "--md", str(md)])  # fmt: skip
    merged = json.loads(out.read_text())
    assert merged["summary"]["tasks"] == 2 and merged["summary"]["translated"] == 1
    assert merged["summary"]["geomean_speedup_vs_eager"] == 1.2
    text = md.read_text()
    assert "| `92_roll.py` |" in text and "a / b: not covered" in text  # a cell never splits
    assert "| `19_ReLU.py` | 0.5 | 0.6 |" in text and "1.20×" in text


def test_tasks_keeps_the_rows_of_one_folders_task_files(tmp_path):
    """A run over tasks of two folders (../shared's level 1 and this project's own) makes a table
    of each with `--tasks`."""
    row = {"number": 19, "translated": True, "delivered_ms": 0.5, "eager_ms": 0.6}
    run = {
        "date": "2026-12-07T00:00:00+00:00",
        "device": "NVIDIA H100",
        "args": {"budget": 48, "time": 90},
        "rows": [
            row | {"task": "19_ReLU.py", "speedup_vs_eager": 1.2},
            row | {"task": "33_BatchNorm.py", "number": 33, "speedup_vs_eager": 0.5},
        ],
    }
    shared, own = tmp_path / "shared", tmp_path / "own"
    for folder, task in ((shared, "19_ReLU.py"), (own, "33_BatchNorm.py")):
        folder.mkdir()
        (folder / task).write_text("")
    path = _write(tmp_path / "run.json", run)
    for folder, task in ((shared, "19_ReLU.py"), (own, "33_BatchNorm.py")):
        out, md = tmp_path / f"{folder.name}.json", tmp_path / f"{folder.name}.md"
        table.main(["kernelbench", str(path), "--out", str(out), "--md", str(md),
                    "--tasks", str(folder)])  # fmt: skip
        merged = json.loads(out.read_text())
        assert [r["task"] for r in merged["rows"]] == [task]
        assert merged["summary"]["tasks"] == 1


def _write(path: Path, data: dict) -> Path:
    path.write_text(json.dumps(data))
    return path
