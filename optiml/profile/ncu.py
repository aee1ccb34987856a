"""Nsight Compute: running it on one kernel of an evaluation, and reading its report back into plain
data (`ReportData`: metrics by name, rule results, per-instruction counters with their source line).

Two readers give the same `ReportData`: the `ncu_report` Python module that ships with Nsight
Compute (it has the per-PC source correlation that per-line hotspots need), and the CSV pages of
`ncu -i` (`raw` and `details`), which need nothing but the ncu binary.
"""

from __future__ import annotations

import atexit
import csv
import io
import json
import os
import re
import select
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, Field

from optiml.errors import ExitCode, NcuMissing, OptimlError
from optiml.harness import procs

# The sections whose figures the diagnosis reads; the full set collects them whole, with their rules.
SEARCH_SECTIONS = (
    "SpeedOfLight",
    "MemoryWorkloadAnalysis",
    "Occupancy",
    "LaunchStats",
    "WarpStateStats",
    "SchedulerStats",
)
# The full set adds per-instruction counters (per-line hotspots) and the instruction mix: several
# more replay passes and the SASS patching that source counters need, so it is for final reports.
FULL_EXTRA = (
    "SourceCounters",
    "ComputeWorkloadAnalysis",
    "InstructionStats",
    "MemoryWorkloadAnalysis_Tables",
)
# What the diagnosis needs beyond the sections: sector and request counts of each kind of access,
# shared-memory conflicts, local-memory traffic and FLOP counts.
DIAGNOSIS_METRICS = tuple(
    [f"l1tex__t_sectors_pipe_lsu_mem_global_op_{op}.sum" for op in ("ld", "st", "red", "atom")]
    + [f"l1tex__t_requests_pipe_lsu_mem_global_op_{op}.sum" for op in ("ld", "st")]
    + [f"l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_{op}.sum" for op in ("ld", "st")]
    + [f"l1tex__data_pipe_lsu_wavefronts_mem_shared_op_{op}.sum" for op in ("ld", "st")]
    + [f"l1tex__t_sectors_pipe_lsu_mem_local_op_{op}.sum" for op in ("ld", "st")]
    + ["dram__bytes_read.sum", "dram__bytes_write.sum"]
)
# FLOP counts (the roofline's intensity and achieved FLOP rate): SASS-patched instruction counters,
# a replay pass of their own in which the kernel runs instrumented, so only the full set collects
# them; the search's reward and diagnosis do without.
FLOP_METRICS = tuple(
    f"smsp__sass_thread_inst_executed_op_{op}_pred_on.sum"
    for op in ("fadd", "fmul", "ffma", "dadd", "dmul", "dfma")
)
# The search set: of those sections, only the metrics the diagnosis reads, named one by one, no
# rules evaluated and no FLOP counts: on an H200, 15 replay passes where the sections take 19, and
# 2.3 to 2.9 s per profile of a compiled candidate (benchmarks/profile.py ->
# benchmarks/results/profile-h200.json; each way's cost: benchmarks/ncu_collection.py), with the
# same bottleneck named as the full set on every fixture. What it lacks against the full set: ncu's
# rule results, per-line hotspots, the pipe breakdown of compute, the roofline's FLOP counts.
SEARCH_METRICS = (
    "gpu__time_duration.sum",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
    "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
    "l1tex__throughput.avg.pct_of_peak_sustained_active",
    "lts__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm__cycles_elapsed.avg",
    "sm__cycles_elapsed.avg.per_second",
    "smsp__cycles_elapsed.avg",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    "sm__maximum_warps_per_active_cycle_pct",
    "launch__occupancy_limit_blocks",
    "launch__occupancy_limit_registers",
    "launch__occupancy_limit_shared_mem",
    "launch__occupancy_limit_warps",
    "launch__registers_per_thread",
    "launch__block_size",
    "launch__grid_size",
    "device__attribute_multiprocessor_count",
    r"regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio",
)


