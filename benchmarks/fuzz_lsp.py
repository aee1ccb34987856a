"""Fuzzing the language server over stdio: thousands of seeded message sequences (valid requests
and notifications, malformed JSON-RPC, garbage frames; tests/server/fuzz.py) against real `python
-m server` processes, each sequence followed by a probe that the server still answers. Every
failure is recorded: a traceback or exception repr in anything the server sent, an unexpected
exception answered or shown, a multi-line error, a request left unanswered (hang), no answer to
the probe (silent), an exit nobody asked for (crash), a wrong exit code, a malformed frame.

The same seed and count give the same sequences (with the same hypothesis; no example database).
Compiles use the machine's nvcc, into a compile cache of their own, unless `--no-nvcc` (then
every compile fails at once with "nvcc not found", shown once per server).

    python3 benchmarks/fuzz_lsp.py --sequences 2000 --seed 0 --out benchmarks/results/fuzz-lsp.json
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hypothesis import HealthCheck, Phase, given, seed, settings  # noqa: E402

from tests.server.fuzz import (  # noqa: E402
    ANSWER_TIMEOUT,
    EXIT_TIMEOUT,
    PROBE_TIMEOUT,
    Fuzzer,
    Sequence,
    sequences,
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sequences", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--reuse", type=int, default=8, help="sequences per server process, at most")
    ap.add_argument("--no-nvcc", action="store_true", help="point OPTIML_NVCC at no file")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()

    cache = tempfile.TemporaryDirectory(prefix="optiml-fuzz-cache-")
    env = {"OPTIML_CACHE_DIR": cache.name}
    if args.no_nvcc:
        env["OPTIML_NVCC"] = "/nonexistent/nvcc"
    fuzzer = Fuzzer(env=env, reuse=args.reuse)
    outcomes: collections.Counter[str] = collections.Counter()
    kinds: collections.Counter[str] = collections.Counter()
    failures: list[dict] = []
    totals = {"sequences": 0, "messages": 0, "requests_answered": 0, "ended_with_exit": 0}
    outcomes.update(ok=0, failed=0)
    slowest = {"ms": 0.0, "request": "", "sequence": -1}
    started, date = time.monotonic(), dt.datetime.now(dt.UTC)

    @seed(args.seed)
    @settings(
        max_examples=args.sequences,
        phases=[Phase.generate],
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(sequence=sequences())
    def fuzz(sequence: Sequence) -> None:
        index = totals["sequences"]
        outcome = fuzzer.run(sequence)
        totals["sequences"] += 1
        totals["messages"] += outcome.messages
        totals["requests_answered"] += outcome.answered
        if outcome.slowest_ms > slowest["ms"]:
            slowest.update(ms=round(outcome.slowest_ms, 1), request=outcome.slowest, sequence=index)
        outcomes["failed" if outcome.failures else "ok"] += 1
        totals["ended_with_exit"] += outcome.exited
        for f in outcome.failures:
            kinds[f.kind] += 1
            failures.append({"sequence": index, **f.as_dict()})
        if index % 100 == 99:
            print(
                f"{index + 1} sequences, {totals['messages']} messages, "
                f"{len(failures)} failures, {time.monotonic() - started:.0f} s",
                flush=True,
            )

    try:
        fuzz()
    finally:
        fuzzer.close()
        cache.cleanup()
    wall = time.monotonic() - started
    nvcc = "none (OPTIML_NVCC=/nonexistent/nvcc)"
    if not args.no_nvcc:
        found = subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout
        nvcc = found.strip().splitlines()[-1] if found else "none"
    report = {
        "date": date.isoformat(timespec="seconds"),  # when it started
        "machine": {"uname": " ".join(filter(None, platform.uname())), "cpus": os.cpu_count()},
        "python": platform.python_version(),
        "pygls": version("pygls"),
        "lsprotocol": version("lsprotocol"),
        "hypothesis": version("hypothesis"),
        "nvcc": nvcc,
        "seed": args.seed,
        "generator": "tests/server/fuzz.py sequences()",
        "limits_s": {"answers": ANSWER_TIMEOUT, "probe": PROBE_TIMEOUT, "exit": EXIT_TIMEOUT},
        "sequences": totals["sequences"],
        "messages": totals["messages"],
        "requests_answered": totals["requests_answered"],
        "ended_with_exit": totals["ended_with_exit"],
        "server_processes": fuzzer.restarts,
        "outcomes": dict(outcomes),
        "failure_kinds": dict(kinds),
        "slowest_answer": slowest,
        # logged, never sent: pygls logs a request's InvalidParams with its traceback
        "tracebacks_in_server_logs": dict(fuzzer.tracebacks_logged.most_common()),
        "wall_s": round(wall, 1),
        "failures": failures,
    }
    print(
        f"{totals['sequences']} sequences, {totals['messages']} messages, "
        f"{totals['requests_answered']} requests answered, {fuzzer.restarts} server processes, "
        f"{wall:.0f} s"
    )
    print(f"outcomes: {dict(outcomes)}; failures by kind: {dict(kinds) or 'none'}")
    print(
        f"slowest answer: {slowest['ms']} ms ({slowest['request']}, sequence {slowest['sequence']})"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
