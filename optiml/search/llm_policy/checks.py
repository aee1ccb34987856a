"""The checks an edit passes before it becomes a candidate of the search, in this order; a failed
one raises `EditRejected` with the reason and the stage:

1. apply: exactly one of `code` (the complete new text) or `diff` (a unified diff, applied by a
   small, strict applier: context and removed lines must match exactly) is given and applies;
2. parse: the result parses (tree-sitter), with no syntax error inside the edited text;
3. signature: a kernel of the same name exists, with the same template and parameter names, types
   and order (`const` and `__restrict__` may be added);
4. spec: the spec comment is the original's (a change of its launch line alone counts as a launch
   change), the launch fields of the edit are set into it, and the spec parses and evaluates at
   every size;
5. flags: extra nvcc flags are on the allow-list;
6. unchanged: the edit changes something;
7. compile: nvcc compiles the candidate for the search's architecture (the build is cached, so the
   evaluation later reuses it).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from optiml.cuda.source import Kernel, SourceFile
from optiml.errors import OptimlError
from optiml.harness.build import build_kernel
from optiml.search.llm_policy.answers import ProposedEdit
from optiml.search.llm_policy.diff import DiffError, apply_unified_diff, strip_fence
from optiml.search.variant import Variant, launch_value, replace_kernel, set_spec_key
from optiml.spec import Spec, parse_spec

_FLAG_ALLOWED = re.compile(
    r"^(?:-{1,2}use_fast_math|-ftz=(?:true|false)|-prec-div=(?:true|false)"
    r"|-prec-sqrt=(?:true|false)|-fmad=(?:true|false)|--extra-device-vectorization"
    r"|-{1,2}maxrregcount=(?P<regs>\d{2,3}))$"
)


class EditRejected(Exception):
    """An edit failed a check before evaluation; `stage` names the check."""

    def __init__(self, stage: str, reason: str):
        super().__init__(reason)
        self.stage = stage
        self.reason = reason


def _syntax_errors(source: SourceFile, start: int, end: int) -> list[str]:
    """Syntax errors tree-sitter finds within characters [start, end) of `source`."""
    found: list[str] = []
    stack = [source.tree.root_node]
    while stack and len(found) < 3:
        node = stack.pop()
        if not (node.has_error or node.is_missing):
            continue
        span = source.span(node)
        if span.end < start or span.start > end:
            continue
        if node.type == "ERROR" or node.is_missing:
            line = span.start_point[0] + 1
            what = f"missing {node.type}" if node.is_missing else "unexpected text"
            found.append(f"line {line}: {what}: {source.node_text(node).strip()[:60]!r}")
            continue
        stack.extend(reversed(node.children))
    return found


def editable_span(source: SourceFile, kernel: Kernel) -> tuple[int, int]:
    """Where the kernel's spec comment (or the kernel, if it has none) starts, and where it ends."""
    start = kernel.spec_comment.span.start if kernel.spec_comment else kernel.span.start
    return start, kernel.span.end


def _signature_problems(old: Kernel, new: Kernel) -> list[str]:
    problems = []
    if [(p.name, p.kind, p.type_text) for p in old.template_params] != [
        (p.name, p.kind, p.type_text) for p in new.template_params
    ]:
        problems.append("the template parameters changed")
    if len(old.params) != len(new.params):
        problems.append(f"it has {len(new.params)} parameters, not {len(old.params)}")
    for a, b in zip(old.params, new.params, strict=False):
        if (a.name, a.type_text, a.pointer_depth) != (b.name, b.type_text, b.pointer_depth):
            problems.append(f"parameter `{b.declared} {b.name}` was `{a.declared} {a.name}`")
        elif a.const_pointee and not b.const_pointee:
            problems.append(f"parameter `{b.name}` lost `const`")
        elif a.restrict and not b.restrict:
            problems.append(f"parameter `{b.name}` lost `__restrict__`")
    return problems


def _same_lines(a: str, b: str) -> bool:
    return [line.strip() for line in a.strip().splitlines()] == [
        line.strip() for line in b.strip().splitlines()
    ]


def _contract(spec: Spec) -> dict[str, Any]:
    return spec.model_dump(exclude={"launch"})


def _compiler_errors(messages: Iterable[Any], log: str) -> str:
    errors = [m for m in messages if getattr(m, "severity", "") == "error"]
    if errors:
        text = "; ".join(
            (f"line {m.line}: " if m.line else "") + m.message.strip() for m in errors[:3]
        )
    else:
        text = next((ln for ln in reversed(log.strip().splitlines()) if ln.strip()), "nvcc failed")
    return " ".join(text.split())[:400]


def merge_flags(current: tuple[str, ...], extra: Iterable[str]) -> tuple[str, ...]:
    """`current` with the allow-listed `extra` flags added (one value per option: the new wins);
    raises `EditRejected` for a flag off the allow-list."""
    added: list[str] = []
    for raw in extra:
        flag = raw.strip()
        m = _FLAG_ALLOWED.match(flag)
        if m is None:
            raise EditRejected("flags", f"nvcc flag `{flag[:40]}` is not on the allow-list")
        if m.group("regs") is not None and not 16 <= int(m.group("regs")) <= 255:
            raise EditRejected("flags", f"`{flag}`: -maxrregcount takes 16 to 255")
        flag = "-" + flag.lstrip("-") if "use_fast_math" in flag or "maxrreg" in flag else flag
        if flag not in added:
            added.append(flag)
    names = {f.split("=")[0] for f in added}
    return tuple(f for f in current if f.split("=")[0] not in names) + tuple(added)


