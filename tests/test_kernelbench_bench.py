"""benchmarks/kernelbench.py without a GPU: its arguments, which tasks a run takes (--only,
--shard), the translate step's rows and files, and that a step that fails is a row with its
error. The GPU steps (optimize, eval, PyTorch eager and torch.compile) run on the H200."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.support import load_script

ROOT = Path(__file__).resolve().parents[1]
KB = ROOT.parent / "shared" / "kernelbench" / "level1"
needs_kb = pytest.mark.skipif(not KB.is_dir(), reason=f"KernelBench's level 1 is not at {KB}")


bench = load_script("benchmarks/kernelbench.py", "kernelbench_bench")


def test_defaults_are_small_and_bad_arguments_are_usage_errors(tmp_path):
    a = bench.parse_args(["--out", str(tmp_path)])
    assert (a.budget, a.time, a.shard, a.only) == (8, 60.0, (1, 1), "")
    assert bench.parse_args(["--out", "x", "--shard", "3/4"]).shard == (3, 4)
    for bad in (["--shard", "0/4"], ["--shard", "5/4"], ["--shard", "two"], ["--budget", "0"]):
        with pytest.raises(SystemExit) as e:
            bench.parse_args(["--out", "x", *bad])
        assert e.value.code == 2


@needs_kb
def test_shards_split_the_tasks_and_only_picks_them(tmp_path):
    runs = [bench.tasks(bench.parse_args(["--out", "x", "--shard", f"{i}/3"])) for i in (1, 2, 3)]
    everything = sorted(KB.glob("*.py"))
    assert sorted(p for run in runs for p in run) == everything  # each task in one shard
    assert sum(len(r) for r in runs) == len(everything) == 50
    only = bench.tasks(
        bench.parse_args(
            ["--out", "x", "--only", "94, 50_conv_standard_2D__square_input__square_kernel"]
        )
    )
    assert [p.name.split("_")[0] for p in only] == ["50", "94"]
    with pytest.raises(SystemExit, match="no task 7"):
        bench.tasks(bench.parse_args(["--out", "x", "--only", "7"]))


ROLLED = """import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.roll(x, 1, 1)


def get_inputs():
    return [torch.rand(16, 32)]


def get_init_inputs():
    return []
