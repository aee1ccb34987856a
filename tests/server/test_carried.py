"""Requests answered while a parse is pending: the last parse carried over an edit that cannot
change it (`server.documents.carried`). What a carried model says must be what a parse of the new
text says: its kernels (every position), its lines and the kernels at any point. Edits that could
move a function's end, touch a launch site or add one are not carried."""

from __future__ import annotations

import asyncio
import random
import time

import pytest
from pygls.workspace.position_codec import PositionCodec

from optiml.cuda.source import SourceFile
from server.documents import PARSE_DELAY_S, Documents, Model, Snapshot, carried, parse

SPEC = """/* @optiml
 *   args:   a = 2.5, x: in float[n], y: inout float[n]
 *   launch: grid = cdiv(n, 256), block = 256
 *   sizes:  n = 1 << 20, 1000003
 */
"""
BAD_SPEC = SPEC.replace("inout", "inoot")
KERNEL = """__global__ void k{i}(int n, float a, const float* x, float* y)
{{
    int i = blockIdx.x * blockDim.x + threadIdx.x;  // the element: é
    if (i < n) {{
        float v = x[i] * a + {i}.0f;
        y[i] = a * v + y[i];
    }}
}}

"""
HOST = """
void run(int n, float a, const float* x, float* y)
{
    k0<<<(n + 255) / 256, 256>>>(n, a, x, y);
    k3<<<(n + 255) / 256,
         256>>>(n, a, x, y);
}
"""


def source(kernels: int = 8) -> str:
    parts = ["#include <cuda_runtime.h>\n\n"]
    for i in range(kernels):
        parts.append((BAD_SPEC if i == 5 else SPEC if i % 3 else "") + KERNEL.format(i=i))
    return "".join(parts) + HOST


def model(text: str, version: int = 1, path: str = "/work/a.cu") -> Model:
    return parse(Snapshot(f"file://{path}", version, text), PositionCodec())


def fresh(text: str) -> Model:
    """A parse of `text` from nothing (a path of its own: no earlier tree to start from)."""
    return model(text, path=f"/fresh/{time.perf_counter_ns()}.cu")


def same(a: Model, b: Model) -> None:
    assert a.lines == b.lines
    assert _dumped(a) == _dumped(b)
    assert a.specs.keys() == b.specs.keys()
    for line in range(0, len(a.lines), 3):
        at = (line, 2)
        assert [k.name for k in a.kernels_at(at, at)] == [k.name for k in b.kernels_at(at, at)]


def _dumped(m: Model) -> list[dict]:
    """Every kernel's outline, its spec issues' positions without their path."""
    out = []
    for k in m.kernels:
        d = k.model_dump(exclude={"spec"})
        for issue in d["spec_issues"]:
            issue["position"].pop("path")
        out.append(d)
    return out


def body_line(text: str, kernel: int) -> int:
    return text.split("\n").index(f"        float v = x[i] * a + {kernel}.0f;")


def edit(text: str, line: int, column: int, remove: int, insert: str) -> str:
    lines = text.split("\n")
    offset = sum(len(x) + 1 for x in lines[:line]) + column
    return text[:offset] + insert + text[offset + remove :]


def carry(text: str, new: str) -> Model | None:
    return carried(model(text), Snapshot("file:///work/a.cu", 2, new))


# ---- what is carried, and what it says -----------------------------------------------------


