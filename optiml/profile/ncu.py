"""Nsight Compute: running it on one kernel of an evaluation, and reading its report back into plain
data (`ReportData`: metrics by name, rule results, per-instruction counters with their source line).

Two readers give the same `ReportData`: the `ncu_report` Python module that ships with Nsight
Compute (it has the per-PC source correlation that per-line hotspots need), and the CSV pages of
`ncu -i` (`raw` and `details`), which need nothing but the ncu binary.
"""

from __future__ import annotations

import csv
import io
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, Field

from optiml.errors import ExitCode, NcuMissing, OptimlError

SEARCH_SECTIONS = (
    "SpeedOfLight",
    "MemoryWorkloadAnalysis",
    "Occupancy",
    "LaunchStats",
    "WarpStateStats",
    "SchedulerStats",
    "SourceCounters",
)
FULL_EXTRA = ("ComputeWorkloadAnalysis", "InstructionStats", "MemoryWorkloadAnalysis_Tables")
# What the diagnosis needs beyond the sections: sector and request counts of each kind of access,
# shared-memory conflicts, local-memory traffic and FLOP counts.
DIAGNOSIS_METRICS = tuple(
    [f"l1tex__t_sectors_pipe_lsu_mem_global_op_{op}.sum" for op in ("ld", "st", "red", "atom")]
    + [f"l1tex__t_requests_pipe_lsu_mem_global_op_{op}.sum" for op in ("ld", "st")]
    + [f"l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_{op}.sum" for op in ("ld", "st")]
    + [f"l1tex__data_pipe_lsu_wavefronts_mem_shared_op_{op}.sum" for op in ("ld", "st")]
    + [f"l1tex__t_sectors_pipe_lsu_mem_local_op_{op}.sum" for op in ("ld", "st")]
    + [
        f"smsp__sass_thread_inst_executed_op_{op}_pred_on.sum"
        for op in ("fadd", "fmul", "ffma", "dadd", "dmul", "dfma")
    ]
    + ["dram__bytes_read.sum", "dram__bytes_write.sum"]
)
# Per-instruction counters read for hotspots (from SourceCounters and warp-state sampling).
PER_PC_METRICS = (
    "inst_executed",
    "memory_l2_theoretical_sectors_global",
    "memory_l2_theoretical_sectors_global_ideal",
    "memory_l2_theoretical_sectors_global_excessive",
)
STALL_PREFIX = "smsp__pcsamp_warps_issue_stalled_"


class NcuError(OptimlError):
    """ncu ran but could not profile the kernel."""

    exit_code = ExitCode.PROFILE_FAILED


class Metric(BaseModel):
    value: float | str | None
    unit: str = ""


class RuleResult(BaseModel):
    """One of ncu's rule results: a hypothesis, not a verdict (rules can be wrong)."""

    section: str
    name: str
    type: str  # OPT | WRN | INF | ERR
    message: str
    speedup_type: str | None = None
    estimated_speedup_pct: float | None = None


class PcCounters(BaseModel):
    pc: int
    file: str | None
    line: int | None
    counters: dict[str, float]


class ReportData(BaseModel):
    kernel: str
    metrics: dict[str, Metric]
    rules: list[RuleResult] = Field(default_factory=list)
    per_pc: list[PcCounters] = Field(default_factory=list)

    def number(self, name: str, default: float | None = None) -> float | None:
        m = self.metrics.get(name)
        if m is None or not isinstance(m.value, (int, float)):
            return default
        return float(m.value)


def parse_number(text: str) -> float | str | None:
    """ncu's CSV numbers carry thousands separators ("32,416"); empty means not collected."""
    t = text.strip()
    if t in ("", "n/a", "N/A"):
        return None
    try:
        return float(t.replace(",", ""))
    except ValueError:
        return t


def _csv_rows(text: str) -> list[list[str]]:
    # ncu may print `==PROF==` lines and warnings around the CSV
    lines = [line for line in text.splitlines() if line.startswith('"')]
    return list(csv.reader(io.StringIO("\n".join(lines))))


