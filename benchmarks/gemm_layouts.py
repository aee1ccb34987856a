"""The GEMM schedules' first proposals (contraction_tiling, or gemm_tiling where it matches the
text) against cuBLAS (through PyTorch, TF32 off): fp32 GEMM in
the four layouts (NN, NT, TN, TT), the fp32 GEMM with a fused bias against torch's matmul + bias,
and bf16 GEMM (fp32 accumulation) in the four layouts, at 4096^3 and at one size that is not a
multiple of any tile (4000 x 3000 x 1000). Each proposal is measured as the search measures a
candidate (compiled, checked at every size with 2 seeds, the first size timed interleaved with the
naive input); torch is timed with an L2 flush before each call, median of 50
(torch_baselines.timed).

    python3 benchmarks/gemm_layouts.py --out FILE.json [--proposals 2]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402
from torch_baselines import rand, timed  # noqa: E402

from optiml.cuda.source import SourceFile  # noqa: E402
from optiml.executors import LocalExecutor  # noqa: E402
from optiml.executors.base import Job  # noqa: E402
from optiml.harness.nvcc import find_toolkit  # noqa: E402
from optiml.search.catalog import Context, by_name  # noqa: E402
from optiml.search.optimize import OptimizeOptions  # noqa: E402
from optiml.search.problem import ProblemOptions, measure  # noqa: E402
from optiml.search.variant import Variant  # noqa: E402
from optiml.spec import parse_spec  # noqa: E402

LAYOUTS = ["NN", "NT", "TN", "TT"]
SIZES = [(4096, 4096, 4096), (4000, 3000, 1000)]


def _operands(layout: str) -> tuple[str, str]:
    a = "A[(size_t)row * K + k]" if layout[0] == "N" else "A[(size_t)k * M + row]"
    b = "B[(size_t)k * N + col]" if layout[1] == "N" else "B[(size_t)col * K + k]"
    return a, b


def kernel(layout: str, dtype: str, bias: bool, size: tuple[int, int, int]) -> str:
    """A naive GEMM in `layout` as a user writes it (2-D launch, a thread per output), the sum
    in fp32 from `float` or `bfloat16` operands, optionally seeded with a bias per column."""
    m, n, k = size
    ctype, load = ("float", "{}") if dtype == "float" else ("__nv_bfloat16", "__bfloat162float({})")
    a, b = _operands(layout)
    small = "(300, 200, 100)" if size[0] % 16 == 0 else "(256, 128, 64)"
    return f"""#include <cuda_bf16.h>
/* @optiml
 *   args:   A: in {dtype}[M * K], B: in {dtype}[K * N], C: out float[M * N]{", bias: in float[N]" if bias else ""}
 *   launch: grid = (cdiv(N, 16), cdiv(M, 16)), block = (16, 16)
 *   sizes:  M, N, K = ({m}, {n}, {k}), {small}
 *   tol:    rtol = 1e-3, atol = 1e-3
 */
__global__ void gemm(const {ctype}* A, const {ctype}* B, float* C{", const float* bias" if bias else ""},
                     int M, int N, int K)
{{
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    int row = blockIdx.y * blockDim.y + threadIdx.y;
    if (row < M && col < N) {{
        float acc = {"bias[col]" if bias else "0.0f"};
        for (int k = 0; k < K; ++k) acc += {load.format(a)} * {load.format(b)};
        C[(size_t)row * N + col] = acc;
    }}
}}
"""


def cublas_ms(layout: str, dtype: str, bias: bool, size: tuple[int, int, int]) -> float:
    m, n, k = size
    t = torch.float32 if dtype == "float" else torch.bfloat16
    a = rand(m, k, dtype=t) if layout[0] == "N" else rand(k, m, dtype=t).t()
    b = rand(k, n, dtype=t) if layout[1] == "N" else rand(n, k, dtype=t).t()
    if bias:
        v = rand(n)
        return timed(lambda: torch.matmul(a, b) + v)
    return timed(lambda: torch.matmul(a, b))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--proposals", type=int, default=2, help="proposals measured per kernel")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    cases = [(lay, "float", False) for lay in LAYOUTS] + [("NT", "float", True)]
    cases += [(lay, "bfloat16", False) for lay in LAYOUTS]
    opts = ProblemOptions(eval=OptimizeOptions().search_eval, profile=False)
    rows = []

    async def run() -> None:
        executor = LocalExecutor()
        try:
            for size in SIZES:
                for layout, dtype, bias in cases:
                    text = kernel(layout, dtype, bias, size)
                    path = str(ROOT / "benchmarks" / "gemm.cu")
                    source = SourceFile(text, path)
                    k = source.kernel("gemm")
                    spec = parse_spec(source, k)
                    ctx = Context.of(Variant(text), path, "gemm")
                    # the transformation that applies: gemm_tiling where it matches the
                    # text (its data-parallel configs: stream-K keeps state across launches)
                    name = "contraction_tiling"
                    proposals = by_name(name).propose(ctx)
                    if not proposals:
                        name = "gemm_tiling"
                        proposals = [
                            p for p in by_name(name).propose(ctx) if "stream_k" not in p.params
                        ]
                    proposals = proposals[: args.proposals]
                    ref = cublas_ms(layout, dtype, bias, size)
                    for p in proposals:
                        job = Job(source, k, spec, candidate=SourceFile(p.variant.text, path))
                        r = await measure(executor, job, opts)
                        ms = r.candidate_ms
                        rows.append(
                            {
                                "size": size,
                                "layout": layout,
                                "dtype": dtype,
                                "bias": bias,
                                "transformation": name,
                                "config": p.params,
                                "status": r.status,
                                "ms": ms,
                                "naive_ms": r.reference_ms,
                                "torch_ms": ref,
                                "torch": "matmul + bias" if bias else "matmul",
                                "vs_torch": ms / ref if ms else None,
                                "message": r.message,
                            }
                        )
                        print(json.dumps(rows[-1]), flush=True)
        finally:
            await executor.close()

    asyncio.run(run())
    report = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_properties(0).name,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nvcc": find_toolkit().version,
        "tf32": False,
        "method": "candidates: the search's measure (interleaved with the naive input); torch: "
        "CUDA events, L2 flush before each call, median of 50",
        "rows": rows,
    }
    args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
