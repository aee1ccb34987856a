"""Verification by agreement: every draft kernel run against every draft reference.

A draft is a kernel with its `@optiml` spec and a NumPy reference. Each kernel runs once per
case (as host C++ at small sizes: a CPU check, `optiml.harness.host`), each reference once per
case (in its own Python process, with a time limit), on the same inputs from the harness's
generator; the matrix says, for each pair, whether the kernel's outputs are within the
reference's tolerance. The reference most kernels agree with is the oracle, unless a formula's
float64 reference is present: it has the final say.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from optiml.cuda.source import SourceFile
from optiml.cuda.types import DTYPES
from optiml.errors import OptimlError
from optiml.expr import ExprError
from optiml.harness import inputs
from optiml.harness.host import HostRun, as_float64, run_on_host
from optiml.search.variant import set_spec_key
from optiml.spec import Case, Spec, parse_spec

# The host runs a fiber (or an OS thread) per CUDA thread: its sizes stay small.
MAX_ELEMENTS = 8192
MAX_THREADS = 1 << 15
SEED = 20240611
_DRIVER = r"""
import importlib.util, json, sys
import numpy as np
path, function, plan = sys.argv[1], sys.argv[2], json.loads(sys.stdin.read())
spec = importlib.util.spec_from_file_location("reference", path)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
for n, case in enumerate(plan["cases"]):
    args = [np.load(a) if isinstance(a, str) else a for a in case["args"]]
    result = getattr(module, function)(*args)
    if not isinstance(result, (tuple, list)):
        result = (result,)
    np.savez(f"{plan['out']}/{n}.npz", *[np.asarray(r, dtype=np.float64) for r in result])