def collection_args(full: bool) -> list[str]:
    """What ncu collects: the full set's sections (with their rules) or the search set's metrics."""
    if full:
        sections = [a for s in (*SEARCH_SECTIONS, *FULL_EXTRA) for a in ("--section", s)]
        return [*sections, "--metrics", ",".join((*DIAGNOSIS_METRICS, *FLOP_METRICS))]
    return ["--metrics", ",".join((*SEARCH_METRICS, *DIAGNOSIS_METRICS))]


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
    """Nsight Compute: $OPTIML_NCU where set (and nothing else then, as $OPTIML_NVCC for nvcc), else
    on PATH, in /opt/nvidia/nsight-compute or in the CUDA toolkit; `NcuMissing` if there is none."""
    chosen = os.environ.get("OPTIML_NCU")
    if chosen and not Path(chosen).is_file():
        raise NcuMissing(f"ncu (Nsight Compute) not found: OPTIML_NCU={chosen} is not a file")
    candidates = [chosen, shutil.which("ncu")]
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
    return NcuTool(path, version, _report_module_dir(path, version))


def _report_module_dir(path: Path, version: str) -> Path | None:
    """Where `ncu_report.py` ships: beside the real ncu binary, or in the Nsight Compute install of
    the same version (`ncu` on PATH is often a wrapper script in the CUDA toolkit's bin/)."""
    places = [path.resolve().parent / "extras" / "python"]
    for root in (
        Path("/opt/nvidia/nsight-compute"),
        Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")),
    ):
        if root.is_dir():
            installs = sorted(root.glob("*/extras/python"), reverse=True)
            places += [d for d in installs if version.startswith(d.parent.name.split("-")[-1])]
            places += installs
    return next((d for d in places if (d / "ncu_report.py").exists()), None)


@dataclass
class NcuRun:
    report: Path
    seconds: float
    command: list[str]
    log: str

    @property
    def passes(self) -> int | None:
        return replay_passes(self.log)


def replay_passes(log: str) -> int | None:
    """The replay passes ncu reports for the kernel (`==PROF== Profiling "k": ... - 16 passes`)."""
    m = re.search(r"- (\d+) pass(?:es)?\b", log)
    return int(m[1]) if m else None


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
    cmd = [
        str(tool.path),
        # The runner launches the kernel itself: no child process to follow.
        "--target-processes", "application-only",
        "--kernel-name-base", "mangled",
        "--kernel-name", f"regex:^{mangled}$",
        "--launch-count", "1",
        "--clock-control", clock_control,
        *(["--import-source", "yes"] if full else []),  # for source counters, of the full set
        *collection_args(full),
        "-f", "-o", str(out),
        *program,
    ]  # fmt: skip
    start = time.perf_counter()
    # ncu and the runner it starts are one process group, killed whole at the limit or a cancel
    p = procs.run(cmd, timeout=timeout_s, env={**os.environ, **(env or {})})
    if p.returncode is None:
        raise NcuError(f"ncu did not finish within {timeout_s:g} s")
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


def read_report(tool: NcuTool, report: Path, *, source_lines: bool = False) -> ReportData:
    """The report as `ReportData`: through `ncu_report` where it ships, else through the CSV pages
    (read concurrently). With `source_lines`, per-line counters come from the source page
    (`--print-source cuda,sass`), whose CUDA-line rows carry each line's summed counters."""
    with ThreadPoolExecutor(max_workers=3) as pool:
        source_page = (
            pool.submit(_page, tool, report, "source", "--print-source", "cuda,sass")
            if source_lines
            else None
        )
        read = _READER_PROCESS.read(tool.python_dir, report) if tool.python_dir else None
        data = read[0] if read else None
        if read and not read[1]:
            data.rules = parse_details_csv(_page(tool, report, "details"))[1]
        if data is None:
            raw = pool.submit(_page, tool, report, "raw")
            details = pool.submit(_page, tool, report, "details")
            kernels = parse_raw_csv(raw.result())
            if not kernels:
                raise NcuError(f"cannot read {report}")
            data = kernels[0]
            section_metrics, rules = parse_details_csv(details.result())
            data.metrics.update(section_metrics)
            data.rules = rules
        if source_page is not None and not data.per_pc:
            data.per_pc = parse_source_csv(source_page.result())
    return data


# Columns of the source page and the counter names `PcCounters` use for them.
_SOURCE_COLUMNS = {
    "Instructions Executed": "inst_executed",
    "L2 Theoretical Sectors Global": "memory_l2_theoretical_sectors_global",
    "L2 Theoretical Sectors Global Ideal": "memory_l2_theoretical_sectors_global_ideal",
    "L2 Theoretical Sectors Global Excessive": "memory_l2_theoretical_sectors_global_excessive",
}


