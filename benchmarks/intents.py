"""OptiML-G offline on intents written as formulas, against PyTorch: each formula generates a plain
kernel, its spec and a float64 NumPy reference; OptiML-X optimizes it; the delivered kernel is
timed by `optiml eval` at the intent's sizes (with the physical floor of its bytes) and the same
work in PyTorch, eager and `torch.compile` (TF32 off), after an L2 flush. PyTorch's output is
checked against the NumPy reference on the same inputs, so that each comparison is of the same
computation.

    python3 benchmarks/intents.py --out DIR [--budget 8] [--time 60] [--only relu,softmax]
                                  [--shard 1/4]

Writes DIR/intents.json (rewritten after every intent): a row per intent (its family, whether it
is memory- or compute-bound, each step's time or error, delivered / PyTorch / floor times),
geometric means of the speedups over PyTorch, how many memory-bound intents are within 1.3x of
their floor, the device, the date and the versions. Without a GPU (`--no-gpu`) it stops after
generating each kernel.

The intents cover maps (fp32, half, bf16), reductions on the last, the first, a middle and every
axis, row normalizations, GEMM in several layouts with a fused bias, batched GEMM, gemv,
permutations, gathers (an embedding, rows by index, a bag sum), a stencil, convolutions, pooling,
a scan and losses. Scatters are not in the notation (docs/generate.md, Limits).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from kernelbench import (  # noqa: E402
    environment,
    eval_step,
    failure,
    geomean,
    optimize_step,
    save,
    shard,
    speedups,
)

from optiml.cuda.types import DTYPES  # noqa: E402
from optiml.errors import OptimlError  # noqa: E402
from optiml.generate import generate  # noqa: E402
from optiml.spec import load  # noqa: E402

TORCH_TYPES = {"float": "float32", "double": "float64", "half": "float16", "bf16": "bfloat16"}


@dataclass(frozen=True)
class Intent:
    name: str
    family: str
    bound: str  # "memory" or "compute": what the floor means for it
    formula: str  # without sizes
    sizes: str  # the benchmark's sizes, as formula items
    small: dict[str, int]  # sizes for a check on the host
    torch: str  # Python that defines `fn(**inputs)` from `torch` and `F`, by the formula's names

    def text(self) -> str:
        return f"{self.formula}\n{self.sizes}"


M, C = "memory", "compute"
INTENTS = [
    # maps
    Intent(
        "relu",
        "map",
        M,
        "float x[N]; y[i] = max(x[i], 0)",
        "N = 1 << 24",
        {"N": 777},
        "fn = lambda x: torch.relu(x)",
    ),
    Intent(
        "gelu_erf",
        "map",
        M,
        "float x[N]; y[i] = 0.5 * x[i] * (1 + erf(x[i] * 0.7071067811865476))",
        "N = 1 << 24",
        {"N": 600},
        "fn = lambda x: F.gelu(x)",
    ),
    Intent(
        "gelu_tanh",
        "map",
        M,
        "float x[N]; y[i] = 0.5 * x[i] * (1 + tanh(0.7978845608028654 * (x[i] + 0.044715 * x[i] ** 3)))",
        "N = 1 << 24",
        {"N": 600},
        "fn = lambda x: F.gelu(x, approximate='tanh')",
    ),
    Intent(
        "silu",
        "map",
        M,
        "float x[N]; y[i] = x[i] * sigmoid(x[i])",
        "N = 1 << 24",
        {"N": 999},
        "fn = lambda x: F.silu(x)",
    ),
    Intent(
        "axpby",
        "map",
        M,
        "float x[N], z[N]; y[i] = a * x[i] + b * z[i]   with a = 2.5, b = -0.5",
        "N = 1 << 24",
        {"N": 1000},
        "fn = lambda x, z: 2.5 * x - 0.5 * z",
    ),
    Intent(
        "clamp",
        "map",
        M,
        "float x[N]; y[i] = min(max(x[i], -0.5), 0.5)",
        "N = 1 << 24",
        {"N": 513},
        "fn = lambda x: torch.clamp(x, -0.5, 0.5)",
    ),
    Intent(
        "bias_relu",
        "map",
        M,
        "float x[R, C], b[C]; y[r, c] = max(x[r, c] + b[c], 0)",
        "R = 4096; C = 4096",
        {"R": 37, "C": 53},
        "fn = lambda x, b: torch.relu(x + b)",
    ),
    Intent(
        "half_scale",
        "map",
        M,
        "half x[N], y[N]; y[i] = x[i] * 2 + 1",
        "N = 1 << 24",
        {"N": 700},
        "fn = lambda x: x * 2 + 1",
    ),
    Intent(
        "bf16_exp",
        "map",
        M,
        "bf16 x[N]; y[i] = exp(x[i])",
        "N = 1 << 24",
        {"N": 300},
        "fn = lambda x: torch.exp(x)",
    ),
    Intent(
        "causal_mask",
        "map",
        M,
        "float s[N, N]; y[i, j] = where(j <= i, s[i, j], -1e9)",
        "N = 4096",
        {"N": 21},
        "fn = lambda s: s.masked_fill(torch.ones(s.shape, dtype=torch.bool, device=s.device)"
        ".triu(1), -1e9)",
    ),
    # reductions along every kind of axis
    Intent(
        "row_sum",
        "reduction",
        M,
        "float x[R, C]; y[r] = sum(c) x[r, c]",
        "R = 4096; C = 4096",
        {"R": 37, "C": 53},
        "fn = lambda x: x.sum(1)",
    ),
    Intent(
        "column_sum",
        "reduction",
        M,
        "float x[R, C]; y[c] = sum(r) x[r, c]",
        "R = 4096; C = 4096",
        {"R": 37, "C": 53},
        "fn = lambda x: x.sum(0)",
    ),
    Intent(
        "row_max",
        "reduction",
        M,
        "float x[R, C]; y[r] = max(c) x[r, c]",
        "R = 4096; C = 4096",
        {"R": 37, "C": 53},
        "fn = lambda x: x.amax(1)",
    ),
    Intent(
        "row_argmax",
        "reduction",
        M,
        "float x[R, C]; y[r] = argmax(c) x[r, c]",
        "R = 4096; C = 4096",
        {"R": 37, "C": 53},
        "fn = lambda x: x.argmax(1)",
    ),
    Intent(
        "middle_sum",
        "reduction",
        M,
        "float x[A, B, C]; y[a, c] = sum(b) x[a, b, c]",
        "A = 64; B = 256; C = 1024",
        {"A": 5, "B": 7, "C": 33},
        "fn = lambda x: x.sum(1)",
    ),
    Intent(
        "total_sum",
        "reduction",
        M,
        "float x[N]; s = sum(i) x[i]",
        "N = 1 << 24",
        {"N": 999},
        "fn = lambda x: x.sum()",
    ),
    Intent(
        "mse_loss",
        "loss",
        M,
        "float p[N, K], t[N, K]; loss = mean(i, j) (p[i, j] - t[i, j]) ** 2",
        "N = 4096; K = 4096",
        {"N": 37, "K": 61},
        "fn = lambda p, t: F.mse_loss(p, t)",
    ),
    Intent(
        "smooth_l1_loss",
        "loss",
        M,
        "float p[N], t[N]; loss = mean(i) where(abs(p[i] - t[i]) < 0.5, (p[i] - t[i]) ** 2,"
        " abs(p[i] - t[i]) - 0.25)",
        "N = 1 << 24",
        {"N": 999},
        "fn = lambda p, t: F.smooth_l1_loss(p, t, beta=0.5) * 1.0",
    ),
    # row normalizations
    Intent(
        "softmax",
        "normalization",
        M,
        "float x[R, C]; m[r] = max(c) x[r, c]; e[r, c] = exp(x[r, c] - m[r]);"
        " y[r, c] = e[r, c] / sum(c2) e[r, c2]",
        "R = 4096; C = 4096",
        {"R": 9, "C": 45},
        "fn = lambda x: torch.softmax(x, 1)",
    ),
    Intent(
        "log_softmax",
        "normalization",
        M,
        "float x[R, C]; m[r] = max(c) x[r, c]; s[r] = sum(c) exp(x[r, c] - m[r]);"
        " y[r, c] = x[r, c] - m[r] - log(s[r])",
        "R = 4096; C = 4096",
        {"R": 9, "C": 45},
        "fn = lambda x: torch.log_softmax(x, 1)",
    ),
    Intent(
        "layernorm",
        "normalization",
        M,
        "float x[R, C], w[C], b[C]; eps = 1e-5; mu[r] = mean(c) x[r, c];"
        " var[r] = mean(c) (x[r, c] - mu[r]) ** 2;"
        " y[r, c] = (x[r, c] - mu[r]) * rsqrt(var[r] + eps) * w[c] + b[c]",
        "R = 4096; C = 4096",
        {"R": 9, "C": 45},
        "fn = lambda x, w, b: F.layer_norm(x, (x.shape[1],), w, b, 1e-5)",
    ),
    Intent(
        "rmsnorm",
        "normalization",
        M,
        "float x[R, C], w[C]; eps = 1e-6; ms[r] = mean(c) x[r, c] ** 2;"
        " y[r, c] = x[r, c] * rsqrt(ms[r] + eps) * w[c]",
        "R = 4096; C = 4096",
        {"R": 9, "C": 45},
        "fn = lambda x, w: x * torch.rsqrt(x.pow(2).mean(1, keepdim=True) + 1e-6) * w",
    ),
    # contractions
    Intent(
        "matmul",
        "contraction",
        C,
        "float a[M, K], b[K, N]; c[i, j] = sum(k) a[i, k] * b[k, j]",
        "M = 2048; N = 2048; K = 2048",
        {"M": 19, "N": 23, "K": 31},
        "fn = lambda a, b: a @ b",
    ),
    Intent(
        "matmul_tn",
        "contraction",
        C,
        "float a[K, M], b[K, N]; c[i, j] = sum(k) a[k, i] * b[k, j]",
        "M = 2048; N = 2048; K = 2048",
        {"M": 19, "N": 23, "K": 31},
        "fn = lambda a, b: a.t() @ b",
    ),
    Intent(
        "linear_bias",
        "contraction",
        C,
        "float x[M, K], w[N, K], bias[N]; y[i, j] = sum(k) x[i, k] * w[j, k] + bias[j]",
        "M = 2048; N = 2048; K = 2048",
        {"M": 19, "N": 23, "K": 31},
        "fn = lambda x, w, bias: F.linear(x, w, bias)",
    ),
    Intent(
        "attention_scores",
        "contraction",
        C,
        "float q[B, M, K], kt[B, N, K]; out[b, i, j] = sum(k) q[b, i, k] * kt[b, j, k] * scale;"
        " scale = 0.125",
        "B = 16; M = 1024; N = 1024; K = 64",
        {"B": 3, "M": 5, "N": 7},
        "fn = lambda q, kt: torch.bmm(q, kt.transpose(1, 2)) * 0.125",
    ),
    Intent(
        "gemv",
        "contraction",
        M,
        "float a[M, K], x[K]; y[i] = sum(k) a[i, k] * x[k]",
        "M = 8192; K = 8192",
        {"M": 37, "K": 53},
        "fn = lambda a, x: a @ x",
    ),
    # permutations
    Intent(
        "transpose",
        "permutation",
        M,
        "float x[M, N]; y[j, i] = x[i, j]",
        "M = 4096; N = 4096",
        {"M": 13, "N": 29},
        "fn = lambda x: x.t().contiguous()",
    ),
    Intent(
        "permute_heads",
        "permutation",
        M,
        "float x[B, H, T, D]; y[b, t, h, d] = x[b, h, t, d]",
        "B = 32; H = 16; T = 256; D = 64",
        {"B": 2, "H": 3, "T": 5, "D": 7},
        "fn = lambda x: x.permute(0, 2, 1, 3).contiguous()",
    ),
    # stencils, convolutions, pooling
    Intent(
        "laplacian_5pt",
        "stencil",
        M,
        "float x[H, W]; y[i, j] = x[i - 1, j] + x[i + 1, j] + x[i, j - 1] + x[i, j + 1]"
        " - 4 * x[i, j]",
        "H = 4096; W = 4096",
        {"H": 13, "W": 17},
        "k = torch.tensor([[0.0, 1, 0], [1, -4, 1], [0, 1, 0]], device='cuda')[None, None]\n"
        "fn = lambda x: F.conv2d(x[None, None], k, padding=1)[0, 0]",
    ),
    Intent(
        "conv2d_3x3",
        "convolution",
        C,
        "float x[B, CI, H, W], w[CO, CI, KH, KW]; y[b, co, oh, ow] = sum(ci, kh, kw)"
        " x[b, ci, oh + kh - 1, ow + kw - 1] * w[co, ci, kh, kw]   for oh < H, ow < W",
        "B = 8; CO = 64; H = 64; W = 64; CI = 64; KH = 3; KW = 3",
        {"B": 2, "CO": 3, "H": 5, "W": 6},
        "fn = lambda x, w: F.conv2d(x, w, padding=1)",
    ),
    Intent(
        "depthwise_conv1d",
        "convolution",
        M,
        "float x[B, C, L], w[C, K]; y[b, c, o] = sum(k) x[b, c, o + k - 1] * w[c, k]   for o < L",
        "B = 16; C = 256; L = 4096; K = 3",
        {"B": 2, "C": 3, "L": 17},
        "fn = lambda x, w: F.conv1d(x, w[:, None, :], padding=1, groups=x.shape[1])",
    ),
    Intent(
        "maxpool2d",
        "pooling",
        M,
        "float x[B, C, H, W]; y[b, c, i, j] = max(kh, kw) pad(x[b, c, i * 2 + kh, j * 2 + kw], -inf)"
        "   for i < OH, j < OW, kh < 2, kw < 2",
        "B = 16; C = 64; OH = 64; OW = 64; H = 128; W = 128",
        {"B": 2, "C": 3, "OH": 4, "OW": 5},
        "fn = lambda x: F.max_pool2d(x, 2)",
    ),
    # gathers
    Intent(
        "embedding",
        "gather",
        M,
        "float wte[V, C], wpe[T, C]; int idx[T]; y[t, c] = wte[idx[t], c] + wpe[t, c]",
        "V = 50257; T = 8192; C = 768",
        {"V": 50, "T": 19, "C": 33},
        "fn = lambda wte, wpe, idx: F.embedding(idx.long(), wte) + wpe",
    ),
    Intent(
        "index_select_rows",
        "gather",
        M,
        "float x[R, C]; int rows[M]; y[i, c] = x[rows[i], c]",
        "R = 16384; C = 1024; M = 8192",
        {"R": 40, "C": 33, "M": 19},
        "fn = lambda x, rows: x.index_select(0, rows)",
    ),
    Intent(
        "embedding_bag_sum",
        "gather",
        M,
        "float x[V, C]; int idx[B, L]; y[b, c] = sum(l) x[idx[b, l], c]",
        "V = 100000; B = 4096; L = 16; C = 256",
        {"V": 40, "B": 5, "L": 6, "C": 11},
        "fn = lambda x, idx: F.embedding_bag(idx.long(), x, mode='sum')",
    ),
    # a scan
    Intent(
        "cumsum_rows",
        "scan",
        M,
        "float x[R, C]; y[r, c] = cumsum(c) x[r, c]",
        "R = 4096; C = 1024",
        {"R": 7, "C": 33},
        "fn = lambda x: torch.cumsum(x, 1)",
    ),
]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="folder for intents.json and files")
    p.add_argument("--budget", type=int, default=8, help="evaluations optimize may spend")
    p.add_argument("--time", type=float, default=60.0, help="optimize's wall-time cap, seconds")
    p.add_argument("--only", default="", help="intent names, comma-separated")
    p.add_argument("--shard", type=shard, default=(1, 1), help="i/n: this run's share")
    p.add_argument("--eval-timeout", type=float, default=600.0, help="seconds for optiml eval")
    p.add_argument("--no-gpu", action="store_true", help="stop after generating each kernel")
    args = p.parse_args(argv)
    if args.budget < 1 or args.time < 1:
        p.error("--budget and --time are at least 1")
    return args


def chosen(args: argparse.Namespace) -> list[Intent]:
    intents = INTENTS
    if args.only:
        wanted = [w.strip() for w in args.only.split(",") if w.strip()]
        names = {i.name for i in INTENTS}
        if missing := [w for w in wanted if w not in names]:
            raise SystemExit(f"--only: no intent {', '.join(missing)}")
        intents = [i for i in INTENTS if i.name in wanted]
    i, n = args.shard
    return intents[i - 1 :: n]


def generate_step(intent: Intent, work: Path) -> dict:
    row: dict = {"intent": intent.name, "family": intent.family, "bound": intent.bound}
    row["formula"] = intent.text()
    try:
        g = generate(intent.text(), intent.name)
    except OptimlError as e:
        row.update(generated=False, why=str(e))
        return row
    work.mkdir(parents=True, exist_ok=True)
    cu = work / f"{intent.name}.cu"
    cu.write_text(g.kernel)
    (work / f"{intent.name}_ref.py").write_text(g.reference)
    row.update(generated=True, kernel=intent.name, file=str(cu), notes=g.notes)
    return row


def torch_step(row: dict, intent: Intent) -> None:
    """The same work in PyTorch on the GPU at the intent's sizes, eager and compiled (TF32 off),
    on inputs uniform in [-1, 1); its output checked against the float64 reference on the same
    inputs (`torch_agrees`), so that the times compare one computation."""
    import numpy as np
    import torch
    import torch.nn.functional as F
    from torch_baselines import timed

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    _, _, spec = load(Path(row["file"]), intent.name)
    case = spec.cases()[0]
    checked = generate(intent.text(), intent.name).checked
    rng = np.random.default_rng(0)
    arrays, tensors = {}, {}
    for name, t in checked.tensors.items():
        if t.role != "in":
            continue
        shape = [checked.sizes[d].value if d in checked.sizes else int(d) for d in t.dims]
        if t.dtype == "int":  # a gather's indices, in the extent they index (as the spec says)
            extent = checked.value_ranges[name]
            high = checked.sizes[extent].value if extent in checked.sizes else int(extent)
            x = torch.tensor(rng.integers(0, high, shape), dtype=torch.int32, device="cuda")
            tensors[name], arrays[name] = x, x.double().cpu().numpy().reshape(-1)
            continue
        x = torch.tensor(
            rng.uniform(-1, 1, shape), dtype=getattr(torch, TORCH_TYPES[t.dtype]), device="cuda"
        )
        tensors[name] = x
        arrays[name] = x.double().cpu().numpy().reshape(-1)
    outputs = [b for b in spec.buffers if b.role != "in"]
    for b in outputs:
        arrays.setdefault(b.name, np.zeros(case.lengths[b.name]))
    scope: dict = {"torch": torch, "F": F}
    exec(intent.torch, scope)  # noqa: S102 (this file's own table)
    fn = scope["fn"]
    with torch.no_grad():
        have = fn(**tensors).double().cpu().numpy().reshape(-1)
        ref = importlib.util.spec_from_file_location(intent.name, spec.reference.path)
        module = importlib.util.module_from_spec(ref)
        ref.loader.exec_module(module)
        args = [
            arrays[p] if p in arrays else case.scalars.get(p, case.sizes.get(p))
            for p in spec.params
        ]
        want = np.asarray(getattr(module, intent.name)(*args)[0], dtype=np.float64)
        rtol, atol = spec.tolerance(DTYPES[outputs[0].dtype])
        row["torch_agrees"] = bool(np.allclose(have, want, rtol=rtol, atol=atol, equal_nan=True))
        for label in ("eager", "compile"):
            try:
                call = fn if label == "eager" else torch.compile(fn)
                call(**tensors)  # warm (compiles)
                row[f"{label}_ms"] = timed(lambda call=call, xs=tensors: call(**xs))
            except Exception as e:  # a PyTorch failure is the row's, not the run's
                row[f"{label}_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
    del tensors
    torch.cuda.empty_cache()


def summary(rows: list[dict]) -> dict:
    out = {"intents": len(rows), "generated": sum(1 for r in rows if r.get("generated"))}
    out["correct"] = sum(1 for r in rows if r.get("delivered_status") == "ok")
    out["torch_agrees"] = sum(1 for r in rows if r.get("torch_agrees"))
    for base in ("eager", "compile"):
        vals = [r[f"speedup_vs_{base}"] for r in rows if f"speedup_vs_{base}" in r]
        out[f"geomean_speedup_vs_{base}"] = geomean(vals)
        out[f"rows_vs_{base}"] = len(vals)
    memory = [r for r in rows if r["bound"] == "memory" and r.get("over_floor")]
    out["memory_bound_timed"] = len(memory)
    out["memory_bound_within_1_3x_floor"] = sum(1 for r in memory if r["over_floor"] <= 1.3)
    return out


def run(args: argparse.Namespace) -> dict:
    args.out.mkdir(parents=True, exist_ok=True)
    table = {
        **environment(),
        "args": {
            "budget": args.budget,
            "time": args.time,
            "only": args.only,
            "shard": "/".join(map(str, args.shard)),
        },
        "rows": [],
    }
    i, n = args.shard
    target = args.out / ("intents.json" if n == 1 else f"intents-{i}-of-{n}.json")
    save(table, target, summary)
    for intent in chosen(args):
        started = time.monotonic()
        row = generate_step(intent, args.out / "work" / intent.name)
        try:
            if row["generated"] and not args.no_gpu:
                optimize_step(row, args)
                eval_step(row, args)
                torch_step(row, intent)
                speedups(row)
        except Exception as e:  # never a crash: the row says what went wrong
            row["error"] = failure(e)
        row["wall_s"] = round(time.monotonic() - started, 1)
        table["rows"].append(row)
        save(table, target, summary)
    return table


def main(argv: list[str] | None = None) -> None:
    table = run(parse_args(argv))
    s = table["summary"]
    print(
        f"{s['generated']} of {s['intents']} generated, {s['correct']} correct; geometric mean "
        f"speedup {s['geomean_speedup_vs_eager']} vs eager ({s['rows_vs_eager']}), "
        f"{s['geomean_speedup_vs_compile']} vs torch.compile ({s['rows_vs_compile']}); "
        f"memory-bound within 1.3x of the floor: {s['memory_bound_within_1_3x_floor']} of "
        f"{s['memory_bound_timed']}"
    )


if __name__ == "__main__":
    main()
