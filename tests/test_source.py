"""The source model on real files: kernels, signatures, templates, spec comments, launch sites and
the translation unit without `main`."""

from __future__ import annotations

import pytest

from optiml.cuda.source import SourceFile
from optiml.errors import InputFileError, NoSuchKernel
from tests.support import FIXTURES, MANIFEST, fixture_ids


@pytest.mark.parametrize("entry", MANIFEST, ids=fixture_ids(MANIFEST))
def test_every_fixture_kernel_is_found_with_its_spec(entry):
    source = SourceFile.read(FIXTURES / entry["file"])
    kernel = source.kernel(entry["kernel"])
    assert kernel.spec_comment is not None and "@optiml" in kernel.spec_comment.text
    # The spec ends on the line before the kernel (or its template line) starts.
    assert kernel.spec_comment.span.end_point[0] + 1 == kernel.span.start_point[0]
    assert source.text[kernel.name_span.start : kernel.name_span.end] == kernel.short_name
    body = source.text[kernel.body_span.start : kernel.body_span.end]
    assert body.startswith("{") and body.endswith("}")
    assert all(p.name for p in kernel.params)


MIXED = """\
#include <cuda_fp16.h>
#include <cooperative_groups.h>
namespace cg = cooperative_groups;
#define BLOCK 256
typedef float real;
__constant__ float coeffs[4];
__device__ __forceinline__ real twice(real v) { return 2 * v; }

namespace ops {
template <typename T, int B = 128>
__global__ void __launch_bounds__(B) scale(int n, const T* __restrict__ x, T* y) { }
}

extern "C" __global__ void plain(float* out, unsigned int m) { out[0] = twice(m); }

extern "C" {
__global__ void in_block(const half* h, long long k) { }
}

#ifdef USE_EXTRA
__global__ void extra(double* d) { }
#endif

static void host_helper(float* p) { }

int main(int argc, char** argv) {
    int N = 1 << 20;
    const int threads = BLOCK;
    dim3 block(32, 8);
    ops::scale<float, 64><<<(N + threads - 1) / threads, threads, 0, 0>>>(N, 0, 0);
    plain<<<1, block>>>(0, N);
    return 0;
}
"""


def test_kernels_of_every_shape_people_write():
    source = SourceFile(MIXED, "mixed.cu")
    assert [k.name for k in source.kernels] == ["ops::scale", "plain", "in_block", "extra"]
    scale = source.kernel("scale")
    assert [(t.name, t.kind, t.default) for t in scale.template_params] == [
        ("T", "type", None),
        ("B", "value", "128"),
    ]
    assert [p.declared for p in scale.params] == ["int", "const T*", "T*"]
    assert scale.params[1].restrict and not scale.params[2].restrict
    plain, in_block = source.kernel("plain"), source.kernel("in_block")
    assert plain.extern_c and in_block.extern_c and not scale.extern_c
    assert [p.type_text for p in plain.params] == ["float", "unsigned int"]
    assert [p.declared for p in in_block.params] == ["const half*", "long long"]
    assert source.device_functions == ["twice"]
    assert scale.span.start_point == (9, 0)  # the template line belongs to the kernel


def test_translation_unit_drops_main_and_keeps_lines():
    source = SourceFile(MIXED, "mixed.cu")
    tu = source.translation_unit()
    assert "int main" not in tu and "host_helper" in tu and "__constant__" in tu
    assert tu.count("\n") == MIXED.count("\n")
    assert tu.splitlines()[13] == MIXED.splitlines()[13]


def test_launch_sites_with_their_bindings():
    source = SourceFile(MIXED, "mixed.cu")
    scale_site, plain_site = source.launch_sites()
    assert scale_site.kernel == "ops::scale" and scale_site.template_args == ("float", "64")
    assert scale_site.config == ("(N + threads - 1) / threads", "threads", "0", "0")
    assert scale_site.args == ("N", "0", "0")
    assert scale_site.bindings["N"] == "1 << 20" and scale_site.bindings["threads"] == "BLOCK"
    assert scale_site.bindings["BLOCK"] == "256"
    assert plain_site.bindings["block"] == "(32, 8)"
    assert source.launch_sites("scale") == [scale_site]


def test_non_ascii_text_keeps_character_columns():
    text = "// größe\n/* @optiml ä */\n__global__ void k(float* ü_not_a_name, int n) { }\n"
    source = SourceFile(text, "u.cu")
    k = source.kernel("k")
    assert text[k.name_span.start : k.name_span.end] == "k"
    assert k.spec_comment.text == "/* @optiml ä */"


def test_a_spec_separated_by_code_is_not_the_kernels():
    text = "/* @optiml args: */\nint x;\n__global__ void k(int n) { }\n"
    assert SourceFile(text).kernel("k").spec_comment is None


def test_unknown_kernel_suggests_the_closest():
    source = SourceFile(MIXED, "mixed.cu")
    with pytest.raises(NoSuchKernel, match="no kernel `plian` in mixed.cu; did you mean `plain`"):
        source.kernel("plian")


def test_unreadable_files_are_input_errors(tmp_path):
    with pytest.raises(InputFileError, match="no such file"):
        SourceFile.read(tmp_path / "missing.cu")
    with pytest.raises(InputFileError, match="is a directory"):
        SourceFile.read(tmp_path)


def test_non_ascii_positions_hold_far_into_the_file():
    kernel = "/* @optiml ä */\n__global__ void k{i}(float* ü, int n) {{ }}\n"
    text = "// größe\n" + "".join(kernel.format(i=i) for i in range(300))
    source = SourceFile(text, "u.cu")
    k = source.kernel("k250")
    assert text[k.name_span.start : k.name_span.end] == "k250"
    assert k.name_span.start_point == (2 + 2 * 250, 16)
    assert text[k.spec_comment.span.start : k.spec_comment.span.end] == "/* @optiml ä */"


def test_thousands_of_nested_scopes_are_read_without_recursion():
    """Each nested namespace or #ifdef was one Python call deeper: 3,000 were a RecursionError."""
    ifdefs = "#ifdef A\n" * 3000 + "__global__ void k(int n) {}\n" + "#endif\n" * 3000
    assert [k.name for k in SourceFile(ifdefs).kernels] == ["k"]
    namespaces = "namespace a { " * 1500 + "__global__ void k(int n) {}" + " }" * 1500
    (kernel,) = SourceFile(namespaces).kernels
    assert kernel.name == "a::" * 1500 + "k"