"""


@needs_kb
def test_the_translate_step_writes_the_kernel_or_says_why_not(tmp_path):
    # every level-1 task of the shared set translates: one that does not is written here
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    for n in (42, 94):
        (task,) = KB.glob(f"{n}_*.py")
        shutil.copy(task, tasks / task.name)
    (tasks / "92_roll.py").write_text(ROLLED)
    a = bench.parse_args(["--out", str(tmp_path / "out"), "--tasks", str(tasks)])
    table = bench.run(a, gpu=False)
    rows = {r["number"]: r for r in table["rows"]}
    assert rows[92]["translated"] is False and "`torch.roll`" in rows[92]["why"]
    for n, name in ((42, "Max_Pooling_2D"), (94, "MSELoss")):
        assert rows[n]["translated"] is True and rows[n]["kernel"] == name
        cu = Path(rows[n]["file"])
        assert cu.exists() and (cu.parent / f"{name}_ref.py").exists()
    assert rows[94]["formula"].splitlines()[-1].startswith("out = mean(b, i)")
    written = json.loads((tmp_path / "out" / "kernelbench.json").read_text())
    assert written["summary"] == {
        "tasks": 3,
        "translated": 2,
        "geomean_speedup_vs_eager": None,
        "rows_vs_eager": 0,
        "geomean_speedup_vs_compile": None,
        "rows_vs_compile": 0,
        "geomean_speedup_vs_eager_defaults": None,
        "rows_vs_eager_defaults": 0,
    }
    assert {"date", "optiml", "python", "args"} <= set(written)
    assert written["torch_precision"] == "fp32, TF32 off"


def test_times_speedups_and_geometric_means():
    verdict = {"cases": [{"timing": None}, {"timing": {"candidate": {"median_ms": 0.5}}}]}
    assert bench.delivered_ms(verdict) == 0.5
    assert bench.delivered_ms({"cases": []}) is None
    rows = [
        {"delivered_ms": 1.0, "eager_ms": 2.0, "compile_ms": 0.5},
        {"delivered_ms": 2.0, "eager_ms": 16.0},
        {"delivered_error": "wrong_result"},
    ]
    for r in rows:
        bench.speedups(r)
    assert rows[0]["speedup_vs_eager"] == 2.0 and rows[0]["speedup_vs_compile"] == 0.5
    s = bench.summary(rows)
    assert s["geomean_speedup_vs_eager"] == pytest.approx(4.0)  # √(2 · 8)
    assert (s["rows_vs_eager"], s["rows_vs_compile"]) == (2, 1)


@needs_kb
@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="a GPU is present")
def test_a_step_that_fails_is_a_row_with_its_error_and_the_run_goes_on(tmp_path):
    a = bench.parse_args(
        ["--out", str(tmp_path), "--only", "94,100", "--time", "5", "--budget", "1"]
    )
    table = bench.run(a)
    assert [r["number"] for r in table["rows"]] == [94, 100]
    for r in table["rows"]:
        assert r["optimize_error"].startswith("exit 7: no NVIDIA GPU")
        assert r["delivered_error"].startswith("exit 7: no NVIDIA GPU")
        assert "delivered_ms" not in r and "speedup_vs_eager" not in r


def test_no_task_is_started_past_the_runs_seconds(tmp_path):
    """`--seconds 0`: every task is left for another run, named in the table, none lost midway."""
    a = bench.parse_args(["--out", str(tmp_path), "--only", "94,100", "--seconds", "0"])
    table = bench.run(a)
    assert table["rows"] == [] and len(table["not_started"]) == 2
    saved = json.loads((tmp_path / "kernelbench.json").read_text())
    assert saved["not_started"] == table["not_started"]


def test_a_rows_search_summary_says_what_the_search_evaluated():
    """From a committed trajectory (the SGEMM search on the H200): the stop, the evaluations, the
    baseline's time split (its full profile) and every evaluated edit with its status and speed-up."""
    t = json.loads((ROOT / "benchmarks/results/optimize-sgemm-h200-trajectory.json").read_text())
    s = bench.search_summary(t)
    assert s["stop"] == t["stop"] and s["evaluations"] == t["evaluations"]
    assert s["baseline"]["profile_s"] > s["baseline"]["run_s"] > 0
    evaluated = [n for n in t["nodes"] if n.get("edit") and n.get("measurement")]
    assert len(s["nodes"]) == len(evaluated) > 0
    assert {n["edit"] for n in s["nodes"]} == {n["edit"]["transform"] for n in evaluated}
    assert all(n["status"] == "ok" and n["speedup"] > 1 for n in s["nodes"])
    assert [n["params"] for n in s["nodes"]] == [n["edit"]["params"] for n in evaluated]
    # the winner's edits, root first, each one the parent's child
    chain, at = [], next(n for n in t["nodes"] if n["id"] == t["winner"])
    while at["edit"] is not None:
        chain.append(at["edit"]["transform"])
        at = next(n for n in t["nodes"] if n["id"] == at["parent"])
    assert [e["edit"] for e in s["winner_edits"]] == chain[::-1] and chain
    checks = t["judge"]["checks"]
    assert list(s["judge_s"]) == [c["name"] for c in checks] and checks


def test_the_floor_is_what_a_memory_bound_kernel_moves(tmp_path, monkeypatch):
    """The timed case's floor counts every byte read and written once (saxpy: x read, y read and
    written: 12 bytes an element) over the copy bandwidth measured on the verdict's GPU (here a
    cached measurement); the verdict's own floor, which leaves out writes that fit the L2, is not
    the one a fast kernel is held to."""
    from optiml.harness.ceilings import _key
    from optiml.harness.verdict import DeviceInfo
    from optiml.spec import load

    monkeypatch.setenv("OPTIML_CACHE_DIR", str(tmp_path))
    device = DeviceInfo(
        name="A GPU", compute_capability="9.0", sm_count=132, l2_bytes=50 << 20,
        memory_bytes=80 << 30, driver_version=1, runtime_version=1, sm_clock_idle_mhz=1000,
    )  # fmt: skip
    cache = {"device": "A GPU", "read_gbs": 3000.0, "write_gbs": 3000.0, "copy_gbs": 2500.0}
    (tmp_path / "ceilings.json").write_text(json.dumps({_key(device): cache}))
    n = 1 << 26
    verdict = {
        "device": device.model_dump(),
        "cases": [
            {"label": "n=1000003", "floor": {"ms": 1e-9}},  # not timed: not the floor's case
            {"label": f"n={n}", "timing": {"candidate": {"median_ms": 1.0}}, "dependence": []},
        ],
    }
    _, _, spec = load(ROOT / "fixtures" / "saxpy.cu", "saxpy")
    floor = bench.memory_floor_ms(spec, verdict)
    assert floor == pytest.approx(12 * n / (2500.0 * 1e6))
    assert bench.memory_floor_ms(spec, {"cases": []}) is None


