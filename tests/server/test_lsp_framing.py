"""The server's frame reader (server/transport.py) on streams of well-formed frames mixed with
broken ones, cut into arbitrary reads: every well-formed frame comes out whole and in order, a
broken one never takes a good one with it, and a huge Content-Length is neither waited for nor
allocated."""

from __future__ import annotations

import asyncio
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from server.transport import MAX_BODY, FrameReader, check, decode


def frame(body: bytes, header: bytes | None = None) -> bytes:
    return (header if header is not None else b"Content-Length: %d\r\n\r\n" % len(body)) + body


class Stream:
    """Bytes handed out in the given read sizes (then what is left, at most what was asked)."""

    def __init__(self, data: bytes, sizes: list[int]) -> None:
        self.data = data
        self.sizes = sizes
        self.reads = 0

    async def read(self, n: int) -> bytes:
        size = self.sizes[self.reads % len(self.sizes)] if self.sizes else n
        self.reads += 1
        out, self.data = self.data[: min(n, size)], self.data[min(n, size) :]
        return out


def read_all(data: bytes, sizes: list[int] | None = None, **kw) -> tuple[list, FrameReader]:
    reader = FrameReader(Stream(data, sizes or []).read, **kw)

    async def go() -> list:
        out = []
        while (f := await reader.next()) is not None:
            out.append(f)
        return out

    return asyncio.run(go()), reader


# Bodies that are valid JSON and say "Content-Length: 12" with escaped line breaks, as a document
# about HTTP would: they must not be mistaken for a cut.
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)
text_about_headers = st.sampled_from(["Content-Length: 12\r\n\r\n", "content-length:7\n", ""])


@st.composite
def good_bodies(draw) -> bytes:
    value = {
        "n": draw(st.integers(0, 10**6)),
        "v": draw(json_values),
        "t": draw(text_about_headers),
    }
    return json.dumps(value, ensure_ascii=draw(st.booleans())).encode()


# Pieces that are not frames, each followed by a good frame in the stream. None of them may
# contain a `Content-Length` header that reaches into the frame after it.
junk_bytes = st.binary(max_size=40).filter(lambda b: b"content-length" not in b.lower())
broken = st.one_of(
    st.builds(lambda b: b"Content-Length: abc\r\n\r\n" + b, junk_bytes),
    st.builds(lambda b: b"Content-Length: -5\r\n\r\n" + b, junk_bytes),
    st.builds(lambda b: b"Content-Length: 1e3\r\n\r\n" + b, junk_bytes),
    st.builds(lambda b: b"Content-Length: \r\n\r\n" + b, junk_bytes),
    st.just(b"Content-Length: %d\r\n\r\n" % (MAX_BODY + 1)),
    st.just(b"Content-Length: 99999999999999999999999\r\n\r\n{}"),
    st.just(b"Content-Length: " + b"9" * 5000 + b"\r\n\r\n{}"),  # more digits than int() takes
    st.just(b"Content-Length: 5\r\nContent-Length: 6\r\n\r\n"),
    st.builds(lambda b: b"Content-Type: application/json\r\n\r\n" + b, junk_bytes),
    st.just(b"Content-Length: 2\r\n{}"),  # no blank line
    st.just(b'Content-Length: 400\r\n\r\n{"jsonrpc": "2.0", "met'),  # cut short
    # a few bytes short: the body ends inside the next frame's header
    st.builds(lambda n: b"Content-Length: %d\r\n\r\n{}" % (2 + n), st.integers(1, 30)),
    st.just(b'Content-Length: 3\r\n\r\n{"jsonrpc": "2.0"}'),  # longer than it says
    st.just(b"\r\n"),
    junk_bytes,
)


@given(
    pieces=st.lists(st.tuples(st.lists(broken, max_size=2), good_bodies()), min_size=1, max_size=6),
    sizes=st.lists(st.integers(1, 300), max_size=5),
)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_every_good_frame_comes_out_whatever_comes_before_it(pieces, sizes):
    stream = b"".join(b"".join(bad) + frame(good) for bad, good in pieces)
    frames, _ = read_all(stream, sizes)
    good = [json.loads(body) for _, body in pieces]
    read = []
    for f in frames:
        try:
            value = json.loads(f.body) if f.body is not None else None
        except ValueError:
            continue
        if isinstance(value, dict) and "n" in value:
            read.append(value)
    assert read == good