def parse_source_csv(text: str) -> list[PcCounters]:
    """`ncu -i R --page source --csv --print-source cuda,sass`: a "File Path" row per file, a header,
    then a row per CUDA line (its number in the first column, its counters summed over its SASS)
    followed by that line's SASS rows (first column empty). One `PcCounters` per CUDA line."""
    out: list[PcCounters] = []
    file: str | None = None
    header: list[str] | None = None
    for row in _csv_rows(text):
        if not row:
            continue
        if row[0] == "File Path" and len(row) > 1:
            file, header = row[1], None
            continue
        if row[0] == "Line No":
            header = row
            continue
        if header is None or not row[0].strip().isdigit():
            continue
        counters: dict[str, float] = {}
        for name, value in zip(header, row, strict=False):
            number = parse_number(value)
            if not isinstance(number, float) or not number:
                continue
            if name in _SOURCE_COLUMNS:
                counters[_SOURCE_COLUMNS[name]] = number
            elif name.startswith("stall_") and "(Not Issued)" not in name:
                counters[STALL_PREFIX + _STALL_NAMES.get(name[6:], name[6:])] = number
        if counters:
            out.append(PcCounters(pc=0, file=file, line=int(row[0]), counters=counters))
    return out


# The source page's short stall names, as the sampling metrics spell them.
_STALL_NAMES = {"long_sb": "long_scoreboard", "short_sb": "short_scoreboard", "lg": "lg_throttle"}


def _page(tool: NcuTool, report: Path, page: str, *extra: str) -> str:
    cmd = [
        str(tool.path),
        "-i",
        str(report),
        "--csv",
        "--page",
        page,
        "--print-units",
        "base",
        *extra,
    ]
    return subprocess.run(cmd, capture_output=True, text=True).stdout


# Runs in a subprocess with ncu's own Python module on the path (it is a compiled extension built
# for the Python it ships with; a crash there must not take the caller down).
_READER = r"""
import json, sys
# Replies go to stdout, one JSON line each; what the module itself prints goes to stderr.
replies, sys.stdout = sys.stdout, sys.stderr
import ncu_report

def read(path):
    ctx = ncu_report.load_report(path)
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
    except Exception:  # the dict layout is not documented as stable: the CSV page has them
        rules = None
    return {"kernel": action.name(), "metrics": metrics, "rules": rules, "per_pc": pcs}

# One report path per line in, one JSON line out (the report, or why it could not be read).
for line in sys.stdin:
    try:
        out = read(line.rstrip("\n"))
    except Exception as e:
        out = {"error": f"{type(e).__name__}: {e}"}
    replies.write(json.dumps(out) + "\n")
    replies.flush()
""" % (PER_PC_METRICS, STALL_PREFIX)  # noqa: UP031 (the program's own braces stay as they are)


class _ReaderProcess:
    """`_READER` kept running between reports: Python's start and the module's import are paid
    once, not per report (what a search pays per candidate). A report it cannot read, or a worker
    that dies or hangs, gives None (the caller falls back on the CSV pages) and the next read
    starts a fresh worker."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._dir: Path | None = None
        atexit.register(self.close)

    def read(
        self, python_dir: Path, report: Path, timeout_s: float = 120
    ) -> tuple[ReportData, bool] | None:
        """The report, and whether its rule results could be read; None if it could not."""
        with self._lock:
            if self._proc is None or self._proc.poll() is not None or self._dir != python_dir:
                self.close()
                path = f"{python_dir}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
                self._proc = subprocess.Popen(
                    [sys.executable, "-c", _READER],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                    text=True,
                    env={**os.environ, "PYTHONPATH": path},
                )
                self._dir = python_dir
            proc = self._proc
            try:
                proc.stdin.write(f"{report}\n")
                proc.stdin.flush()
                ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
                line = proc.stdout.readline() if ready else ""
            except OSError:
                line = ""
            try:
                out = json.loads(line) if line else None
            except json.JSONDecodeError:
                out = None
            if out is None:  # it died, hung or answered out of turn: the next read starts another
                self.close()
                return None
        if "error" in out:
            return None
        rules = out.pop("rules")  # None: unreadable here (the caller reads the CSV page's)
        return ReportData.model_validate(out | {"rules": rules or []}), rules is not None

    def close(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None


_READER_PROCESS = _ReaderProcess()
