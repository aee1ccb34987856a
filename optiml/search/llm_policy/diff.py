"""Reading the code in an answer: a Markdown fence taken off, a unified diff applied strictly."""

from __future__ import annotations

import re


class DiffError(ValueError):
    pass


_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_FENCE = re.compile(r"^\s*```[A-Za-z0-9_+-]*[ \t]*\n(.*?)\n?```\s*$", re.DOTALL)


def strip_fence(text: str) -> str:
    """`text` without a Markdown code fence around it."""
    m = _FENCE.match(text)
    return m.group(1) if m else text


def apply_unified_diff(original: str, diff: str) -> str:
    """`original` with the unified diff `diff` applied.

    Strict about content: every hunk's context and removed lines must match consecutive lines of
    `original` exactly (trailing whitespace aside), in order, and each hunk must match at one place
    only (its stated line first). The line counts of the `@@` headers are not checked, since the
    lines themselves say what the hunk is. Raises `DiffError` saying which hunk does not apply.
    """
    lines = original.split("\n")
    body = strip_fence(diff).strip("\n").split("\n")
    hunks: list[tuple[int, list[str], list[str]]] = []
    i = 0
    files = 0
    while i < len(body):
        line = body[i]
        m = _HUNK.match(line)
        if m is None:
            if line.startswith("--- ") and i + 1 < len(body) and body[i + 1].startswith("+++ "):
                files += 1
                if files > 1:
                    raise DiffError("the diff changes more than one file")
                i += 2
                continue
            if hunks or not (line.startswith(("diff ", "index ")) or not line.strip()):
                raise DiffError(f"line {i + 1} of the diff is not part of a hunk: {line[:80]!r}")
            i += 1
            continue
        old, new = [], []
        i += 1
        while i < len(body) and not _HUNK.match(body[i]):
            line = body[i]
            if line.startswith("--- ") and i + 1 < len(body) and body[i + 1].startswith("+++ "):
                break
            if line.startswith("\\"):  # "\ No newline at end of file"
                pass
            elif line == "" or line[0] == " ":
                old.append(line[1:])
                new.append(line[1:])
            elif line[0] == "-":
                old.append(line[1:])
            elif line[0] == "+":
                new.append(line[1:])
            else:
                raise DiffError(
                    f"hunk {len(hunks) + 1}: line {i + 1} starts with neither ' ', '-' nor '+'"
                )
            i += 1
        hunks.append((int(m.group(1)), old, new))
    if not hunks:
        raise DiffError("the diff has no @@ hunks")
    out: list[str] = []
    cursor = 0
    stripped = [line.rstrip() for line in lines]
    for number, (start, old, new) in enumerate(hunks, 1):
        if old == new:
            continue
        if not old:
            at = min(max(start, cursor), len(lines))  # `-N,0`: insert after line N
        else:
            want = [line.rstrip() for line in old]
            width = len(want)
            places = [
                p for p in range(cursor, len(lines) - width + 1) if stripped[p : p + width] == want
            ]
            if not places:
                raise DiffError(
                    f"hunk {number} does not apply: its lines from {old[0].strip()[:60]!r} on "
                    "are not in the code"
                )
            if start - 1 in places:
                at = start - 1
            elif len(places) == 1:
                at = places[0]
            else:
                raise DiffError(f"hunk {number} matches {len(places)} places in the code")
        out += lines[cursor:at] + new
        cursor = at + len(old)
    return "\n".join(out + lines[cursor:])
