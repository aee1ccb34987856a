"""A variant of a kernel: the whole candidate file (the user's file with the kernel, its spec comment
and any helpers it needs rewritten) plus the nvcc flags it is built with. The launch configuration
and a template's instantiation live in the candidate's own spec comment, which the evaluation reads
(the contract — arguments, sizes, tolerances, reference — stays the original's).

Also the text surgery every edit shares: replacing one kernel's definition, and rewriting one key
of its spec comment.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import cached_property

from optiml.cuda.source import Kernel, SourceFile
from optiml.harness.build import DEFAULT_FLAGS
from optiml.spec import KEYS


@dataclass(frozen=True)
class Variant:
    """A state of the search: what is compiled and how."""

    text: str
    flags: tuple[str, ...] = DEFAULT_FLAGS

    @cached_property
    def key(self) -> str:
        h = hashlib.sha256(self.text.encode() + b"\0" + " ".join(self.flags).encode())
        return h.hexdigest()[:16]

    def source(self, path: str) -> SourceFile:
        return SourceFile(self.text, path)

    def to_json(self) -> dict:
        return {"text": self.text, "flags": list(self.flags)}

    @classmethod
    def from_json(cls, data: dict) -> Variant:
        return cls(data["text"], tuple(data["flags"]))


def kernel_text(source: SourceFile, kernel: Kernel) -> str:
    """The kernel's definition, from `template <...>` (if any) to its closing brace."""
    return source.text[kernel.span.start : kernel.span.end]


def replace_kernel(
    source: SourceFile,
    kernel: Kernel,
    definition: str,
    *,
    comment: str | None = None,
    helpers: str = "",
) -> str:
    """The file's text with `kernel`'s definition replaced by `definition`, its spec comment by
    `comment` (if given), and `helpers` (device functions the new kernel calls) placed right before
    the spec comment, so nothing else in the file moves relative to it."""
    text = source.text
    start = kernel.span.start
    spec = kernel.spec_comment
    head_start = spec.span.start if spec is not None else start
    between = text[spec.span.end : start] if spec is not None else ""
    old_comment = text[spec.span.start : spec.span.end] if spec is not None else ""
    new_comment = comment if comment is not None else old_comment
    prefix = f"{helpers.rstrip()}\n\n" if helpers.strip() else ""
    return text[:head_start] + prefix + new_comment + between + definition + text[kernel.span.end :]


def spec_comment_text(source: SourceFile, kernel: Kernel) -> str:
    if kernel.spec_comment is None:
        raise ValueError(f"`{kernel.name}` has no @optiml spec")
    return kernel.spec_comment.text


_KEY_LINE = re.compile(
    r"^(?P<lead>\s*(?:/\*+|\*|//+)?\s*)(?:@optiml\s*)?(?P<key>[A-Za-z_]\w*)\s*:(?!:)"
)


def set_spec_key(comment: str, key: str, value: str) -> str:
    """`comment` (an @optiml spec comment) with `key:` set to `value`: the key's line and its
    continuation lines are replaced by one line; a missing key is added before the comment's end."""
    lines = comment.split("\n")
    start = None
    for i, line in enumerate(lines):
        m = _KEY_LINE.match(line)
        if m and m.group("key") == key:
            start = i
            break
    if start is not None:
        end = start + 1
        while end < len(lines):
            m = _KEY_LINE.match(lines[end])
            stripped = lines[end].strip()
            if (
                (m and m.group("key") in KEYS)
                or stripped.startswith("*/")
                or stripped.endswith("*/")
            ):
                break
            if not re.sub(r"^\s*(?:\*|//+)?", "", lines[end]).strip():
                break
            end += 1
        m = _KEY_LINE.match(lines[start])
        lead = lines[start][: m.start("key")]
        rest = lines[start][m.end() :]
        gap = rest[: len(rest) - len(rest.lstrip())] or " "  # keep the column values start at
        return "\n".join(lines[:start] + [f"{lead}{key}:{gap}{value}"] + lines[end:])
    # no such key: add it, with the lead of the last key line
    last = max(i for i, line in enumerate(lines) if _KEY_LINE.match(line))
    m = _KEY_LINE.match(lines[last])
    lead = re.sub(r"@optiml\s*", "", lines[last][: m.start("key")])
    if lines[-1].strip().endswith("*/") and lines[-1].strip() != "*/" and len(lines) == last + 1:
        body, close = lines[-1].rsplit("*/", 1)
        return "\n".join(lines[:-1] + [body.rstrip(), f"{lead}{key}: {value} */{close}"])
    insert = len(lines) - 1 if lines[-1].strip().startswith("*/") else len(lines)
    return "\n".join(lines[:insert] + [f"{lead}{key}: {value}"] + lines[insert:])


def launch_value(
    grid: list[str] | tuple[str, ...], block: list[str] | tuple[str, ...], smem: str = "0"
) -> str:
    def dims(parts) -> str:
        return parts[0] if len(parts) == 1 else f"({', '.join(parts)})"

    out = f"grid = {dims(grid)}, block = {dims(block)}"
    return out if smem in ("0", "") else f"{out}, smem = {smem}"
