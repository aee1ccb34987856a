"""Language server latency on a generated 5,000-line .cu file (many kernels, most with specs):
textDocument/codeAction, hover and inlayHint round trips while a background compile runs, while a
fast typist edits, and while an optimize job runs on one of its kernels; and the server's longest
event-loop stall in each (its loop-lag probe). The bar: p99 <= 10 ms, no stall > 50 ms.

The server runs with the stand-in executor of tests/search/test_optimize.py
(tests/server/stand_in_server.py): the optimize job compiles every candidate for real with nvcc,
on this machine's CPUs, and a cost model stands in for the GPU's timings; nothing else differs
from `optiml serve`.

    python3 benchmarks/lsp_latency.py --out benchmarks/results/lsp-latency.json
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lsprotocol import types
from pygls.lsp.client import LanguageClient
from pytest_lsp import client_capabilities

ROOT = Path(__file__).resolve().parent.parent
SERVER = [sys.executable, str(ROOT / "tests" / "server" / "stand_in_server.py")]
STAND_IN = (
    "stand-in (tests/search/test_optimize.py's StandInExecutor: every candidate compiled with "
    "nvcc on this machine, timed by a cost model instead of a GPU)"
)
KERNEL_LINES = 15
TYPING_INTERVAL_S = 0.1
SPEC = """/* @optiml
 *   args:   a = 2.5, x: in float[n], y: inout float[n]
 *   launch: grid = cdiv(n, 256), block = 256
 *   sizes:  n = 1 << 20, 1000003
 */