def parse_raw_csv(text: str) -> list[ReportData]:
    """`ncu -i R --page raw --csv --print-units base`: a header row, a units row, a row per kernel."""
    rows = _csv_rows(text)
    if len(rows) < 3:
        return []
    header, units = rows[0], rows[1]
    out = []
    for row in rows[2:]:
        d = dict(zip(header, row, strict=False))
        metrics = {
            name: Metric(value=parse_number(value), unit=unit)
            for name, unit, value in zip(header, units, row, strict=False)
            if "." in name or "__" in name
        }
        out.append(ReportData(kernel=d.get("Kernel Name", ""), metrics=metrics))
    return out


def parse_details_csv(text: str) -> tuple[dict[str, Metric], list[RuleResult]]:
    """`--page details`: section metrics (by "Section/Metric Name") and rule results."""
    rows = _csv_rows(text)
    if not rows:
        return {}, []
    header = rows[0]
    metrics: dict[str, Metric] = {}
    rules: list[RuleResult] = []
    for row in rows[1:]:
        d = dict(zip(header, row, strict=False))
        if d.get("Rule Name"):
            speedup = parse_number(d.get("Estimated Speedup", ""))
            rules.append(
                RuleResult(
                    section=d.get("Section Name", ""),
                    name=d["Rule Name"],
                    type=d.get("Rule Type", ""),
                    message=d.get("Rule Description", ""),
                    speedup_type=d.get("Estimated Speedup Type") or None,
                    estimated_speedup_pct=speedup if isinstance(speedup, float) else None,
                )
            )
        elif d.get("Metric Name"):
            metrics[f"{d.get('Section Name', '')}/{d['Metric Name']}"] = Metric(
                value=parse_number(d.get("Metric Value", "")), unit=d.get("Metric Unit", "")
            )
    return metrics, rules


# ---- running ncu -------------------------------------------------------------------------------


@dataclass(frozen=True)
class NcuTool:
    path: Path
    version: str
    python_dir: Path | None  # where ncu_report.py is, if shipped


def find_ncu() -> NcuTool:
    candidates = [os.environ.get("OPTIML_NCU"), shutil.which("ncu")]
    root = Path("/opt/nvidia/nsight-compute")
    if root.is_dir():
        candidates += [str(p / "ncu") for p in sorted(root.iterdir(), reverse=True)]
    cuda = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    candidates.append(str(Path(cuda) / "bin" / "ncu"))
    path = next((Path(c) for c in candidates if c and Path(c).is_file()), None)
    if path is None:
        raise NcuMissing(
            "ncu (Nsight Compute) not found: install it or put it on PATH (or set OPTIML_NCU)"
        )
    out = subprocess.run([str(path), "--version"], capture_output=True, text=True).stdout
    version = next((w for w in out.split() if w[:1].isdigit() and w.count(".") >= 2), "unknown")
    real = path.resolve().parent
    py = next((d for d in (real / "extras" / "python",) if (d / "ncu_report.py").exists()), None)
    return NcuTool(path, version, py)


@dataclass
class NcuRun:
    report: Path
    seconds: float
    command: list[str]
    log: str


def run_ncu(
    tool: NcuTool,
    program: list[str],
    *,
    mangled: str,
    out: Path,
    full: bool,
    clock_control: str = "none",
    timeout_s: float = 300,
    env: dict[str, str] | None = None,
) -> NcuRun:
    """Profile the first launch of the kernel whose mangled name is `mangled` in `program`."""
    sections = [*SEARCH_SECTIONS, *(FULL_EXTRA if full else ())]
    cmd = [
        str(tool.path),
        "--target-processes", "all",
        "--kernel-name-base", "mangled",
        "--kernel-name", f"regex:^{mangled}$",
        "--launch-count", "1",
        "--clock-control", clock_control,
        "--import-source", "yes",
        *[a for s in sections for a in ("--section", s)],
        "--metrics", ",".join(DIAGNOSIS_METRICS),
        "-f", "-o", str(out),
        *program,
    ]  # fmt: skip
    start = time.perf_counter()
    try:
        p = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env={**os.environ, **(env or {})},
        )
    except subprocess.TimeoutExpired:
        raise NcuError(f"ncu did not finish within {timeout_s:g} s") from None
    seconds = time.perf_counter() - start
    report = Path(str(out) + ".ncu-rep")
    log = p.stdout + p.stderr
    if not report.exists():
        err = next((line for line in log.splitlines() if "==ERROR==" in line), None)
        if err is None and "No kernels were profiled" in log:
            err = f"no launch of {mangled} was profiled"
        raise NcuError(
            f"ncu could not profile the kernel: {(err or log.strip()[-200:]).replace('==ERROR== ', '')}"
        )
    return NcuRun(report, seconds, cmd, log)


