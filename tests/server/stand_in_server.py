"""The language server with the stand-in executor of tests/search/test_optimize.py, for tests and
benchmarks without a GPU: jobs compile every candidate for real (nvcc) and a cost model stands in
for the GPU. Its full profile also names hotspots, as Nsight Compute's source page would: the
kernel's last line that indexes memory (62 % of the stall samples, long_scoreboard, 58M excess L2
sectors) and its first statement (12 %).

    python tests/server/stand_in_server.py [--broken] [--tcp PORT]

`--broken`: every evaluation raises, as a bug in the library would."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # `tests` and `server`, from anywhere

from optiml.executors import Job  # noqa: E402
from optiml.profile.model import Hotspot, Profile, Stall  # noqa: E402
from server import main  # noqa: E402
from tests.search.test_optimize import StandInExecutor  # noqa: E402


class ProfilingStandIn(StandInExecutor):
    async def profile(self, job: Job, *, full: bool = False) -> Profile:
        found = await super().profile(job, full=full)
        if not full:
            return found
        source, kernel, _ = job.target
        first, last = kernel.body_span.start_point[0], kernel.body_span.end_point[0]
        lines = source.text.split("\n")
        body = [i for i in range(first + 1, last) if lines[i].strip() not in ("", "{", "}")]
        memory = [i for i in body if "[" in lines[i]]
        if not body or not memory:
            return found
        found.hotspots = [
            Hotspot(
                file=source.path,
                line=memory[-1] + 1,
                stall_samples=620,
                instructions=40,
                excessive_sectors=58e6,
                top_stall="long_scoreboard",
                share=0.62,
            ),
            Hotspot(
                file=source.path, line=body[0] + 1, stall_samples=120, top_stall="wait", share=0.12
            ),
        ]
        found.stalls = [
            Stall(reason="long_scoreboard", cycles_per_issue=6.2, share=0.62),
            Stall(reason="wait", cycles_per_issue=1.2, share=0.12),
        ]
        return found


class BrokenStandIn(ProfilingStandIn):
    async def evaluate(self, job, options):
        raise RuntimeError("the stand-in GPU fell over")


def stand_in(settings) -> ProfilingStandIn:
    return ProfilingStandIn()


def broken_stand_in(settings) -> BrokenStandIn:
    return BrokenStandIn()


if __name__ == "__main__":
    # module-level factories: an optimize job's process gets them by name
    factory = broken_stand_in if "--broken" in sys.argv else stand_in
    argv = [a for a in sys.argv[1:] if a != "--broken"]
    raise SystemExit(main(argv, executor_factory=factory))
