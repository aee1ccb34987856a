"""`optiml optimize` of one fixture three ways — here (`local`), through `optiml worker` over SSH on
loopback, and on a Ray cluster started here — and what each found and took, as JSON.

    python3 benchmarks/remote_search.py --sshd DIR/usr/sbin/sshd --out remote-search.json \
        [--fixture fixtures/softmax.cu --kernel softmax_rows --budget 8 --seconds 60]

The SSH leg starts the given `sshd` on 127.0.0.1 (a free port) as the current user (root on a
GPU machine), with a host key and a user key generated in a temporary folder, known_hosts holding
that host key (checked, as always) and an ssh config naming the user key; the remote command is
this Python's `optiml worker` with PATH and PYTHONPATH set, so the machine needs no install.

A GPU machine without OpenSSH gets one from packages unpacked into a folder (no root install):

    apt-get download openssh-server openssh-client openssh-sftp-server libwrap0 \
        libcrypt1 libssl3 zlib1g   # what `ldd DIR/usr/sbin/sshd` says is missing
    for f in *.deb; do dpkg -x "$f" DIR; done
    LD_LIBRARY_PATH=DIR/usr/lib/x86_64-linux-gnu:DIR/lib/x86_64-linux-gnu (if ldd needs it)

The Ray leg needs `pip install 'optiml[ray]'`. A leg that fails is recorded with its error line;
the others still run. Each winner is its transformation path (the edits' summaries) and its
confirmed time; `same_winner` says whether every leg's path is the same; `ratio` is the leg's wall
time over the local one's.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.sshd import Sshd, worker_command  # noqa: E402


def run(executor: str, args, out: Path, env: dict[str, str]) -> dict:
    cmd = [sys.executable, "-m", "optiml.cli", "optimize", str(args.fixture), "-k", args.kernel]
    cmd += ["--budget", str(args.budget), "--time", str(args.seconds), "--json"]
    cmd += ["--executor", executor, "--out", str(out)]
    start = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.seconds * 10)
    wall = time.perf_counter() - start
    leg = {"executor": executor.split("@")[-1], "wall_s": round(wall, 2), "exit": p.returncode}
    if p.returncode != 0:
        leg["error"] = (p.stderr.strip().splitlines() or [""])[-1]
        return leg
    t = json.loads(p.stdout)
    nodes = {n["id"]: n for n in t["nodes"]}
    path, node = [], nodes.get(t["winner"])
    while node is not None and node.get("edit"):
        path.append(node["edit"]["summary"])
        node = nodes.get(node["parent"])
    found = next((c for c in t["confirmed"] if c["node"] == t["winner"]), None)
    leg.update(
        winner=path[::-1] if t["winner"] is not None else None,
        winner_ms=found["candidate_ms"] if found else None,
        speedup=found["speedup"] if found else None,
        input_ms=t["baseline"].get("candidate_ms"),
        evaluations=t["evaluations"],
        device=t.get("device"),
        outcome=t["outcome"],
    )
    return leg


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sshd", type=Path, required=True, help="the sshd binary to start")
    ap.add_argument("--fixture", type=Path, default=ROOT / "fixtures" / "softmax.cu")
    ap.add_argument("--kernel", default="softmax_rows")
    ap.add_argument("--budget", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    os.environ.setdefault("OPTIML_CACHE_DIR", tempfile.mkdtemp(prefix="optiml-remote-bench-"))
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path, "RAY_USAGE_STATS_ENABLED": "0"}
    legs = []
    with tempfile.TemporaryDirectory(prefix="optiml-remote-") as tmp:
        tmp = Path(tmp)
        legs.append(run("local", args, tmp / "local", env))
        import tests.sshd

        tests.sshd.SSHD = str(args.sshd)
        (tmp / "sshd").mkdir()
        sshd = Sshd(tmp / "sshd")
        try:
            ssh_env = sshd.env(
                OPTIML_REMOTE_COMMAND=worker_command(PATH=os.environ.get("PATH", "")),
                PYTHONPATH=path,
                RAY_USAGE_STATS_ENABLED="0",
            )
            legs.append(run(sshd.url, args, tmp / "ssh", ssh_env))
        finally:
            sshd.stop()
        legs.append(run("ray", args, tmp / "ray", env))
    local = legs[0]["wall_s"]
    for leg in legs:
        leg["ratio_to_local"] = round(leg["wall_s"] / local, 3) if local else None
    versions = {"python": platform.python_version()}
    for name in ("ray", "asyncssh"):
        try:
            versions[name] = __import__(name).__version__
        except ImportError:
            versions[name] = None
    nvcc = subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout
    versions["nvcc"] = next((w for w in nvcc.split() if w.startswith("V")), None)
    versions["sshd"] = subprocess.run(
        [str(args.sshd), "-V"], capture_output=True, text=True
    ).stderr.strip()
    record = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "fixture": str(
            args.fixture.relative_to(ROOT) if args.fixture.is_absolute() else args.fixture
        ),
        "kernel": args.kernel,
        "budget": args.budget,
        "seconds": args.seconds,
        "versions": versions,
        "legs": legs,
        # the same edits to the same kernel on every leg (each leg's confirmed winner)
        "same_winner": len({json.dumps(leg.get("winner")) for leg in legs}) == 1
        and legs[0].get("winner") is not None,
    }
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record, indent=1))
    return 0 if all(leg["exit"] == 0 for leg in legs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