def read_report(tool: NcuTool, report: Path) -> ReportData:
    """The report as `ReportData`: through `ncu_report` where it ships (with per-line counters),
    else through the CSV pages."""
    if tool.python_dir is not None:
        path = f"{tool.python_dir}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
        proc = subprocess.run(
            [sys.executable, "-c", _READER, str(report)],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": path},
        )
        if proc.returncode == 0:
            data = ReportData.model_validate_json(proc.stdout)
            if "rules-unavailable" in proc.stderr:
                data.rules = parse_details_csv(_page(tool, report, "details"))[1]
            return data
    kernels = parse_raw_csv(_page(tool, report, "raw"))
    if not kernels:
        raise NcuError(f"cannot read {report}")
    data = kernels[0]
    section_metrics, rules = parse_details_csv(_page(tool, report, "details"))
    data.metrics.update(section_metrics)
    data.rules = rules
    return data


def _page(tool: NcuTool, report: Path, page: str) -> str:
    cmd = [str(tool.path), "-i", str(report), "--csv", "--page", page, "--print-units", "base"]
    return subprocess.run(cmd, capture_output=True, text=True).stdout


# Runs in a subprocess with ncu's own Python module on the path (it is a compiled extension built
# for the Python it ships with; a crash there must not take the caller down).
_READER = r"""
import json, sys
import ncu_report
ctx = ncu_report.load_report(sys.argv[1])
action = ctx.range_by_idx(0).action_by_idx(0)
metrics, per_pc = {}, {}
wanted = set(%r)
for name in action.metric_names():
    m = action.metric_by_name(name)
    if m is None:
        continue
    try:
        instances = m.num_instances() if m.has_correlation_ids() else 0
    except Exception:
        instances = 0
    if instances and (name in wanted or name.startswith(%r)):
        ids = m.correlation_ids()
        for i in range(instances):
            v = m.as_double(i)
            if v:
                per_pc.setdefault(ids.as_uint64(i), {})[name] = v
    v = m.value()
    metrics[name] = {"value": v if isinstance(v, (int, float, str)) or v is None else str(v), "unit": m.unit() or ""}
pcs = []
for pc, counters in sorted(per_pc.items()):
    info = action.source_info(pc)
    pcs.append({"pc": pc, "file": info.file_name() if info else None, "line": info.line() if info else None, "counters": counters})
rules = []
try:
  for r in action.rule_results_as_dicts():
    for msg in r.get("rule_messages", []) or [{}]:
        speed = r.get("speedup_estimation") or {}
        rules.append({"section": str(r.get("section_identifier", "")), "name": str(r.get("rule_identifier", r.get("name", ""))),
                      "type": str(msg.get("type", "")).replace("MsgType.", "").replace("MSG_", "")[:3],
                      "message": str(msg.get("message", "")), "speedup_type": str(speed.get("type")) if speed else None,
                      "estimated_speedup_pct": float(speed["speedup"]) if speed.get("speedup") is not None else None})
except Exception as e:  # the dict layout is not documented as stable: fall back to the CSV page
  rules = None
  print("rules-unavailable:", e, file=sys.stderr)
print(json.dumps({"kernel": action.name(), "metrics": metrics, "rules": rules or [], "per_pc": pcs}))
""" % (PER_PC_METRICS, STALL_PREFIX)  # noqa: UP031 (the program's own braces stay as they are)