@given(bodies=st.lists(good_bodies(), min_size=1, max_size=5), sizes=st.lists(st.integers(1, 50)))
@settings(max_examples=200, deadline=None)
def test_well_formed_frames_come_out_exactly_in_any_reads(bodies, sizes):
    stream = b"".join(
        frame(
            b,
            b"Content-Type: application/vscode-jsonrpc; charset=utf-8\r\n"
            b"content-length:%d\r\n\r\n" % len(b),
        )
        for b in bodies
    )
    frames, reader = read_all(stream, sizes)
    assert [f.body for f in frames] == bodies
    assert reader.skipped == 0


def test_a_huge_length_is_skipped_without_waiting_or_allocating():
    after = frame(b'{"jsonrpc": "2.0", "id": 1, "method": "shutdown"}')
    stream = b"Content-Length: 1000000000000\r\n\r\n" + b"x" * 3_000_000 + after
    frames, reader = read_all(stream, [65536], max_body=1 << 20)
    assert [f.body for f in frames] == [after.split(b"\r\n\r\n", 1)[1]]
    assert len(reader._buf) == 0 and reader.skipped > 3_000_000


def test_a_body_cut_short_is_reported_and_the_next_frame_read():
    after = b'{"jsonrpc": "2.0", "id": 2, "method": "shutdown"}'
    frames, _ = read_all(b'Content-Length: 90\r\n\r\n{"id": 1' + frame(after))
    assert frames[0].body is None
    assert frames[0].problem == "the body ended after 8 of its 90 bytes (Content-Length)"
    assert frames[1].body == after


def test_the_end_of_the_stream_in_a_frame_ends_the_reading():
    frames, _ = read_all(b"Content-Length: 10\r\n\r\n{")
    assert frames == []


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"\xff{}", "Parse error: the body is not UTF-8 (byte 0)"),
        (b"{not json", "Parse error: Expecting property name enclosed in double quotes at byte 1"),
        (b'{"a": NaN}', "Parse error: NaN is not JSON"),
        (b"[" * 100_000, None),  # too deep for the parser: still a ParseError
        (b"1" * 5000, None),  # more digits than Python converts
    ],
)
def test_bodies_that_are_not_json_are_parse_errors(body, message):
    from pygls.exceptions import JsonRpcParseError

    with pytest.raises(JsonRpcParseError) as e:
        decode(body)
    if message is not None:
        assert e.value.message == message
    assert "\n" not in e.value.message


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (
            [{"jsonrpc": "2.0", "method": "x"}],
            "a batch (a JSON array): LSP sends one message per frame",
        ),
        (5, "a message must be a JSON object, got a number"),
        ({"method": "x"}, 'a message must have "jsonrpc": "2.0"'),
        ({"jsonrpc": "2.0", "method": 1}, '"method" must be a string, got a number'),
        (
            {"jsonrpc": "2.0", "id": 1.5, "method": "x"},
            '"id" must be an integer or a string, got a number',
        ),
        (
            {"jsonrpc": "2.0", "id": True, "method": "x"},
            '"id" must be an integer or a string, got a boolean',
        ),
        (
            {"jsonrpc": "2.0", "id": None, "method": "x"},
            '"id" must be an integer or a string, got null',
        ),
        (
            {"jsonrpc": "2.0", "method": "x", "params": 3},
            '"params" must be an object or an array, got a number',
        ),
        (
            {"jsonrpc": "2.0", "id": 3},
            'a message needs "method" (a request or notification) or "result"/"error" (a response)',
        ),
        ({"jsonrpc": "2.0", "id": "a", "method": "x", "params": []}, None),
        ({"jsonrpc": "2.0", "id": 1, "result": None}, None),
        (
            {"jsonrpc": "2.0", "id": [1], "result": 1},
            "a response's id must be an integer or a string",
        ),
    ],
)
def test_json_rpc_shape(value, problem):
    assert check(value) == problem