@pytest.mark.parametrize(
    ("what", "column", "remove", "insert"),
    [
        ("a blank", 8, 0, " "),
        ("an identifier", 14, 1, "w"),
        ("a half-typed call, a syntax error", 8, 0, "foo(a, "),
        ("a statement and a line break", 8, 0, "float t = a * (n - 1.0f);\n        "),
        ("a line removed", 0, 30, ""),
        ("a block that closes", 8, 0, "{ a = 1; }"),
    ],
)
def test_edits_in_a_body_are_carried_and_say_what_a_parse_says(what, column, remove, insert):
    text = source()
    line = body_line(text, 4)
    new = edit(text, line, column, remove, insert)
    got = carry(text, new)
    assert got is not None, what
    assert got.snapshot.version == 2 and got.carry is not None
    if not SourceFile(new, "/fresh/x.cu").tree.root_node.has_error:
        same(got, fresh(new))
    # (a syntax error: tree-sitter's recovery may end a function at another brace; the braces
    # say where it ends) every kernel's lines are those of the text before, the edited one's
    # with the edit
    before = model(text)
    assert [k.name for k in got.kernels] == [k.name for k in before.kernels]
    for k, was in zip(got.kernels, before.kernels, strict=True):
        block, old = got.block(k).text, before.block(was).text
        if k.name == "k4":
            at = sum(len(x) + 1 for x in text.split("\n")[was.first_line : line]) + column
            assert block == old[:at] + insert + old[at + remove :]
        else:
            assert block == old


@pytest.mark.parametrize(
    ("what", "find", "insert"),
    [
        ("an opening brace", "        float v", "{"),
        ("a closing brace", "        float v", "}"),
        ("a comment opened", "        float v", "/*"),
        ("a launch typed", "        float v", "k1<<<1, 1>>>(n, a, x, y);"),
        (
            "a signature",
            "const float* x, float* y)\n{\n    int i = blockIdx.x * blockDim.x + threadIdx.x;  // the element: é\n    if (i < n) {\n        float v = x[i] * a + 4.0f;",
            None,
        ),
        ("a spec", " *   sizes:  n = 1 << 20, 1000003\n */\n__global__ void k4", None),
    ],
)
def test_edits_that_could_move_a_function_or_a_launch_wait_for_the_parse(what, find, insert):
    text = source()
    if insert is None:  # an edit outside the body: a character changed in what `find` starts at
        at = text.index(find)
        new = text[:at] + text[at:].replace(
            find, find.replace("1 << 20", "1 << 21").replace("const float* x", "const float* xs"), 1
        )
    else:
        at = text.index(find, text.index("__global__ void k4"))
        new = text[:at] + insert + text[at:]
    assert new != text
    assert carry(text, new) is None, what


@pytest.mark.parametrize(
    ("what", "insert"), [("an unterminated string", '"'), ("a directive", "#define Q 1\n        ")]
)
def test_edits_whose_syntax_changes_stay_in_the_body_are_carried_as_the_parse_sees_them(
    what, insert
):
    """A C string ends at its line; a directive in a body is not the file's (the outline reads the
    file's): tree-sitter finds the syntax changed in the body only, and the parse that follows
    (from the same tree) says what the carried model says."""
    text = source()
    new = edit(text, body_line(text, 4), 8, 0, insert)
    got = carry(text, new)
    assert got is not None, what
    same(got, model(new))  # the server's next parse: from the tree of `text`


def test_a_line_break_in_a_line_comment_is_carried_only_as_the_parse_sees_it():
    """A line break inside `// the element: é` makes the rest of the comment code: a syntax
    error in the body (carried, as the parse sees it); in `// the element: é }`, before the `}`,
    the end of the function (not carried)."""
    text = source()
    line = body_line(text, 4) - 2
    new = edit(text, line, text.split("\n")[line].index("element"), 0, "\n")
    got = carry(text, new)
    assert got is not None
    same(got, model(new))
    text = text.replace("the element: é", "the element: é }")
    assert carry(text, edit(text, line, text.split("\n")[line].index("}"), 0, "\n")) is None


def test_a_launch_sites_line_waits_for_the_parse():
    text = source()
    line = text.split("\n").index("         256>>>(n, a, x, y);")
    assert carry(text, edit(text, line, 9, 0, " ")) is None


