"""What the memory-bound fixtures cost when written in PyTorch, and the device's ceilings, timed the
way the harness times kernels: CUDA events around each call, an L2 flush (twice the L2 size) before
each timed call, warm-up first, the median of many calls.

    python3 benchmarks/torch_baselines.py --out DIR
Writes DIR/torch-baselines.json: per fixture the PyTorch time, the bytes the operation must move
(each input read once, each output written once) and the bandwidth that gives; the device-to-device
copy bandwidth; cuBLAS fp32 SGEMM 4096^3 with TF32 off.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
from pathlib import Path

import torch
import torch.nn.functional as F


def timed(fn, reps: int = 50, warmup: int = 5) -> float:
    """Median milliseconds of `fn()`, each call after an L2 flush."""
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    flush = torch.empty(2 * l2 // 4, dtype=torch.float32, device="cuda")
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def rand(*shape, dtype=torch.float32):
    return torch.rand(*shape, device="cuda", dtype=torch.float32).mul_(2).sub_(1).to(dtype)


def cases():
    """(fixture file, kernel, label, bytes moved, callable) at each fixture's first size."""
    n = 1 << 26
    x, y = rand(n), rand(n)
    yield "saxpy.cu", "saxpy", "y.add_(x, alpha=a)", 12 * n, lambda: y.add_(x, alpha=2.5)
    a, b, c = rand(n), rand(n), torch.empty(n, device="cuda")
    yield (
        "multi_kernel_main.cu",
        "vec_add",
        "torch.add(a, b, out=c)",
        12 * n,
        lambda: torch.add(a, b, out=c),
    )
    d = rand(n)
    yield (
        "multi_kernel_main.cu",
        "clamp_inplace",
        "d.clamp_(-0.5, 0.5)",
        8 * n,
        lambda: d.clamp_(-0.5, 0.5),
    )
    ya = rand(n)
    yield (
        "templated.cu",
        "axpby",
        "y.mul_(beta).add_(x, alpha=alpha)",
        12 * n,
        lambda: ya.mul_(-0.5).add_(x, alpha=2.0),
    )
    rows = cols = 8192
    m_in, m_out = rand(rows, cols), torch.empty(rows, cols, device="cuda")
    beta = torch.tensor(-0.125, device="cuda")
    yield (
        "scale2d.cu",
        "scale2d",
        "torch.add(beta, in, alpha=alpha, out=out)",
        8 * rows * cols,
        lambda: torch.add(beta, m_in, alpha=0.75, out=m_out),
    )
    t_out = torch.empty(cols, rows, device="cuda")
    yield (
        "transpose.cu",
        "transpose_naive",
        "out.copy_(in.t())",
        8 * rows * cols,
        lambda: t_out.copy_(m_in.t()),
    )
    u_new = torch.empty(rows, cols, device="cuda")

    def jacobi():
        u = m_in
        u_new[1:-1, 1:-1] = 0.25 * (u[:-2, 1:-1] + u[2:, 1:-1] + u[1:-1, :-2] + u[1:-1, 2:])
        u_new[0], u_new[-1], u_new[:, 0], u_new[:, -1] = u[0], u[-1], u[:, 0], u[:, -1]

    yield "stencil2d.cu", "jacobi_step", "slices (interior + 4 edges)", 8 * rows * cols, jacobi
    weight = torch.tensor(
        [[0.0, 0.25, 0.0], [0.25, 0.0, 0.25], [0.0, 0.25, 0.0]], device="cuda"
    ).view(1, 1, 3, 3)

    def jacobi_conv():
        u = m_in
        u_new[1:-1, 1:-1] = F.conv2d(u.view(1, 1, rows, cols), weight)[0, 0]
        u_new[0], u_new[-1], u_new[:, 0], u_new[:, -1] = u[0], u[-1], u[:, 0], u[:, -1]

    yield "stencil2d.cu", "jacobi_step", "conv2d (interior) + 4 edges", 8 * rows * cols, jacobi_conv
    r, k = 32768, 1024
    s_in, s_out = rand(r, k), torch.empty(r, k, device="cuda")
    yield (
        "softmax.cu",
        "softmax_rows",
        "torch.softmax(x, 1, out=y)",
        8 * r * k,
        lambda: torch.softmax(s_in, 1, out=s_out),
    )
    gamma, beta_ln = rand(k), rand(k)
    yield (
        "layernorm.cu",
        "layernorm_forward",
        "F.layer_norm(x, (cols,), gamma, beta, 1e-5)",
        8 * r * k + 8 * k,
        lambda: F.layer_norm(s_in, (k,), gamma, beta_ln, 1e-5),
    )
    nr = 1 << 26
    xr = rand(nr)
    yield "reduce_sum.cu", "reduce_sum", "x.sum()", 4 * nr + 4, lambda: xr.sum()
    data = torch.randint(0, 256, (n,), device="cuda", dtype=torch.int32)
    yield (
        "histogram.cu",
        "histogram_global",
        "torch.bincount(data, minlength=256)",
        4 * n + 256 * 4,
        lambda: torch.bincount(data, minlength=256),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    props = torch.cuda.get_device_properties(0)
    rows = []
    for file, kernel, label, nbytes, fn in cases():
        ms = timed(fn)
        rows.append(
            {
                "fixture": file,
                "kernel": kernel,
                "torch": label,
                "ms": ms,
                "bytes": nbytes,
                "tbps": nbytes / ms / 1e9,
            }
        )
        print(f"{kernel:20} {label:45} {ms:8.4f} ms {nbytes / ms / 1e9:6.2f} TB/s", flush=True)
    n = 1 << 28
    src, dst = torch.empty(n, device="cuda"), torch.empty(n, device="cuda")
    copy_ms = timed(lambda: dst.copy_(src))
    torch.backends.cuda.matmul.allow_tf32 = False
    A, B = rand(4096, 4096), rand(4096, 4096)
    C = torch.empty(4096, 4096, device="cuda")
    sgemm_ms = timed(lambda: torch.mm(A, B, out=C), reps=30)
    result = {
        "device": props.name,
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "method": "CUDA events, L2 flush (2x L2) before each call, median of 50 (SGEMM 30)",
        "copy": {"bytes": 8 * n, "ms": copy_ms, "tbps": 8 * n / copy_ms / 1e9},
        "sgemm_fp32_4096_tf32_off": {"ms": sgemm_ms, "tflops": 2 * 4096**3 / sgemm_ms / 1e9},
        "fixtures": rows,
    }
    print(f"copy {result['copy']['tbps']:.2f} TB/s; cuBLAS SGEMM 4096^3 {sgemm_ms:.3f} ms")
    (args.out / "torch-baselines.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
