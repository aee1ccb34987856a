"""`optiml generate`'s work apart from printing: the formula from the command line, from a
comment of a file or translated from a PyTorch module (`--from-torch`), the files written (never
the user's own), and `optiml check` on the result."""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from optiml.errors import FormulaError, InputFileError, UsageError
from optiml.generate import FormulaSource, Generated, generate
from optiml.generate.from_torch import Translation, translate
from optiml.generate.options import MotOptions
from optiml.generate.parser import parse

_COMMENT_LINE = re.compile(r"^(\s*)//")


@dataclass
class GenerateResult:
    name: str
    generated: Generated | None  # None for a task in prose
    checked_path: str
    check: dict  # what `optiml check --json` prints for the written file
    written: list[Path] = field(default_factory=list)
    printed: str | None = None  # the kernel, with `--out -`
    notes: list[str] = field(default_factory=list)
    translation: Translation | None = None  # with --from-torch


def formula_at(text: str, path: str, line: int) -> tuple[FormulaSource, int]:
    """The formula in the comment that starts at `line` (1-based) of a file's text, with the
    comment markers blanked so that columns stay the file's, and the comment's last line."""
    lines = text.split("\n")
    if line > len(lines):
        raise UsageError(f"{path} has {len(lines)} lines; --line {line} is past its end")
    first = lines[line - 1]
    body: list[str] = []
    if _COMMENT_LINE.match(first):
        end = line - 1
        while end < len(lines) and _COMMENT_LINE.match(lines[end]):
            body.append(_COMMENT_LINE.sub(lambda m: " " * (len(m.group(1)) + 2), lines[end]))
            end += 1
        return FormulaSource("\n".join(body), path, line), end
    if "/*" in first:
        start = first.index("/*")
        end = line - 1
        current = " " * (start + 2) + first[start + 2 :]
        while True:
            if "*/" in current:
                body.append(current[: current.index("*/")])
                break
            body.append(current)
            end += 1
            if end >= len(lines):
                raise UsageError(f"{path}:{line}: the comment that starts here is never closed")
            current = re.sub(r"^(\s*)\*(?!/)", lambda m: " " * (len(m.group(1)) + 1), lines[end])
        return FormulaSource("\n".join(body), path, line), end + 1
    raise UsageError(
        f"{path}:{line}: this line is not a comment; --line names the line where the comment "
        "with the formula starts (`// y[i] = ...` or `/* ... */`)"
    )


def _stem(out: str) -> Path:
    path = Path(out)
    return path.with_suffix("") if path.suffix == ".cu" else path


def _kernel_name(name: str | None, out: str | None) -> str:
    if name:
        return name
    if out and out != "-":
        stem = re.sub(r"\W", "_", _stem(out).name)
        return stem if stem and not stem[0].isdigit() else f"k_{stem}"
    return "generated"


def read_task(path: str) -> str:
    """The text of a PyTorch task file (never imported: --from-torch reads it with `ast`)."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise InputFileError(f"no such file: {p} (--from-torch reads a PyTorch module)") from None
    except IsADirectoryError:
        raise InputFileError(f"{p} is a directory, not a Python file") from None
    except OSError as e:
        raise InputFileError(f"cannot read {p}: {e.strerror or e}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputFileError(f"{p} is not UTF-8 text (byte {e.start})") from None


def translate_task(path: str) -> tuple[Translation, FormulaSource]:
    """A task file's translation and the formula that goes to `generate`, whose first line says
    where it comes from."""
    t = translate(read_task(path), path)
    text = f"// from {Path(path).name} (optiml generate --from-torch)\n{t.formula}"
    return t, FormulaSource(text, "<translated formula>", 0)


def _generate_translated(
    t: Translation, source: FormulaSource, name: str, ref_file: str, **kw: Any
):
    """`generate` of a translated formula; a formula the notation's checker refuses (a size past
    what an `int` holds, say) is an error at forward's return, not in a formula nobody wrote."""
    try:
        return generate(source, name, ref_file, **kw)
    except FormulaError as e:
        if e.position is None:  # the kernel's name, not the formula
            raise
        raise FormulaError(
            f"the formula translated from forward is not accepted: {e.message}", t.position
        ) from None


