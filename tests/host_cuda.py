"""CUDA kernels run as host C++ (optiml/harness/host.py), for checking a rewrite against its
original without a GPU; here cp.async becomes a plain copy. Small sizes only; the GPU's checks
stay the authority."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from pathlib import Path

from optiml.cuda.types import DTYPES
from optiml.harness.host import (
    CLUSTER_DIMS,
    CTYPES,
    EXTERN_SHARED,
    GUARD,
    HOST_CUDA,
    HOST_TYPES,
    device_part,
    host_mode,
    per_block_shared,
)
from optiml.search.catalog import Context

# The bodies of the SGEMM template's cp.async wrappers on the host: the copy itself, at once.
HOST_CP_ASYNC = {
    "copy4": "*dst = valid ? *src : 0.f;",
    "copy16": "for (int i = 0; i < 4; ++i) dst[i] = valid ? src[i] : 0.f;",
    "commit": "",
    "wait": "",
}


def _cp_async_on_host(text: str) -> str:
    for name, body in HOST_CP_ASYNC.items():
        text = re.sub(
            rf"(void {name}\([^)]*\) \{{)\s*asm volatile\(.*?\);\s*\}}",
            lambda m, body=body: f"{m.group(1)} {body} }}",
            text,
            flags=re.S,
        )
    return text


def host_text(text: str, end: int | None = None) -> str:
    """A kernel file as host C++: its device part (up to `end` if given), `extern __shared__`
    arrays pointing at the dynamic shared memory, include guards lifted first (each file is one
    namespace of a program); in a file with clusters each block's `__shared__` arrays its own."""
    text = per_block_shared(_cp_async_on_host(device_part(text, end)))
    lifted = "".join(f"#undef {g}\n" for g in GUARD.findall(text))
    return lifted + EXTERN_SHARED.sub(r"\1* \2 = reinterpret_cast<\1*>(dynamic_smem());", text)


def launch_text(
    ctx: Context, namespace: str, sizes: dict[str, int], buffers: dict[str, str]
) -> str:
    case = ctx.spec.case(sizes)
    args = []
    for p in ctx.kernel.params:
        value = case.sizes.get(p.name, case.scalars.get(p.name))
        if p.is_pointer:
            args.append(f"{buffers[p.name]}.data()")
        elif isinstance(value, float):
            args.append(f"{value!r}f")
        else:
            args.append(str(value))
    g, b = case.grid, case.block
    cluster = CLUSTER_DIMS.search(ctx.source.text[ctx.kernel.span.start : ctx.kernel.span.end])
    return (
        f"{host_mode(host_text(ctx.source.text))} "
        f"launch({{{g[0]}, {g[1]}, {g[2]}}}, {{{b[0]}, {b[1]}, {b[2]}}}, [&] {{ "
        f"{namespace}::{ctx.kernel.name}{ctx.spec.instantiation}({', '.join(args)}); }}"
        + (f", {{{cluster.group(1)}}}" if cluster else "")
        + ");"
    )


def run_against(
    original: Context,
    candidates: list[Context],
    sizes: list[dict[str, int]],
    tmp: Path,
    prepare: Callable[[str], str] = lambda text: text,
    exact: bool = False,
) -> list[int]:
    """For each candidate, the elements of the outputs where it differs from the original beyond
    the spec's tolerance (`exact`: at all), over all `sizes`: one host program runs them all on
    the same inputs."""
    body = []
    for s in sizes:
        case = original.spec.case(s)
        body.append("{")
        outputs = []
        for buf in original.spec.buffers:
            dtype = DTYPES[buf.dtype]
            ctype = CTYPES[dtype.code]
            lo, hi = case.ranges.get(buf.name, (dtype.low, dtype.high))
            body.append(f"std::vector<{ctype}> {buf.name}_in({case.lengths[buf.name]});")
            body.append(f"fill({buf.name}_in, {float(lo)!r}, {float(hi)!r});")
            body.append(f"auto {buf.name} = {buf.name}_in;")
            if buf.role != "in":
                tol = (0.0, 0.0) if exact else original.spec.tolerance(dtype)
                outputs.append((buf.name, *tol))
        names = {b.name: b.name for b in original.spec.buffers}
        body.append(launch_text(original, "original", s, names))
        for name, _, _ in outputs:
            body.append(f"const auto {name}_want = {name};")
        for i, cand in enumerate(candidates):
            body.append("{")
            body += [f"auto {b} = {b}_in;" for b in names]
            body.append(launch_text(cand, f"candidate{i}", s, names))
            body += [
                f"bad[{i}] += compare({n}_want, {n}, {rtol!r}, {atol!r});"
                for n, rtol, atol in outputs
            ]
            body.append("}")
        body.append("}")
    program = "\n".join(
        [
            HOST_CUDA,
            HOST_TYPES,  # half as _Float16, bf16 by its bits
            "namespace original {",
            host_text(original.source.text),
            "}",
            *(
                f"namespace candidate{i} {{\n{host_text(prepare(c.source.text))}\n}}"
                for i, c in enumerate(candidates)
            ),
            "int main() {",
            f"int bad[{len(candidates)}] = {{}};",
            *body,
            f'for (int i = 0; i < {len(candidates)}; ++i) std::printf("%d\\n", bad[i]);',
            "}",
        ]
    )
    source, exe = tmp / "emulate.cpp", tmp / "emulate"
    source.write_text(program)
    built = subprocess.run(
        ["g++", "-std=c++20", "-O0", "-pthread", "-w", "-o", str(exe), str(source)],
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True, timeout=600)
    return [int(x) for x in out.stdout.split()]


def mismatches(
    original: Context,
    candidate: Context,
    sizes: list[dict[str, int]],
    tmp: Path,
    prepare: Callable[[str], str] = lambda text: text,
) -> int:
    """Elements of the outputs where the candidate differs from the original, at each size."""
    return run_against(original, [candidate], sizes, tmp, prepare)[0]


def proposals_check(
    transformation,
    original: Context,
    sizes: list[tuple[int, ...]],
    tmp: Path,
    breaking: Callable[[str], str],
) -> None:
    """Every proposal of `transformation` equals the original at `sizes` (tuples of the spec's
    size variables), and the check can fail: the first proposal edited by `breaking` differs."""
    path = original.source.path
    candidates = [
        Context.of(p.variant, path, original.kernel.name) for p in transformation.propose(original)
    ]
    assert candidates, "no proposal"
    cases = [dict(zip(original.spec.size_vars, s, strict=True)) for s in sizes]
    assert run_against(original, candidates, cases, tmp) == [0] * len(candidates)
    assert run_against(original, candidates[:1], cases, tmp, prepare=breaking)[0] > 0