def test_the_delivered_kernel_beyond_numpys_reach_says_where_numpy_checked_it(
    monkeypatch, tmp_path
):
    """A task size too large for the NumPy reference: `optiml eval` checks the delivered kernel
    against it where it can (the harness's split), and the row records those sizes."""
    cu = ROOT / "fixtures" / "numpy_ref" / "rmsnorm.cu"
    calls = []

    def fake(args, timeout):
        calls.append(args)
        message = (
            "checked against `rmsnorm` at rows=1000, cols=333 (larger sizes against `rmsnorm` "
            "as written: too costly for the CPU); correct at 1 size(s) x 2 seeds"
        )
        return {"status": "ok", "cases": [], "message": message}, ""

    monkeypatch.setattr(bench, "numpy_sizes", lambda spec: [{"rows": 1000, "cols": 333}])
    monkeypatch.setattr(bench, "_optiml", fake)
    row = {"file": str(cu), "kernel": "rmsnorm"}
    bench.eval_step(row, bench.parse_args(["--out", str(tmp_path)]))
    assert calls == [["eval", str(cu), "--kernel", "rmsnorm"]]
    assert row["delivered_status"] == "ok" and row["numpy_checked_at"] == [
        {"rows": 1000, "cols": 333}
    ]
    assert row["numpy_checked"] == "rows=1000, cols=333"


def test_a_winner_built_with_extra_nvcc_flags_is_timed_with_them(monkeypatch, tmp_path):
    """The delivered file is timed as optimize measured it: the winner's flags beyond the defaults
    (an LLM's edit may add some) go to `optiml eval`, and the row names them."""
    cu = ROOT / "fixtures" / "saxpy.cu"
    calls = []

    def fake(args, timeout):
        calls.append(args)
        if args[0] == "optimize":
            nodes = [{"id": 0, "flags": ["-O3"]}, {"id": 3, "flags": ["-O3", "-use_fast_math"]}]
            return {"winner": 3, "nodes": nodes, "outcome": "2x faster"}, ""
        return {"status": "ok", "cases": []}, ""

    monkeypatch.setattr(bench, "_optiml", fake)
    row = {"file": str(cu), "kernel": "saxpy"}
    bench.run_optimize(row, cu, [], timeout=10)
    bench.eval_step(row, bench.parse_args(["--out", str(tmp_path)]))
    assert row["delivered_flags"] == ["-use_fast_math"]
    assert calls[-1] == ["eval", str(cu), "--kernel", "saxpy", "--nvcc-flag=-use_fast_math"]
    plain = {"file": str(cu), "kernel": "saxpy"}
    monkeypatch.setattr(bench, "_optiml", lambda args, timeout: ({"winner": None, "nodes": []}, ""))
    bench.run_optimize(plain, cu, [], timeout=10)
    assert "delivered_flags" not in plain


def test_pytorch_times_are_reused_only_from_the_same_gpu_and_torch(tmp_path):
    earlier = {
        "date": "2026-12-06T14:51:44+00:00",
        "device": "NVIDIA H100 80GB HBM3",
        "torch": "2.11.0+cu130",
        "rows": [
            {"task": "94_MSELoss.py", "eager_ms": 2.0, "compile_ms": 1.5, "delivered_ms": 9.0},
            {"task": "4_Matrix_vector_multiplication_.py", "translated": True},  # none timed
        ],
    }
    path = tmp_path / "kb.json"
    path.write_text(json.dumps(earlier))
    times = bench.torch_times([path])
    same = {"device": "NVIDIA H100 80GB HBM3", "torch": "2.11.0+cu130"}
    row = {"task": "94_MSELoss.py", "delivered_ms": 1.0}
    assert bench.reuse_torch(row, times, same)
    assert (row["eager_ms"], row["compile_ms"], row["delivered_ms"]) == (2.0, 1.5, 1.0)
    assert row["torch_from"] == "kb.json (2026-12-06T14:51:44+00:00)"
    for other in ({**same, "device": "NVIDIA H200"}, {**same, "torch": "2.12.0"}):
        assert not bench.reuse_torch({"task": "94_MSELoss.py"}, times, other)
    assert not bench.reuse_torch({"task": "4_Matrix_vector_multiplication_.py"}, times, same)
    # a table merged from runs (benchmarks/generated_table.py) whose runs share GPU and torch
    merged = {
        "runs": [
            {**same, "date": "2026-12-06T17:19:30+00:00"},
            {**same, "date": "2026-12-06T17:34:49+00:00"},
        ],
        "rows": earlier["rows"],
    }
    path.write_text(json.dumps(merged))
    row = {"task": "94_MSELoss.py"}
    assert bench.reuse_torch(row, bench.torch_times([path]), same)
    assert row["torch_from"] == "kb.json (2026-12-06T17:34:49+00:00)"
    mixed = {**merged, "runs": [*merged["runs"], {**same, "device": "NVIDIA H200"}]}
    path.write_text(json.dumps(mixed))
    assert not bench.reuse_torch({"task": "94_MSELoss.py"}, bench.torch_times([path]), same)


