"""PyTorch's time for the wild fixture linear_bias.cu (out = inp @ weight^T + bias, fp32, TF32
off) at its first size, timed as the harness times kernels (torch_baselines.timed): F.linear (one
cuBLAS GEMM with the bias fused where cuBLAS can) and torch.mm then the bias added.

    python3 benchmarks/linear_bias.py --out DIR      # DIR/linear-bias-torch.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from torch_baselines import rand, timed  # noqa: E402

BT, C, OC = 4096, 768, 3072


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    inp, weight, bias = rand(BT, C), rand(OC, C), rand(OC)
    out = torch.empty(BT, OC, device="cuda")
    linear_ms = timed(lambda: F.linear(inp, weight, bias), reps=50)
    mm_ms = timed(lambda: torch.add(torch.mm(inp, weight.t()), bias, out=out), reps=50)
    flops = 2 * BT * C * OC
    result = {
        "device": torch.cuda.get_device_properties(0).name,
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "sizes": {"BT": BT, "C": C, "OC": OC},
        "tf32": False,
        "method": "CUDA events, L2 flush (2x L2) before each call, median of 50",
        "F.linear": {"ms": linear_ms, "tflops": flops / linear_ms / 1e9},
        "mm_then_bias": {"ms": mm_ms, "tflops": flops / mm_ms / 1e9},
    }
    print(json.dumps(result, indent=1))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "linear-bias-torch.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
