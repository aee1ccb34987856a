"""`optiml spec`: drafted specs for real kernels parse, and get the roles right."""

from __future__ import annotations

import pytest

from optiml.cuda.draft import draft_spec, pointer_roles
from optiml.cuda.source import SourceFile
from optiml.spec import parse_spec
from tests.support import FIXTURES, GOOD, fixture_ids


def without_spec(source: SourceFile, kernel_name: str) -> SourceFile:
    k = source.kernel(kernel_name)
    s = k.spec_comment.span
    blank = "".join("\n" if c == "\n" else " " for c in source.text[s.start : s.end])
    return SourceFile(source.text[: s.start] + blank + source.text[s.end :], source.path)


def with_draft(source: SourceFile, kernel_name: str) -> tuple[SourceFile, str]:
    k = source.kernel(kernel_name)
    text = draft_spec(source, k)
    at = k.span.start
    return SourceFile(source.text[:at] + text + source.text[at:], source.path), text


@pytest.mark.parametrize("entry", GOOD, ids=fixture_ids(GOOD))
def test_drafted_spec_parses_and_matches_the_roles_people_wrote(entry):
    original = SourceFile.read(FIXTURES / entry["file"])
    written = parse_spec(original, original.kernel(entry["kernel"]))
    bare = without_spec(original, entry["kernel"])
    drafted_source, text = with_draft(bare, entry["kernel"])
    drafted = parse_spec(drafted_source, drafted_source.kernel(entry["kernel"]))
    assert {b.name: b.role for b in drafted.buffers} == {b.name: b.role for b in written.buffers}, (
        text
    )
    assert drafted.template == written.template or not written.template


def test_roles_from_reads_and_writes():
    src = SourceFile(
        """
        __global__ void k(const float* a, float* b, float* c, float* d, unsigned* h, float* e, int n) {
            int i = threadIdx.x;
            b[i] = a[i];          // written only
            c[i] += 1.0f;         // read and written
            float v = d[i];       // read only, though not const
            atomicAdd(&h[i % 4], 1u);
            *(e + i) = v;
            d[0] = d[0];
        }
        """
    )
    assert pointer_roles(src, src.kernel("k")) == {
        "a": "in",
        "b": "out",
        "c": "inout",
        "d": "inout",
        "h": "inout",
        "e": "out",
    }


def test_draft_uses_the_launch_site_and_allocations():
    src = SourceFile(
        """
        #define THREADS 128
        __global__ void scale(float* out, const float* in, int count, float factor) {
            int i = blockIdx.x * blockDim.x + threadIdx.x;
            if (i < count) out[i] = factor * in[i];
        }
        int main() {
            const int N = 1 << 22;
            float *d_in, *d_out;
            cudaMalloc(&d_in, N * sizeof(float));
            cudaMalloc((void**)&d_out, sizeof(float) * N);
            int blocks = (N + THREADS - 1) / THREADS;
            scale<<<blocks, THREADS>>>(d_out, d_in, N, 0.5f);
        }
        """,
        "s.cu",
    )
    text = draft_spec(src, src.kernel("scale"))
    assert text == (
        "/* @optiml\n"
        " *   args:   factor = 0.5, out: out float[count], in: in float[count]\n"
        " *   launch: grid = (count + THREADS - 1) / THREADS, block = THREADS\n"
        " *   sizes:  count = 1 << 22, 2097153\n"
        " */\n"
    )


def test_draft_spells_typedefs_vector_types_and_structs():
    from optiml.cuda.draft import draft_spec
    from optiml.cuda.source import SourceFile
    from optiml.spec import parse_spec

    text = (
        "typedef float floatX;\nstruct P { int n; float s; };\n"
        "__global__ void k(floatX* out, const float4* v, P p, int n) {}\n"
        "int main() {\n  int n = 1000; floatX* d_out; float4* d_v; P p{n, 2.0f};\n"
        "  cudaMalloc(&d_out, n * sizeof(floatX)); cudaMalloc(&d_v, n * sizeof(float4));\n"
        "  k<<<(n + 255) / 256, 256>>>(d_out, d_v, p, n);\n}\n"
    )
    source = SourceFile(text, "d.cu")
    draft = draft_spec(source, source.kernels[0])
    assert "p = {.n = 1, .s = 1.5}" in draft and "v: in float4[n]" in draft
    drafted = SourceFile(text.replace("__global__", draft + "\n__global__", 1), "d.cu")
    spec = parse_spec(drafted, drafted.kernels[0])
    assert [(b.name, b.dtype, b.lanes) for b in spec.buffers] == [
        ("out", "f32", 1),
        ("v", "f32", 4),
    ]
    assert [s.name for s in spec.structs] == ["p"]