def test_steps_are_checked(capsys):
    assert bench.parse_args(["--out", "x", "--steps", "torch"]).steps == ["torch"]
    with pytest.raises(SystemExit):
        bench.parse_args(["--out", "x", "--steps", "optimise"])
    assert "no step optimise" in capsys.readouterr().err


CONV = "50_conv_standard_2D__square_input__square_kernel.py"


def test_pytorch_is_compared_in_fp32_and_a_convolution_also_with_its_defaults(tmp_path):
    # a run before TF32 was turned off: its convolution's eager time is cuDNN's TF32 (PyTorch's
    # default), not the fp32 the delivered kernel is checked to, and is kept only as the defaults'
    old = {"task": CONV, "delivered_ms": 3.0, "eager_ms": 2.0, "compile_ms": 2.5}
    bench.speedups(old)
    row = bench.normalize(old)
    assert "eager_ms" not in row and "compile_ms" not in row
    assert row["eager_default_ms"] == 2.0 and row["speedup_vs_eager_default"] == pytest.approx(
        2 / 3
    )
    assert "speedup_vs_eager" not in row and "speedup_vs_compile" not in row
    # elsewhere PyTorch's defaults are fp32: the time stands
    mse = bench.normalize({"task": "94_MSELoss.py", "delivered_ms": 1.0, "eager_ms": 2.0})
    assert mse["eager_ms"] == 2.0 and mse["speedup_vs_eager"] == 2.0
    # a new row is as measured
    new = {"task": CONV, "eager_ms": 6.0, "torch_precision": bench.PRECISION}
    assert bench.normalize(new) is new
    # the summary's defaults figure takes the defaults' time where there is one
    fresh = {"task": CONV, "delivered_ms": 3.0, "eager_ms": 6.0, "eager_default_ms": 2.0}
    bench.speedups(fresh)
    s = bench.summary([fresh, mse])
    assert s["geomean_speedup_vs_eager"] == pytest.approx(2.0)  # √(2 · 2)
    assert s["geomean_speedup_vs_eager_defaults"] == pytest.approx((2 / 3 * 2) ** 0.5)
    # the old convolution's times are not reused: it is timed again, in fp32
    same = {"device": "NVIDIA H100 80GB HBM3", "torch": "2.11.0+cu130"}
    path = tmp_path / "kb.json"
    path.write_text(json.dumps({**same, "date": "2026-12-07", "rows": [old]}))
    assert not bench.reuse_torch({"task": CONV}, bench.torch_times([path]), same)


def test_a_run_that_timed_only_pytorch_updates_the_earlier_rows_times(tmp_path):
    table = load_script("benchmarks/generated_table.py", "generated_table_for_kb")
    first = {
        "date": "2026-12-07T10:00:00+00:00",
        "rows": [
            {"task": CONV, "delivered_ms": 3.0, "eager_ms": 2.0, "search": {"evaluations": 9}},
            {"task": "94_MSELoss.py", "delivered_ms": 1.0, "eager_ms": 2.0},
        ],
    }
    retimed = {
        "date": "2026-12-07T12:00:00+00:00",
        "rows": [
            {
                "task": CONV,
                "steps": ["torch"],
                "eager_ms": 6.0,
                "compile_ms": 4.5,
                "eager_default_ms": 2.0,
                "torch_precision": bench.PRECISION,
            }
        ],
    }
    merged = table.merge("kernelbench", [first, retimed])
    conv = merged["rows"][0]
    assert conv["delivered_ms"] == 3.0 and conv["search"] == {"evaluations": 9}
    assert (conv["speedup_vs_eager"], conv["speedup_vs_compile"]) == (2.0, 1.5)
    assert conv["speedup_vs_eager_default"] == pytest.approx(2 / 3)
    assert conv["torch_from"] == "a later run (2026-12-07T12:00:00+00:00)"
    md = table.markdown("kernelbench", merged)
    assert "| vs compile | vs eager (defaults) | over copy floor |" in md
    assert f"| `{CONV}` | 3 | 6 | 4.5 | 2.00× | 1.50× | 0.67× |" in md
