"""The profiler's benchmark (on a GPU machine): every fixture profiled with the search set three
times (what the search pays per candidate, the median run: wall time, ncu's share, reading's
share, replay passes; the candidate is compiled first, as the search has compiled and evaluated a
candidate before it profiles it) and with the full set (the bottleneck it names against the expected one, the hotspot
line, its cost); and ncu's fixed start-up measured alone.

    python3 benchmarks/profile_fixtures.py --out DIR
Writes DIR/profile-h200.json and DIR/reports/<fixture>-<kernel>.json (the report data).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from optiml.harness.build import build_kernel, runner_binary  # noqa: E402
from optiml.harness.evaluate import launch_once  # noqa: E402
from optiml.harness.gpu import default_arch, local_gpus  # noqa: E402
from optiml.profile.ncu import find_ncu  # noqa: E402
from optiml.profile.run import profile_kernel  # noqa: E402
from optiml.spec import load  # noqa: E402

GROUPS = {"l1_shared": "l1_l2", "l2": "l1_l2"}
SEARCH_REPEATS = 3  # the search set's cost is the median of this many profiles


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument(
        "--only", nargs="*", default=None, help="fixture files to profile (default: every good one)"
    )
    args = ap.parse_args()
    (args.out / "reports").mkdir(parents=True, exist_ok=True)
    tool = find_ncu()
    entries = [
        e
        for e in tomllib.loads((ROOT / "fixtures" / "manifest.toml").read_text())["fixture"]
        if e["verdict"] == "ok"
    ]
    if args.only:
        entries = [e for e in entries if e["file"] in args.only]
    runner_binary()  # built once, before anything is timed
    fixed = fixed_cost(tool)
    # Those with a known bottleneck first: if time runs out, they are the ones measured.
    entries.sort(key=lambda e: "bottleneck" not in e)
    rows = []
    for e in entries:
        source, kernel, spec = load(ROOT / "fixtures" / e["file"], e["kernel"])
        stem = f"{Path(e['file']).stem}-{kernel.short_name}"
        try:
            # The search set, as the search runs it on every candidate, compiled by then (and
            # cached): what it costs.
            build_kernel(source, kernel, instantiation=spec.instantiation, arch=default_arch())
            runs = sorted(
                (profile_kernel(source, kernel, spec) for _ in range(SEARCH_REPEATS)),
                key=lambda q: q.wall_s,
            )
            quick = runs[len(runs) // 2]  # the median run
            # The full set, as a final report or `optiml profile` runs it: diagnosis and hotspots.
            p = profile_kernel(
                source, kernel, spec, full=True, save_report=args.out / "reports" / f"{stem}.json"
            )
        except Exception as ex:  # a benchmark reports a failure and goes on
            rows.append({"fixture": e["file"], "kernel": e["kernel"], "error": str(ex)})
            print(f"{stem:36} ERROR {ex}", flush=True)
            continue
        kind = GROUPS.get(p.bottleneck.kind, p.bottleneck.kind)
        by = "excessive_sectors" if p.bottleneck.kind == "uncoalesced" else "stall_samples"
        worst = max(p.hotspots, key=lambda h: getattr(h, by)).line if p.hotspots else None
        row = {
            "fixture": e["file"],
            "kernel": e["kernel"],
            "expected": e.get("bottleneck"),
            "got": kind,
            "search_set_got": GROUPS.get(quick.bottleneck.kind, quick.bottleneck.kind),
            "detail": p.bottleneck.detail,
            "right": e.get("bottleneck") in (None, kind),
            "explanation": p.bottleneck.explanation,
            "hotspot_expected": e.get("hotspot_line"),
            "hotspot": worst,
            "hotspot_right": e.get("hotspot_line") in (None, worst),
            "hotspots": [h.model_dump() for h in p.hotspots[:3]],
            "duration_ms": p.duration_ms,
            "dram_tbps": p.dram_tbps,
            "search_wall_s": round(quick.wall_s, 2),
            "search_walls_s": [round(q.wall_s, 2) for q in runs],
            "search_set_bottlenecks": sorted({q.bottleneck.kind for q in runs}),
            "search_ncu_s": round(quick.ncu_s, 2),
            "search_read_s": round(quick.read_s, 2),
            "search_passes": quick.passes,
            "full_passes": p.passes,
            "full_wall_s": round(p.wall_s, 2),
            "full_ncu_s": round(p.ncu_s, 2),
            "full_read_s": round(p.read_s, 2),
        }
        rows.append(row)
        out = args.out / "profile-h200.json"  # after every fixture, so a cut-off run keeps its rows
        out.write_text(json.dumps(summary(rows, len(entries), tool, fixed), indent=2) + "\n")
        print(
            f"{stem:36} expected {str(e.get('bottleneck')):14} got {kind:14} (search set: {row['search_set_got']}) hotspot {worst} (want {e.get('hotspot_line')})  search {quick.wall_s:4.2f} s (ncu {quick.ncu_s:4.2f}, {quick.passes} passes, read {quick.read_s:4.2f})  full {p.wall_s:5.2f} s",
            flush=True,
        )

    report = summary(rows, len(entries), tool, fixed)
    (args.out / "profile-h200.json").write_text(json.dumps(report, indent=2) + "\n")
    print(
        f"\nbottlenecks right: {report['bottlenecks_right']}; hotspots right: {report['hotspots_right']}; search-set profile wall max {report['max_search_wall_s']} s (median {report['median_search_wall_s']} s); full set max {report['max_full_wall_s']} s; ncu start-up {report['ncu_startup_s']} s"
    )


def fixed_cost(tool) -> tuple[float, float]:
    """The profile-only runner alone, and under ncu with a filter that profiles nothing (s)."""
    source, kernel, spec = load(ROOT / "fixtures" / "saxpy.cu", "saxpy")
    arch = default_arch()
    build = build_kernel(source, kernel, instantiation="", arch=arch)
    with tempfile.TemporaryDirectory() as tmp:
        program = launch_once(spec, spec.case(spec.sizes[0]), arch, build.path, Path(tmp))
        subprocess.run(program, capture_output=True)  # warm: driver, files, caches
        t0 = time.perf_counter()
        subprocess.run(program, capture_output=True)
        alone = time.perf_counter() - t0
        t0 = time.perf_counter()
        subprocess.run(
            [str(tool.path), "--kernel-name", "regex:^no_such_kernel$", *program],
            capture_output=True,
        )
        under_ncu = time.perf_counter() - t0
    return alone, under_ncu


def summary(rows: list[dict], planned: int, tool, fixed: tuple[float, float]) -> dict:
    alone, under_ncu = fixed
    ok = [r for r in rows if "got" in r]
    return {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "device": local_gpus()[0][0] if local_gpus() else None,
        "ncu": tool.version,
        "ncu_report_module": str(tool.python_dir) if tool.python_dir else None,
        "clock_control": "none",
        "fixtures_profiled": f"{len(rows)} of {planned}",
        "profiles": rows,
        "runner_alone_s": round(alone, 2),
        "runner_under_ncu_profiling_nothing_s": round(under_ncu, 2),
        "ncu_startup_s": round(under_ncu - alone, 2),
        "bottlenecks_right": f"{sum(r['right'] for r in ok)}/{len(ok)}",
        "hotspots_right": f"{sum(r['hotspot_right'] for r in ok)}/{len(ok)}",
        "search_wall_s_is": f"the median of {SEARCH_REPEATS} profiles of each fixture",
        "max_search_wall_s": max(r["search_wall_s"] for r in ok) if ok else None,
        "max_single_search_wall_s": max(max(r["search_walls_s"]) for r in ok) if ok else None,
        "median_search_wall_s": sorted(r["search_wall_s"] for r in ok)[len(ok) // 2]
        if ok
        else None,
        "max_full_wall_s": max(r["full_wall_s"] for r in ok) if ok else None,
    }


if __name__ == "__main__":
    main()