"""


@dataclass
class Draft:
    """A kernel file and its reference, written under `folder`; `problem` says why it cannot
    take part (its spec does not parse), else `spec` is its contract."""

    label: str
    folder: Path
    name: str
    kernel_text: str
    reference_text: str
    source: SourceFile | None = None
    spec: Spec | None = None
    problem: str | None = None

    @property
    def cu_path(self) -> Path:
        return self.folder / f"{self.name}.cu"

    @property
    def ref_path(self) -> Path:
        return self.folder / f"{self.name}_ref.py"


def write_draft(label: str, folder: Path, name: str, kernel: str, reference: str) -> Draft:
    """The draft's files, its spec's `reference` set to its own NumPy function, and its spec."""
    folder.mkdir(parents=True, exist_ok=True)
    draft = Draft(label, folder, name, kernel, reference)
    draft.ref_path.write_text(reference)
    try:
        source = SourceFile(kernel, str(draft.cu_path))
        k = source.kernel(name)
        if k.spec_comment is not None:
            comment = k.spec_comment
            new = set_spec_key(comment.text, "reference", f"{draft.ref_path.name}:{name}")
            kernel = kernel[: comment.span.start] + new + kernel[comment.span.end :]
            draft.kernel_text = kernel
        draft.cu_path.write_text(kernel)
        draft.source = SourceFile(kernel, str(draft.cu_path))
        draft.spec = parse_spec(draft.source, draft.source.kernel(name))
    except OptimlError as e:
        draft.cu_path.write_text(kernel)
        draft.problem = f"{e}"
    return draft


def interface(spec: Spec) -> tuple:
    """What two drafts must share to be run against each other: buffers (name, role, type),
    size variables and scalars with their values."""
    return (
        tuple(sorted((b.name, b.role, b.dtype) for b in spec.buffers)),
        tuple(sorted(spec.size_vars)),
        tuple(sorted((s.name, s.value.replace(" ", "")) for s in spec.scalars)),
    )


def describe_interface(spec: Spec) -> str:
    buffers = ", ".join(f"{b.name}: {b.role} {b.dtype}[{b.length}]" for b in spec.buffers)
    scalars = ", ".join(f"{s.name} = {s.value}" for s in spec.scalars)
    return f"buffers {buffers}; sizes {', '.join(spec.size_vars)}" + (
        f"; scalars {scalars}" if scalars else ""
    )


def small_cases(spec: Spec) -> list[Case]:
    """The spec's first two sizes shrunk for the host: the largest size variable halved until
    every buffer has at most MAX_ELEMENTS elements and the launch MAX_THREADS threads."""
    cases: list[Case] = []
    for sizes in spec.sizes[:2]:
        current = dict(sizes)
        for _ in range(200):
            try:
                case = spec.case(current)
            except ExprError:
                break
            threads = np.prod(case.grid, dtype=np.int64) * np.prod(case.block, dtype=np.int64)
            if max(case.lengths.values(), default=0) <= MAX_ELEMENTS and threads <= MAX_THREADS:
                if all(c.sizes != case.sizes for c in cases):
                    cases.append(case)
                break
            biggest = max(current, key=lambda v: current[v])
            if current[biggest] <= 1:
                break
            current[biggest] = (current[biggest] + 1) // 2
    return cases


def make_inputs(spec: Spec, cases: list[Case], folder: Path) -> None:
    """Each case's buffers as the harness's generator makes them (outputs poisoned with NaN, or
    a sentinel for integers), written raw to `folder/N.NAME`."""
    folder.mkdir(parents=True, exist_ok=True)
    order = sorted(b.name for b in spec.buffers)
    for n, case in enumerate(cases):
        for b in spec.buffers:
            d = DTYPES[b.dtype]
            length = case.lengths[b.name]
            if b.role == "out":
                fill = np.nan if d.is_float else -123456789
                data = (
                    inputs._as_float_code(b.dtype, np.full(length, fill))
                    if d.is_float
                    else (np.full(length, fill, dtype=np.int64).astype(d.np_dtype()))
                )
            else:
                lo, hi = case.ranges.get(b.name, (d.low, d.high))
                data = inputs.generate(b.dtype, order.index(b.name), length, SEED + n, lo, hi)
            data.tofile(folder / f"{n}.{b.name}")


def run_reference(draft: Draft, cases: list[Case], inputs_dir: Path, timeout_s: float = 120.0):
    """The reference's outputs per case (by output name, float64), or the reason it failed."""
    spec = draft.spec
    assert spec is not None and spec.reference.path is not None
    out = inputs_dir.parent / f"ref-{draft.label}"
    out.mkdir(parents=True, exist_ok=True)
    plan = {"out": str(out), "cases": []}
    for n, case in enumerate(cases):
        args: list[object] = []
        for p in spec.params:
            b = spec.buffer(p)
            if b is None:
                args.append(case.sizes.get(p, case.scalars.get(p)))
                continue
            d = DTYPES[b.dtype]
            raw = np.fromfile(inputs_dir / f"{n}.{b.name}", dtype=d.np_dtype())
            array = as_float64(b.dtype, raw).astype(np.float32) if b.dtype == "bf16" else raw
            path = out / f"{n}.{b.name}.npy"
            np.save(path, array)
            args.append(str(path))
        plan["cases"].append({"args": args})
    try:
        ran = subprocess.run(
            [sys.executable, "-c", _DRIVER, spec.reference.path, spec.reference.function],
            input=json.dumps(plan),
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        return f"the reference did not finish within {timeout_s:.0f} s"
    if ran.returncode != 0:
        last = (ran.stderr.strip().splitlines() or ["no message"])[-1]
        return f"the reference failed: {last[:200]}"
    outputs = [b for b in spec.buffers if b.role != "in"]
    results = []
    for n, case in enumerate(cases):
        with np.load(out / f"{n}.npz") as saved:
            arrays = [saved[f"arr_{i}"] for i in range(len(saved.files))]
        if len(arrays) != len(outputs):
            return f"the reference returns {len(arrays)} arrays for {len(outputs)} outputs"
        got = {}
        for b, a in zip(outputs, arrays, strict=True):
            if a.size != case.lengths[b.name]:
                return (
                    f"the reference's `{b.name}` has {a.size} elements, not {case.lengths[b.name]}"
                )
            got[b.name] = _rounded(b.dtype, a.reshape(-1))
        results.append(got)
    return results


def _rounded(code: str, values: np.ndarray) -> np.ndarray:
    """float64 values rounded to the output's type, as the harness compares them."""
    d = DTYPES[code]
    if not d.is_float:
        return values.astype(d.np_dtype()).astype(np.float64)
    return as_float64(code, inputs._as_float_code(code, values))


@dataclass
class Cell:
    agrees: bool
    detail: str  # "agrees", or the first mismatch / why it could not be compared


def compare(
    kernel: HostRun, ref: list[dict[str, np.ndarray]] | str, spec: Spec, cases: list[Case]
) -> Cell:
    if kernel.status != "ok":
        return Cell(False, f"kernel {kernel.status}: {kernel.detail}")
    if isinstance(ref, str):
        return Cell(False, ref)
    for n, case in enumerate(cases):
        for b in spec.buffers:
            if b.role == "in":
                continue
            want, got = ref[n][b.name], kernel.outputs[n][b.name]
            rtol, atol = spec.tolerance(DTYPES[b.dtype])
            ok = (np.abs(got - want) <= atol + rtol * np.abs(want)) | (
                np.isnan(got) & np.isnan(want)
            )
            if not ok.all():
                i = int(np.argmin(ok))
                bad = int((~ok).sum())
                return Cell(
                    False,
                    f"{b.name}[{i}] = {got[i]:.6g}, reference {want[i]:.6g} "
                    f"({bad} of {ok.size} elements outside rtol {rtol:g}, atol {atol:g}; "
                    f"at {case.label})",
                )
    return Cell(True, "agrees")


@dataclass
class Matrix:
    """Kernels (rows) against references (columns) at `cases`, and the oracle chosen."""

    kernels: list[str]
    references: list[str]
    cells: list[list[Cell]]
    sizes: list[dict[str, int]]
    votes: dict[str, int] = field(default_factory=dict)
    oracle: str | None = None
    why: str = ""

    def as_dict(self) -> dict:
        return {
            "kernels": self.kernels,
            "references": self.references,
            "sizes": self.sizes,
            "agrees": [[c.agrees for c in row] for row in self.cells],
            "details": [[c.detail for c in row] for row in self.cells],
            "votes": self.votes,
            "oracle": self.oracle,
            "why": self.why,
            "check": "CPU check: kernels run as host C++ at small sizes",
        }

    def text(self) -> str:
        """The matrix as lines a person or a model can read."""
        lines = [
            f"sizes: {'; '.join(', '.join(f'{k}={v}' for k, v in s.items()) for s in self.sizes)}"
        ]
        for k, row in zip(self.kernels, self.cells, strict=True):
            for r, c in zip(self.references, row, strict=True):
                lines.append(f"kernel {k} vs reference {r}: {c.detail}")
        lines.append(f"votes: {', '.join(f'{r} {v}' for r, v in self.votes.items())}")
        return "\n".join(lines)


class Evaluator:
    """Runs drafts on the host in one work folder; a kernel already built is not built again."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self._inputs: dict[tuple, Path] = {}

    def _inputs_for(self, spec: Spec, cases: list[Case]) -> Path:
        key = (interface(spec), tuple(tuple(sorted(c.sizes.items())) for c in cases))
        if key not in self._inputs:
            folder = self.workdir / f"inputs-{len(self._inputs)}"
            make_inputs(spec, cases, folder)
            self._inputs[key] = folder
        return self._inputs[key]

    def run_kernel(self, draft: Draft, cases: list[Case], inputs_dir: Path) -> HostRun:
        if draft.spec is None or draft.source is None:
            return HostRun("bad_spec", draft.problem or "no spec")
        return run_on_host(
            draft.source, draft.name, draft.spec, cases, inputs_dir, self.workdir / "host"
        )

    def matrix(
        self, kernels: list[Draft], references: list[Draft], final_say: str | None
    ) -> Matrix:
        """Every kernel against every reference at the small sizes of the first reference's
        spec (the formula's, where there is one). `final_say` names the reference that is the
        oracle whatever the votes (the formula's)."""
        base = next((r.spec for r in references if r.spec is not None), None)
        if base is None:
            raise OptimlError("no draft has a spec that parses, so no draft can be checked")
        cases = small_cases(base)
        inputs_dir = self._inputs_for(base, cases)
        shape = interface(base)
        refs = {}
        for r in references:
            if r.spec is None:
                refs[r.label] = f"its spec does not parse: {r.problem}"
            elif interface(r.spec) != shape:
                refs[r.label] = f"another interface: {describe_interface(r.spec)}"
            else:
                refs[r.label] = run_reference(r, cases, inputs_dir)
        cells = []
        for k in kernels:
            if k.spec is not None and interface(k.spec) != shape:
                run = HostRun("other_interface", describe_interface(k.spec))
            else:
                run = self.run_kernel(k, cases, inputs_dir)
            row = []
            for r in references:
                spec = r.spec if r.spec is not None else base
                row.append(compare(run, refs[r.label], spec, cases))
            cells.append(row)
        m = Matrix(
            [k.label for k in kernels],
            [r.label for r in references],
            cells,
            [c.sizes for c in cases],
        )
        m.votes = {r.label: sum(row[j].agrees for row in cells) for j, r in enumerate(references)}
        if final_say is not None:
            m.oracle = final_say
            m.why = f"{final_say} is the formula's float64 reference: it has the final say"
        else:
            ranked = Counter(m.votes).most_common()
            best, count = ranked[0]
            tied = [r for r, v in ranked if v == count]
            if count == 0:
                m.why = "no kernel agrees with any reference"
            else:
                m.oracle = best
                m.why = f"{best}: {count} of {len(kernels)} kernels agree with it" + (
                    f" (tied with {', '.join(tied[1:])}; the first in order is taken)"
                    if len(tied) > 1
                    else ""
                )
        return m

    def check(self, kernel: Draft, oracle: Draft) -> Cell:
        """The final kernel against the oracle at the oracle's small sizes (the CPU check)."""
        if oracle.spec is None:
            return Cell(False, f"the oracle's spec does not parse: {oracle.problem}")
        return self.matrix([kernel], [oracle], oracle.label).cells[0][0]
