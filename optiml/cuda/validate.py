"""Checking a drafted spec before it is shown.

Three checks, each cheap: the draft parses and agrees with the signature (`optiml.spec`); the
file compiles with it (`optiml.check.check_source`: one nvcc run, cached by content; a template
is compiled at the draft's instantiation); and, where the kernel lifts, every access stays
inside its buffer at the draft's smallest size: the largest element each access reaches
(`optiml.cuda.extent`, with the draft's value ranges for loaded indices and its grid for block
indices no guard bounds, else the element type's default inputs) must be below the drafted
length. What fails is said in one line
each; what could not be checked (no nvcc, a model that does not lift) is said too.

`outputs_written` is the check that needs a GPU: the kernel run once at the smallest size with
its `out` buffers poisoned, every element checked to be written.

This is the one module of `optiml.cuda` that runs a compiler (through `optiml.check`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from optiml.cuda.extent import extents, poly_value
from optiml.cuda.source import Kernel, SourceFile
from optiml.errors import OptimlError, SpecError, ToolMissing
from optiml.expr import ExprError


@dataclass
class Validation:
    problems: list[str] = field(default_factory=list)  # what failed, one line each
    unchecked: list[str] = field(default_factory=list)  # what could not be checked, and why

    @property
    def ok(self) -> bool:
        return not self.problems


def placed(source: SourceFile, kernel: Kernel, text: str) -> SourceFile:
    """The file with `text` right above the kernel (its lines shift; nothing else changes)."""
    at = kernel.span.start
    return SourceFile(source.text[:at] + text + source.text[at:], source.path)


def validate(
    source: SourceFile, kernel: Kernel, text: str, lifted=None, compile: bool = True
) -> Validation:
    """Check the drafted comment `text` for `kernel` (see the module's text). `lifted`: the
    kernel's lifted model, if any; `compile`: run nvcc (off for measuring many drafts)."""
    from optiml.spec import parse_spec

    out = Validation()
    src = placed(source, kernel, text)
    try:
        spec = parse_spec(src, src.kernel(kernel.name))
    except SpecError as e:
        out.problems.append(f"the draft does not parse: {_one_line(e)}")
        return out
    try:
        case = min(spec.cases(), key=lambda c: sum(c.lengths.values()))
    except (ExprError, ValueError) as e:
        out.problems.append(f"the draft's sizes cannot be evaluated: {_one_line(e)}")
        return out
    if compile:
        _compile(src, kernel.name, out)
    if lifted is None:
        out.unchecked.append("accesses not checked against the lengths: the kernel does not lift")
        return out
    _reach(lifted, spec, case, out)
    return out


def _one_line(e: Exception) -> str:
    return " ".join(str(e).split())


def _compile(src: SourceFile, kernel: str, out: Validation) -> None:
    from optiml.check import check_source

    try:
        result = check_source(src, kernel)
    except ToolMissing as e:
        out.unchecked.append(f"not compiled: {_one_line(e)}")
        return
    except OptimlError as e:
        out.problems.append(f"the file does not compile with the draft: {_one_line(e)}")
        return
    if result.compile_failed:
        errors = [m for c in result.kernels for m in c.messages if m.severity == "error"]
        first = errors[0].message if errors else "nvcc failed"
        out.problems.append(f"the file does not compile with the draft: {first}")


def _env(spec, case) -> dict[str, int]:
    env = {k: v for k, v in case.scalars.items() if isinstance(v, int)}
    env.update(case.sizes)
    env.update({k: int(v) for k, v in spec.template_values.items()})
    return env


def _reach(lifted, spec, case, out: Validation) -> None:
    """Every access's largest element below its buffer's drafted length, at `case`."""
    from optiml.cuda import types as ctypes

    env = _env(spec, case)
    ext = extents(lifted, env)
    for b in spec.buffers:  # a loaded index: below its range, else its type's default inputs'
        d = ctypes.DTYPES.get(b.dtype)
        high = case.ranges[b.name][1] if b.name in case.ranges else d.high if d else None
        if high is not None:
            env[f"?{b.name}"] = int(np.ceil(high)) - 1
    for i, d in enumerate("xyz"):
        env[f"?blockIdx.{d}"] = case.grid[i] - 1
        env[f"?g.{d}"] = case.grid[i] * case.block[i] - 1
    label = ", ".join(f"{k} = {v}" for k, v in case.sizes.items())
    for tensor, polys in ext.lengths.items():
        length = case.lengths.get(tensor)
        if length is None:
            continue
        needs = [poly_value(q, env) for q in polys]
        known = [n for n in needs if n is not None]
        if known and max(known) > length:
            out.problems.append(
                f"`{tensor}` is accessed up to element {max(known) - 1} at {label},"
                f" beyond its {length} drafted elements"
            )


def outputs_written(source: SourceFile, kernel: Kernel, text: str, arch: str | None = None):
    """On a GPU: the kernel with the drafted spec `text`, run once at the draft's smallest size
    with every `out` buffer poisoned (NaN for floating types) and checked after the launch: a
    `Verdict`, `ok` where every output element was written, `wrong_result` naming the first
    element that was not (a drafted length longer than what the kernel writes, or a launch too
    small to cover it), `runtime_error` where an access falls outside a drafted length."""
    from optiml.harness.evaluate import EvalOptions, evaluate_source
    from optiml.spec import parse_spec

    src = placed(source, kernel, text)
    spec = parse_spec(src, src.kernel(kernel.name))
    smallest = min(spec.cases(), key=lambda c: sum(c.lengths.values()))
    options = EvalOptions(
        arch=arch,
        time=False,
        seeds=(1,),
        sizes=[smallest.sizes],
        oracle=False,
        floor=False,
        dependence=0,
    )
    return evaluate_source(src, kernel.name, None, options)