"""
BODY = """__global__ void saxpy_{i}(int n, float a, const float* x, float* y)
{{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {{
        float v = x[i] * a + {i}.0f;
        y[i] = a * v + y[i];
    }}
}}
"""


def generate(lines: int) -> tuple[str, list[tuple[int, int]]]:
    """The file, and (name line, body line) of each kernel. Every tenth kernel has no spec, so
    that code actions also draft one."""
    parts, kernels, line, i = ["#include <cuda_runtime.h>\n\n"], [], 2, 0
    while line < lines - KERNEL_LINES:
        spec = "" if i % 10 == 0 else SPEC
        blank = "\n" * (KERNEL_LINES - spec.count("\n") - BODY.count("\n"))
        parts.append(spec + BODY.format(i=i) + blank)
        name_line = line + spec.count("\n")
        kernels.append((name_line, name_line + 3))
        line += KERNEL_LINES
        i += 1
    return "".join(parts), kernels


class Client(LanguageClient):
    """A plain pygls client that answers what the server asks and tracks compiles by progress."""

    def __init__(self) -> None:
        super().__init__("optiml-bench", "1")
        self.compiling = 0
        self.compiles_done = 0
        self.job_reports: list[dict] = []  # the optimize job's progress values
        self.titles: dict[str, str] = {}  # progress token -> its begin's title
        self.diagnostics_at: dict[int, float] = {}  # document version -> when published
        self.feature(types.WINDOW_WORK_DONE_PROGRESS_CREATE)(lambda params: None)
        self.feature(types.WORKSPACE_INLAY_HINT_REFRESH)(lambda params: None)
        self.feature(types.WORKSPACE_CODE_LENS_REFRESH)(lambda params: None)
        self.feature(types.WORKSPACE_CONFIGURATION)(lambda params: [None for _ in params.items])
        self.feature(types.WINDOW_SHOW_MESSAGE)(lambda params: print("server:", params.message))

        # pygls registers functions, not bound methods
        @self.feature(types.PROGRESS)
        def progress(params) -> None:
            value = params.value if isinstance(params.value, dict) else params.value._asdict()
            kind = value["kind"]
            if kind == "begin":  # every job's token is `optiml/job/...`: the title tells them apart
                self.titles[str(params.token)] = value.get("title") or ""
            if not self.titles.get(str(params.token), "").startswith("OptiML: compiling"):
                self.job_reports.append(value)  # an optimize job, not a compile
                return
            if kind == "begin":
                self.compiling += 1
            elif kind == "end":
                self.compiling -= 1
                self.compiles_done += 1

        @self.feature(types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
        def published(params: types.PublishDiagnosticsParams) -> None:
            if params.version is not None:
                self.diagnostics_at.setdefault(params.version, time.perf_counter())


async def until(condition, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("the server did not get there in time")
        await asyncio.sleep(0.005)


def summary(ms: list[float]) -> dict:
    ms = sorted(ms)
    return {
        "n": len(ms),
        "p50_ms": round(statistics.median(ms), 2),
        "p99_ms": round(ms[min(len(ms) - 1, int(len(ms) * 0.99))], 2),
        "max_ms": round(ms[-1], 2),
    }


async def run(
    preset: str,
    text: str,
    kernels: list[tuple[int, int]],
    per_kind: int,
    path: Path,
    evaluations: int,
):
    env = {
        **os.environ,
        "OPTIML_LSP_PROBE": "1",
        "OPTIML_CACHE_DIR": tempfile.mkdtemp(prefix="optiml-bench-"),
    }
    client = Client()
    await client.start_io(*SERVER, env=env, cwd=str(ROOT))
    await client.initialize_async(
        types.InitializeParams(
            capabilities=client_capabilities(preset),
            process_id=os.getpid(),
            initialization_options={"evaluations": evaluations, "seconds": 0},  # its whole budget
        )
    )
    client.initialized(types.InitializedParams())
    uri = path.as_uri()
    doc = types.TextDocumentIdentifier(uri=uri)
    opened = time.perf_counter()
    client.text_document_did_open(
        types.DidOpenTextDocumentParams(
            text_document=types.TextDocumentItem(uri=uri, language_id="cuda", version=1, text=text)
        )
    )
    await until(lambda: 1 in client.diagnostics_at)
    open_ms = (client.diagnostics_at[1] - opened) * 1e3
    await until(lambda: client.compiles_done == 1)
    compile_s = time.perf_counter() - opened

    requests = {
        "textDocument/codeAction": lambda line: client.text_document_code_action_async(
            types.CodeActionParams(
                text_document=doc,
                range=types.Range(types.Position(line[1], 4), types.Position(line[1], 4)),
                context=types.CodeActionContext(diagnostics=[]),
            )
        ),
        "textDocument/hover": lambda line: client.text_document_hover_async(
            types.HoverParams(text_document=doc, position=types.Position(line[0], 18))
        ),
        "textDocument/inlayHint": lambda line: client.text_document_inlay_hint_async(
            types.InlayHintParams(
                text_document=doc,
                range=types.Range(types.Position(line[0], 0), types.Position(line[0] + 60, 0)),
            )
        ),
    }
    if preset == "visual-studio-code":  # VS Code 1.65 has no inlay hints
        del requests["textDocument/inlayHint"]
    latencies: dict[str, list[float]] = {name: [] for name in requests}
    stalls: list[dict] = []
    rng = random.Random(0)
    version = 1
    while min(len(v) for v in latencies.values()) < per_kind:
        # A new text to compile: an edit at the end, then a save, as a user does.
        version += 1
        end = types.Position(len(text.split("\n")) - 1, 0)
        client.text_document_did_change(
            types.DidChangeTextDocumentParams(
                text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
                content_changes=[
                    types.TextDocumentContentChangePartial(
                        range=types.Range(end, end), text=f"// edit {version}\n"
                    )
                ],
            )
        )
        text += f"// edit {version}\n"
        client.text_document_did_save(types.DidSaveTextDocumentParams(text_document=doc))
        await until(lambda: client.compiling > 0)
        await client.protocol.send_request_async("optiml/loopLag", {})  # reset the probe
        while client.compiling > 0:
            for name, send in requests.items():
                start = time.perf_counter()
                await send(rng.choice(kernels))
                if client.compiling > 0:
                    latencies[name].append((time.perf_counter() - start) * 1e3)
            await asyncio.sleep(0.002)  # an editor's requests come spaced, not back to back
        await asyncio.sleep(0.2)  # the compile's publish and refresh count too
        lag = await client.protocol.send_request_async("optiml/loopLag", {})
        stalls.append(lag._asdict())  # pygls gives results of custom methods as named tuples

    typing, typing_lag, version = await type_into(client, uri, version, kernels, requests, rng)
    optimizing = await while_optimizing(client, uri, version, kernels, requests, rng, evaluations)
    await client.shutdown_async(None)
    client.exit(None)
    await client.stop()
    return {
        "client": preset,
        "open_to_spec_diagnostics_ms": round(open_ms, 1),
        "first_compile_s": round(compile_s, 2),
        "compiles_measured": len(stalls),
        "requests": {name: summary(ms) for name, ms in latencies.items()},
        "loop_lag": {
            "max_ms": round(max(s["max_ms"] for s in stalls), 2),
            "p99_ms": round(max(s["p99_ms"] for s in stalls), 2),
        },
        "while_typing": {
            "edits_per_s": 1 / TYPING_INTERVAL_S,
            "requests": {name: summary(ms) for name, ms in typing.items()},
            "loop_lag": {k: round(v, 2) for k, v in typing_lag.items() if k != "samples"},
        },
        "while_optimizing": optimizing,
    }


TYPED = "float t = a * (n - 1.0f);\n    "  # a statement (it compiles) and the next line's indent


async def type_into(client, uri, version, kernels, requests, rng, statements: int = 2):
    """A fast typist in the body of the kernel under the cursor: a key every TYPING_INTERVAL_S,
    each followed by the requests an editor sends on a cursor move. The keys type a statement
    (`TYPED`, a line break included) at the start of a random kernel's body line, one character
    at a time, then move on to another kernel: half-typed statements are syntax errors until
    their `;`, and a line break moves every kernel below. `statements` are typed whole (the file
    compiles again after: an optimize job follows)."""
    latencies: dict[str, list[float]] = {name: [] for name in requests}
    await client.protocol.send_request_async("optiml/loopLag", {})
    typed, at, kernel, last = len(TYPED), None, None, 0
    moved = 0  # lines typed so far, all above the next kernel typed into
    for _ in range(statements * len(TYPED)):
        if typed == len(TYPED):  # on to a kernel further down
            last = rng.randrange(last + 1, last + 1 + (len(kernels) - last - 1) // 4)
            name_line, body_line = kernels[last]
            at, typed = types.Position(body_line + moved, 4), 0
            kernel = (name_line + moved, body_line + moved)
        key = TYPED[typed]
        version += 1
        client.text_document_did_change(
            types.DidChangeTextDocumentParams(
                text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
                content_changes=[
                    types.TextDocumentContentChangePartial(range=types.Range(at, at), text=key)
                ],
            )
        )
        typed += 1
        if key == "\n":
            at, moved = types.Position(at.line + 1, 0), moved + 1
        else:
            at = types.Position(at.line, at.character + 1)
        started = time.perf_counter()
        for name, send in requests.items():
            start = time.perf_counter()
            await send(kernel)
            latencies[name].append((time.perf_counter() - start) * 1e3)
        await asyncio.sleep(max(0.0, TYPING_INTERVAL_S - (time.perf_counter() - started)))
    lag = await client.protocol.send_request_async("optiml/loopLag", {})
    return latencies, lag._asdict(), version


async def while_optimizing(client, uri, version, kernels, requests, rng, evaluations: int) -> dict:
    """An optimize job on one kernel (its whole course: baseline, search, confirmation, judge),
    with the requests an editor sends meanwhile, spaced as in the compile phase."""
    client.job_reports.clear()
    index = 1  # every tenth kernel has no spec; the second has one
    name = f"saxpy_{index}"
    target = {"uri": uri, "version": version, "kernel": name}
    started = time.perf_counter()
    answer = await client.protocol.send_request_async(
        types.WORKSPACE_EXECUTE_COMMAND,
        types.ExecuteCommandParams(command="optiml.optimize", arguments=[target]),
    )
    if answer is None:
        raise RuntimeError("the server did not start the optimize job")
    await until(lambda: client.job_reports)
    await client.protocol.send_request_async("optiml/loopLag", {})  # reset the probe
    latencies: dict[str, list[float]] = {name: [] for name in requests}
    while client.job_reports[-1]["kind"] != "end":
        for request, send in requests.items():
            start = time.perf_counter()
            await send(rng.choice(kernels))
            if client.job_reports[-1]["kind"] != "end":
                latencies[request].append((time.perf_counter() - start) * 1e3)
        await asyncio.sleep(0.002)
    job_s = time.perf_counter() - started
    lag = (await client.protocol.send_request_async("optiml/loopLag", {}))._asdict()
    evaluated = [r for r in client.job_reports if "evaluations" in (r.get("message") or "")]
    return {
        "executor": STAND_IN,
        "kernel": name,
        "evaluations": evaluations,
        "evaluated": evaluated[-1]["message"].split(" ")[0] if evaluated else "0",
        "job_s": round(job_s, 1),
        "outcome": client.job_reports[-1].get("message"),
        "requests": {request: summary(ms) for request, ms in latencies.items() if ms},
        "loop_lag": {k: round(v, 2) for k, v in lag.items() if k != "samples"},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--lines", type=int, default=5000)
    ap.add_argument("--requests", type=int, default=300, help="per request kind and client")
    ap.add_argument("--evaluations", type=int, default=12, help="the optimize job's search budget")
    args = ap.parse_args()
    text, kernels = generate(args.lines)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="optiml-lsp-bench-") as tmp:
        path = Path(tmp) / "many_kernels.cu"
        path.write_text(text)
        results = [
            asyncio.run(run(preset, text, kernels, args.requests, path, args.evaluations))
            for preset in ("visual-studio-code", "neovim")
        ]
    nvcc = subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout
    report = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.node()}: {os.cpu_count()} CPUs, no GPU",
        # other work on the machine inflates the tails: its 1-minute load before and after
        "load_average": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        "python": platform.python_version(),
        "nvcc": nvcc.strip().splitlines()[-1] if nvcc else "none",
        "file": {"lines": text.count("\n"), "kernels": len(kernels)},
        "server": "tests/server/stand_in_server.py (`optiml serve` with the stand-in executor)",
        "bar": {"p99_ms": 10, "loop_stall_ms": 50},
        "results": results,
    }
    print(f"{report['file']['lines']} lines, {len(kernels)} kernels")
    print(f"optimize jobs: executor {STAND_IN}")
    print(
        f"{'client':20} {'while':8} {'request':24} {'n':>5} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}"
    )
    for r in results:
        phases = [("compile", r["requests"], r["loop_lag"])]
        phases.append(("typing", r["while_typing"]["requests"], r["while_typing"]["loop_lag"]))
        job = r["while_optimizing"]
        phases.append(("optimize", job["requests"], job["loop_lag"]))
        for phase, requests, lag in phases:
            for name, s in requests.items():
                print(
                    f"{r['client']:20} {phase:8} {name:24} {s['n']:5} {s['p50_ms']:8.2f} "
                    f"{s['p99_ms']:8.2f} {s['max_ms']:8.2f}"
                )
            print(
                f"{r['client']:20} {phase:8} {'event-loop stall':24} {'':5} {'':8} "
                f"{lag['p99_ms']:8.2f} {lag['max_ms']:8.2f}"
            )
        print(
            f"{r['client']:20} open to spec diagnostics {r['open_to_spec_diagnostics_ms']:.0f} ms, "
            f"first compile {r['first_compile_s']:.1f} s"
        )
        print(
            f"{r['client']:20} optimize job on {job['kernel']}: {job['evaluated']} evaluations "
            f"in {job['job_s']:.0f} s (stand-in executor): {job['outcome']}"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
