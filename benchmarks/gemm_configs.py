"""Every register-blocked SGEMM configuration of gemm_tiling (and a few beyond it), with its
stream-K twin where the catalog makes one, on the naive SGEMM fixture, each measured as the
search measures a candidate (compiled, checked at every size with 2 seeds, the first size timed
interleaved with the input): what ranks the catalog's configs.

    python3 benchmarks/gemm_configs.py --out FILE.json
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from optiml.cuda.source import SourceFile  # noqa: E402
from optiml.executors import LocalExecutor  # noqa: E402
from optiml.executors.base import Job  # noqa: E402
from optiml.harness.gpu import local_gpus  # noqa: E402
from optiml.harness.nvcc import find_toolkit  # noqa: E402
from optiml.search.catalog import CATALOG, Context, gemm_tiling  # noqa: E402
from optiml.search.catalog._gemm import Config  # noqa: E402
from optiml.search.optimize import OptimizeOptions  # noqa: E402
from optiml.search.problem import ProblemOptions, measure  # noqa: E402
from optiml.search.variant import Variant  # noqa: E402
from optiml.spec import load  # noqa: E402

# Configurations the catalog does not propose, measured beside its own.
EXTRA = [
    Config(128, 128, 8, 4, 2, 4, 2),
    Config(128, 256, 8, 4, 2, 3, 1),
    Config(256, 128, 8, 4, 2, 2, 1),
    Config(128, 128, 8, 2, 2, 4, 2),
    Config(128, 128, 8, 2, 2, 2, 2),
]


def _in_catalog(params: dict, catalog: list[Config]) -> bool:
    """Whether the catalog proposes this config (a stream-K twin: of a config that has one)."""
    twin = params.get("stream_k") is not None
    config = {k: v for k, v in params.items() if k != "stream_k"}
    return any(config == c.params and (c.stream_k or not twin) for c in catalog)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    catalog = [c for c, _ in gemm_tiling.LARGE + gemm_tiling.SMALL]
    # every config with its stream-K twin, where its last wave is not whole
    configs = [replace(c, stream_k=True) for c in catalog + EXTRA]
    gemm_tiling.LARGE, gemm_tiling.SMALL = [(c, 1.0) for c in configs], []
    path = ROOT / "fixtures" / "sgemm.cu"
    source, kernel, spec = load(path, "sgemm_naive")
    ctx = Context.of(Variant(source.text), str(path), kernel.name)
    proposals = CATALOG["gemm_tiling"].propose(ctx)
    opts = ProblemOptions(eval=OptimizeOptions().search_eval, profile=False)

    async def run() -> list[dict]:
        executor = LocalExecutor()

        async def one(p) -> dict:
            job = Job(
                source,
                kernel,
                spec,
                candidate=SourceFile(p.variant.text, str(path)),
                flags=p.variant.flags,
            )
            m = await measure(executor, job, opts)
            return {
                "config": p.params,
                "in_catalog": _in_catalog(p.params, catalog),
                "status": m.status,
                "candidate_ms": m.candidate_ms,
                "input_ms": m.reference_ms,
                "message": m.message,
            }

        try:
            return await asyncio.gather(*[one(p) for p in proposals])
        finally:
            await executor.close()

    rows = sorted(asyncio.run(run()), key=lambda r: r["candidate_ms"] or float("inf"))
    gpus = local_gpus()
    report = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "device": gpus[0][0] if gpus else None,
        "nvcc": find_toolkit().version,
        "fixture": "sgemm.cu::sgemm_naive (4096^3 timed)",
        "rows": rows,
    }
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    for r in rows:
        print(
            json.dumps(r["config"]), r["status"], r["candidate_ms"] and round(r["candidate_ms"], 3)
        )


if __name__ == "__main__":
    main()