def test_carried_over_many_keystrokes_then_the_parse_agrees():
    """Each keystroke carried from the one before (a chain), in two kernels, with line breaks:
    then the newest carried model says what a parse of the newest text says."""
    now = model(source())
    version = 1
    for kernel, typed in ((2, "float t = a * (n - 1.0f);\n        "), (6, "y[i] += t;\n        ")):
        cursor = now.snapshot.text.index(f"float v = x[i] * a + {kernel}.0f;")
        for key in typed:
            version += 1
            new = now.snapshot.text[:cursor] + key + now.snapshot.text[cursor:]
            following = carried(now, Snapshot("file:///work/a.cu", version, new))
            assert following is not None, (kernel, key)
            now, cursor = following, cursor + 1
    assert now.carry is not None and len(now.carry.regions) == version - 1
    same(now, fresh(now.snapshot.text))


def test_random_edits_carried_agree_with_a_parse():
    """Random edits anywhere, in chains of up to three: whenever one is carried and the new text
    has no syntax error, the carried model is the parse's; a fair share is carried."""
    text = source(12)
    rng = random.Random(7)
    keys = "ab_1 \t\n+-*=.,;:?|&!%^~(){}[]<>\"'/#"
    tried = kept = compared = 0
    for _ in range(600):
        now, new = model(text), text
        for step in range(rng.randrange(1, 4)):
            pos = rng.randrange(len(new))
            typed = "".join(rng.choice(keys) for _ in range(rng.randrange(0, 4)))
            new = new[:pos] + typed + new[pos + rng.randrange(0, 3) :]
            tried += 1
            following = carried(now, Snapshot("file:///work/a.cu", 2 + step, new))
            if following is None:
                break
            kept += 1
            if not SourceFile(new, "/fresh/x.cu").tree.root_node.has_error:
                compared += 1
                same(following, fresh(new))
            now = following
    assert kept > tried * 0.2, (kept, tried)
    assert compared > 50, compared


# ---- the documents ----------------------------------------------------------------------------


async def test_requests_do_not_wait_for_the_parse_of_a_carried_edit():
    """A keystroke's parse starts once typing pauses (`PARSE_DELAY_S`); meanwhile `current` answers
    with the last parse carried over the edit, and `model` (what a command needs) waits for it."""
    documents = Documents()
    text = source()
    uri = "file:///work/a.cu"
    assert await documents.update(Snapshot(uri, 1, text)) is not None
    new = edit(text, body_line(text, 4), 8, 0, "q")
    pending = asyncio.ensure_future(documents.update(Snapshot(uri, 2, new), delay=PARSE_DELAY_S))
    await asyncio.sleep(0)
    started = time.perf_counter()
    now = await documents.current(uri)
    assert time.perf_counter() - started < PARSE_DELAY_S
    assert now is not None and now.carry is not None and now.snapshot.version == 2
    assert (await documents.current(uri)) is now  # made once per version
    parsed = await documents.model(uri)
    assert parsed is not None and parsed.carry is None and parsed.snapshot.version == 2
    same(now, parsed)
    assert await pending is None or (await pending).snapshot.version == 2


async def test_an_edit_that_is_not_carried_waits_for_the_parse():
    documents = Documents()
    text = source()
    uri = "file:///work/a.cu"
    await documents.update(Snapshot(uri, 1, text))
    new = text.replace("void k4(", "void k44(")
    pending = asyncio.ensure_future(documents.update(Snapshot(uri, 2, new), delay=PARSE_DELAY_S))
    await asyncio.sleep(0)
    now = await documents.current(uri)
    assert now is not None and now.carry is None and now.kernel("k44") is not None
    await pending


# ---- the source model, parsed incrementally ----------------------------------------------------


def test_an_incremental_parse_is_a_fresh_parse():
    text = source(12)
    before = SourceFile(text, "/work/a.cu")
    rng = random.Random(3)
    for _ in range(40):
        pos = rng.randrange(len(text))
        new = (
            text[:pos]
            + rng.choice(["x", " ", "\n", "int q = 1;", ""])
            + text[pos + rng.randrange(0, 2) :]
        )
        got, want = SourceFile(new, "/work/a.cu", before), SourceFile(new, "/work/a.cu")
        if want.tree.root_node.has_error:
            continue
        assert str(got.tree.root_node) == str(want.tree.root_node)
        assert got.kernels == want.kernels
        assert got.launch_sites() == want.launch_sites()