@dataclass
class PreparedEdit:
    """An edit that passed every check but the compiler's."""

    source: SourceFile
    kernel: Kernel
    spec: Spec
    variant: Variant


def prepare_edit(edit: ProposedEdit, base: Variant, path: str, kernel_name: str) -> PreparedEdit:
    """The variant `edit` makes of `base`, checked up to compilation; else `EditRejected`."""
    source = SourceFile(base.text, path)
    kernel = source.kernel(kernel_name)
    start, end = editable_span(source, kernel)
    region = source.text[start:end]
    original_comment = kernel.spec_comment.text if kernel.spec_comment else None
    base_spec = parse_spec(source, kernel)

    # 1. apply
    if (edit.code is None) == (edit.diff is None) or not (edit.code or edit.diff or "").strip():
        raise EditRejected("apply", "give exactly one of `code` and `diff`")
    if edit.code is not None:
        new_region = strip_fence(edit.code).strip("\n")
    else:
        try:
            new_region = apply_unified_diff(region, edit.diff or "")
        except DiffError as e:
            raise EditRejected("apply", str(e)) from None
    text = source.text[:start] + new_region + source.text[end:]

    # 2. parse
    new_source = SourceFile(text, path)
    before = len(_syntax_errors(source, start, end))
    errors = _syntax_errors(new_source, start, start + len(new_region))
    if len(errors) > before:
        raise EditRejected("parse", "; ".join(errors))

    # 3. signature
    try:
        new_kernel = new_source.kernel(kernel_name)
    except OptimlError as e:
        raise EditRejected("signature", str(e)) from None
    problems = _signature_problems(kernel, new_kernel)
    if problems:
        raise EditRejected("signature", f"`{kernel_name}`: " + "; ".join(problems))

    # 4. spec: the original contract, with the launch the edit sets
    if original_comment is not None:
        comment = original_comment
        given = new_kernel.spec_comment
        launch = base_spec.launch
        if given is not None and not _same_lines(given.text, comment):
            try:
                given_spec = parse_spec(new_source, new_kernel)
            except OptimlError as e:
                raise EditRejected("spec", f"the edited spec comment does not parse: {e}") from None
            if _contract(given_spec) != _contract(base_spec):
                raise EditRejected(
                    "spec",
                    "the edit changes the spec comment beyond its launch; "
                    "change the launch with `grid`, `block` and `smem`",
                )
            launch = given_spec.launch
            comment = set_spec_key(
                comment, "launch", launch_value(launch.grid, launch.block, launch.smem)
            )
        if edit.grid or edit.block or edit.smem:
            grid = [edit.grid.strip()] if edit.grid else launch.grid
            block = [edit.block.strip()] if edit.block else launch.block
            smem = edit.smem.strip() if edit.smem else launch.smem
            comment = set_spec_key(comment, "launch", launch_value(grid, block, smem))
        if given is None:
            # Code without its spec comment: the comment goes back right above the kernel.
            at = new_kernel.span.start
            text = new_source.text[:at] + comment + "\n" + new_source.text[at:]
        else:
            definition = new_source.text[new_kernel.span.start : new_kernel.span.end]
            text = replace_kernel(new_source, new_kernel, definition, comment=comment)
        new_source = SourceFile(text, path)
        new_kernel = new_source.kernel(kernel_name)
    try:
        spec = parse_spec(new_source, new_kernel)
        for size in spec.sizes:
            spec.case(size)
    except (OptimlError, ValueError, ArithmeticError, TypeError) as e:
        raise EditRejected("spec", f"the candidate's spec does not hold: {e}") from None

    # 5. flags
    flags = merge_flags(base.flags, edit.flags)

    # 6. unchanged
    variant = Variant(new_source.text, flags)
    if variant.key == base.key:
        raise EditRejected("unchanged", "the edit changes nothing")
    return PreparedEdit(new_source, new_kernel, spec, variant)


def compile_edit(prepared: PreparedEdit, arch: str) -> None:
    """7. compile: nvcc builds the candidate as the evaluation will (the build is cached)."""
    build = build_kernel(
        prepared.source,
        prepared.kernel,
        instantiation=prepared.spec.instantiation,
        arch=arch,
        flags=prepared.variant.flags,
    )
    if not build.ok:
        raise EditRejected("compile", _compiler_errors(build.messages, build.log))


def check_edit(
    edit: ProposedEdit, base: Variant, path: str, kernel_name: str, arch: str
) -> Variant:
    """The variant `edit` makes of `base`, if it passes every check; else `EditRejected`."""
    prepared = prepare_edit(edit, base, path, kernel_name)
    compile_edit(prepared, arch)
    return prepared.variant
