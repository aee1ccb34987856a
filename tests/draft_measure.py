"""Measuring drafted specs against hand-written ones: each kernel's spec is removed from its file
(host code kept), drafted again, and the draft compared with what its author wrote, at the
author's sizes: every buffer's name, role, element type and length (evaluated at each size), the
launch's grid and block (where the file has a launch to read), and the size variables."""

from __future__ import annotations

import tomllib
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from optiml.cuda.draft import draft
from optiml.cuda.source import SourceFile
from optiml.errors import SourceWarning
from optiml.expr import ExprError
from optiml.spec import Spec, SpecError, parse_spec

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Measured:
    label: str
    args: bool = False
    launch: bool | None = None  # None: the file has no launch of the kernel
    sizes: bool = False
    why: list[str] = field(default_factory=list)
    text: str = ""


def entries() -> list[tuple[Path, str]]:
    out = []
    wild = ROOT / "fixtures" / "wild"
    for e in tomllib.loads((wild / "manifest.toml").read_text())["fixture"]:
        out.append((wild / e["file"], e["kernel"]))
    corpus = ROOT / "fixtures" / "corpus"
    for e in tomllib.loads((corpus / "manifest.toml").read_text())["kernel"]:
        out.append((corpus / e["file"], e["kernel"]))
    own = ROOT / "tests" / "data" / "draft"
    for e in tomllib.loads((own / "manifest.toml").read_text()).get("kernel", []):
        out.append((own / e["file"], e["kernel"]))
    return out


def unseen() -> set[str]:
    """The labels of the programs written after the drafting rules were settled."""
    own = ROOT / "tests" / "data" / "draft"
    return {
        f"draft/{e['file']}::{e['kernel']}"
        for e in tomllib.loads((own / "manifest.toml").read_text()).get("kernel", [])
        if e.get("unseen")
    }


def without_spec(source: SourceFile, kernel_name: str) -> SourceFile:
    """The file with the kernel's spec comment blanked (line for line), everything else kept."""
    k = source.kernel(kernel_name)
    s = k.spec_comment.span
    blank = "".join("\n" if c == "\n" else " " for c in source.text[s.start : s.end])
    return SourceFile(source.text[: s.start] + blank + source.text[s.end :], source.path)


def with_text(source: SourceFile, kernel_name: str, text: str) -> SourceFile:
    k = source.kernel(kernel_name)
    at = k.span.start
    return SourceFile(source.text[:at] + text + source.text[at:], source.path)


def measure(path: Path, kernel: str) -> Measured:
    original = SourceFile.read(path)
    written = parse_spec(original, original.kernel(kernel))
    bare = without_spec(original, kernel)
    m = Measured(f"{path.parent.name}/{path.name}::{kernel}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SourceWarning)
        d = draft(bare, bare.kernel(kernel), compile=False)
    m.text = d.text
    try:
        src = with_text(bare, kernel, d.text)
        drafted = parse_spec(src, src.kernel(kernel))
    except SpecError as e:
        m.why.append(f"the draft does not parse: {e}")
        return m
    m.sizes = set(drafted.size_vars) == set(written.size_vars)
    if not m.sizes:
        m.why.append(f"sizes {drafted.size_vars} vs {written.size_vars}")
    args_ok, launch_ok = _names_roles_types(drafted, written, m), True
    for size in written.sizes:
        try:
            w = written.case(size)
        except ExprError:
            continue
        env = {**w.sizes, **{k: v for k, v in w.scalars.items() if isinstance(v, int)}}
        for s in drafted.scalars:  # `n = N`: the draft names a size after the host's variable
            if s.value.strip() not in env and s.name in env and s.value.strip().isidentifier():
                env[s.value.strip()] = env[s.name]
        try:
            dc = drafted.case({v: env[v] for v in drafted.size_vars})
        except (KeyError, ExprError) as e:
            m.why.append(f"the draft cannot be evaluated at {size}: {e}")
            args_ok = launch_ok = False
            break
        for name, n in w.lengths.items():
            if dc.lengths.get(name) != n:
                args_ok = False
                m.why.append(f"`{name}` length {dc.lengths.get(name)} vs {n} at {size}")
        if (dc.grid, dc.block) != (w.grid, w.block):
            launch_ok = False
            m.why.append(f"launch {dc.grid}x{dc.block} vs {w.grid}x{w.block} at {size}")
    m.args = args_ok
    m.launch = launch_ok if d.launch_line is not None else None
    return m


def _names_roles_types(drafted: Spec, written: Spec, m: Measured) -> bool:
    ok = True
    wb = {b.name: b for b in written.buffers}
    db = {b.name: b for b in drafted.buffers}
    if set(wb) != set(db):
        m.why.append(f"buffers {sorted(db)} vs {sorted(wb)}")
        return False
    for name, b in wb.items():
        got = db[name]
        if (got.role, got.dtype, got.lanes) != (b.role, b.dtype, b.lanes):
            ok = False
            m.why.append(
                f"`{name}`: {got.role} {got.dtype}x{got.lanes} vs {b.role} {b.dtype}x{b.lanes}"
            )
    return ok