def run_generate(
    formula: str | None,
    line: int | None,
    out: str | None,
    name: str | None,
    arch: str | None,
    from_torch: str | None = None,
    mot: MotOptions | None = None,
    plain: bool = False,
) -> GenerateResult:
    from optiml.check import check_file
    from optiml.cuda.source import read_text

    mot = mot or MotOptions()
    scheduling: dict[str, Any] = {"schedule": not plain, "arch": arch}
    if line is None and (mot.enabled or (from_torch is None and not is_formula(formula))):
        return run_mot(formula, out, name, arch, from_torch, mot)
    translation = None
    if from_torch is not None:
        translation, source = translate_task(from_torch)
        kernel_name = name or translation.name
    else:
        kernel_name = _kernel_name(name, out)
    if translation is not None:
        base = _stem(out) if out and out != "-" else Path(kernel_name)
        ref_file = f"{base.name}_ref.py"
        g = _generate_translated(translation, source, kernel_name, ref_file, **scheduling)
        one_line = "; ".join(translation.formula.splitlines())
        where = f"{translation.position.path}:{translation.position.line}"
        g.notes = [f"forward ({where}) as a formula: {one_line}", *translation.notes, *g.notes]
        cu = g.kernel
        user_file = Path(from_torch)
    elif line is not None:
        user_file = Path(formula)
        if not user_file.is_file():
            raise InputFileError(f"{formula}: no such file (with --line, FORMULA is a .cu file)")
        text = read_text(user_file)
        source, after = formula_at(text, formula, line)
        base = (
            _stem(out)
            if out and out != "-"
            else user_file.with_name(f"{user_file.stem}.{kernel_name}")
        )
        ref_file = f"{base.name}_ref.py"
        g = generate(source, kernel_name, ref_file, **scheduling)
        lines = text.split("\n")
        cu = "\n".join([*lines[:after], "", g.kernel.rstrip("\n"), *lines[after:]])
    else:
        base = _stem(out) if out and out != "-" else Path(kernel_name)
        ref_file = f"{base.name}_ref.py"
        g = generate(FormulaSource(formula), kernel_name, ref_file, **scheduling)
        cu = g.kernel
        user_file = None
    if out == "-":
        with tempfile.TemporaryDirectory(prefix="optiml-generate-") as tmp:
            cu_path = Path(tmp) / f"{base.name}.cu"
            cu_path.write_text(cu)
            (Path(tmp) / ref_file).write_text(g.reference)
            data = check_file(cu_path, kernel_name, arch).to_json()
        return GenerateResult(
            kernel_name,
            g,
            str(cu_path.name),
            data,
            printed=cu,
            notes=list(g.notes),
            translation=translation,
        )
    cu_path = base.with_name(base.name + ".cu")
    ref_path = base.with_name(ref_file)
    for p in (cu_path, ref_path):
        if user_file is not None and p.resolve() == user_file.resolve():
            raise UsageError(
                f"--out would overwrite {user_file}; the formula's or task's file is never changed"
            )
    cu_path.parent.mkdir(parents=True, exist_ok=True)
    cu_path.write_text(cu)
    ref_path.write_text(g.reference)
    data = check_file(cu_path, kernel_name, arch).to_json()
    return GenerateResult(
        kernel_name,
        g,
        str(cu_path),
        data,
        written=[cu_path, ref_path],
        notes=list(g.notes),
        translation=translation,
    )


# ---- the Mixture-of-Thoughts path (an LLM) -------------------------------------------------------

OFFLINE_HINT = (
    "offline, `optiml generate` takes a formula in index notation, e.g. "
    "`float x[T, C], b[C]; y[t, c] = max(x[t, c] + b[c], 0)` (docs/generate.md); for prose, "
    "configure an LLM: OPTIML_LLM_PROVIDER (openai, anthropic, openai-compatible) and "
    "OPTIML_LLM_MODEL, or [llm] in optiml.toml, and the provider's API key (docs/llm.md)"
)


def formula_problem(text: str) -> FormulaError | None:
    """Why `text` does not parse as a formula, or None where it does: the parser decides prose
    from formula (a formula that parses but is wrong stays a formula's error)."""
    try:
        parse(FormulaSource(text))
    except FormulaError as e:
        return e
    return None


def is_formula(text: str | None) -> bool:
    return text is None or formula_problem(text) is None


def run_mot(
    task: str | None,
    out: str | None,
    name: str | None,
    arch: str | None,
    from_torch: str | None,
    mot: MotOptions,
) -> GenerateResult:
    """The kernel from a task in prose, or a formula with --mot, by the LLM's experts, verified by
    agreement (optiml.generate.mot); the files under the `--out` folder."""
    from optiml.check import check_file
    from optiml.generate.mot import run_experts
    from optiml.llm import load_settings

    if out == "-":
        raise UsageError(
            "--out - prints a formula's kernel; the LLM path writes a folder (--out DIR)"
        )
    formula: Generated | None = None
    translation = None
    if from_torch is not None:
        translation, source = translate_task(from_torch)
        kernel_name = name or translation.name
        # the formula's plain kernel: the interface the experts keep, and its float64 reference
        formula = _generate_translated(
            translation, source, kernel_name, f"{kernel_name}_ref.py", schedule=False
        )
        task = f"the PyTorch module's forward, as this formula: {translation.formula}"
    else:
        assert task is not None
        problem = formula_problem(task)
        kernel_name = name or (_kernel_name(None, out) if out else "generated")
        if problem is None:
            formula = generate(
                FormulaSource(task), kernel_name, f"{kernel_name}_ref.py", schedule=False
            )
    settings = load_settings({"replay": True if mot.replay else None}, start_dir=Path.cwd())
    if settings.provider == "offline":
        if formula is None:
            raise FormulaError(
                f"{problem.message}; read as a task in prose, it needs an LLM and none is "
                f"configured: {OFFLINE_HINT}",
                problem.position,
            )
        raise UsageError(f"--mot needs an LLM and none is configured; {OFFLINE_HINT}")
    out_dir = Path(out) if out else Path(kernel_name)
    result = run_experts(task, kernel_name, out_dir, settings, mot, formula)
    data = check_file(result.kernel_path, kernel_name, arch).to_json()
    return GenerateResult(
        kernel_name,
        formula,
        str(result.kernel_path),
        data,
        written=[result.kernel_path, result.reference_path, result.trajectory_path],
        notes=[*(formula.notes if formula else []), *result.notes],
        translation=translation,
    )
