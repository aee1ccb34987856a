"""The static screen of candidates (optiml/harness/screen.py): each kind of forbidden code, as a small
edit of a fixture, is found at its line with the reason; the changes a candidate may make are not;
every proposal of the catalog passes; a file screened against itself passes."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from optiml.cuda.source import SourceFile
from optiml.harness.evaluate import EvalOptions, TemplateRefused, build_candidate, candidate_spec
from optiml.harness.screen import Finding, screen
from optiml.search.catalog import CATALOG, Context
from optiml.search.variant import Variant
from optiml.spec import parse_spec
from tests.support import FIXTURES, MANIFEST, WILD

SAXPY = FIXTURES / "saxpy.cu"
MULTI = FIXTURES / "multi_kernel_main.cu"
# An original whose host code runs at load when a macro is defined, and uses a type with a
# host-compiled member.
SELF_TESTING = """#include <cstdio>

struct Scaler {
    float s;
    __host__ __device__ float scaled(float v) const { return v * s; }
};

static int self_test() { return Scaler{2.0f}.scaled(1.0f) == 2.0f ? 0 : printf("broken\\n"); }
#ifdef SELF_TEST
static int self_tested = self_test();
#endif

/* @optiml
 *   args:   x: inout float[n]
 *   launch: grid = cdiv(n, 256), block = 256
 *   sizes:  n = 1000
 */
__global__ void scale(int n, float* x)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] = Scaler{2.0f}.scaled(x[i]);
}
"""


@dataclass(frozen=True)
class Case:
    id: str
    edit: Callable[[str], str]  # the original's text -> the candidate's
    needle: str = ""  # the finding is on the line where this first appears in the candidate
    phrase: str = ""  # ... and its message holds this
    base: Path | str = SAXPY  # a fixture, or an original's text
    kernel: str = "saxpy"


def append(code: str) -> Callable[[str], str]:
    return lambda text: text.rstrip("\n") + "\n\n" + code.strip("\n") + "\n"


def replace(old: str, new: str) -> Callable[[str], str]:
    def edit(text: str) -> str:
        assert old in text, f"the fixture no longer holds {old!r}"
        return text.replace(old, new, 1)

    return edit


def prepend(code: str) -> Callable[[str], str]:
    return lambda text: code.strip("\n") + "\n" + text


SAXPY_BODY = "        y[i] = a * x[i] + y[i];\n"


def in_kernel(code: str) -> Callable[[str], str]:
    """`code` as statements of saxpy's body."""
    return replace(SAXPY_BODY, SAXPY_BODY + code.strip("\n") + "\n")


def _text(base: Path | str) -> str:
    return base.read_text() if isinstance(base, Path) else base


def _screen(base: Path | str, text: str, kernel: str) -> list[Finding]:
    path = str(base) if isinstance(base, Path) else "original.cu"
    return screen(SourceFile(_text(base), path), SourceFile(text, path), kernel)


def _line_of(text: str, needle: str) -> int:
    at = text.index(needle)
    return text.count("\n", 0, at) + 1


# ---- what the screen must find ----------------------------------------------------------------------

FORBIDDEN = [
    # host code that reads the expected outputs, forges the result, runs at load or at exit
    Case(
        "host-function-reads-expected",
        append(
            "void load_expected(float* out) {\n"
            '    FILE* f = fopen("/tmp/optiml/expected.bin", "rb");\n'
            "    fread(out, 4, 1 << 20, f);\n}"
        ),
        "void load_expected",
        "host function `load_expected` added",
    ),
    Case(
        "include-fstream", prepend("#include <fstream>"), "#include <fstream>", "may include only"
    ),
    Case("include-cstdio", prepend("#include <cstdio>"), "#include <cstdio>", "may include only"),
    Case("include-unistd", prepend("#include <unistd.h>"), "#include <unistd", "may include only"),
    Case("include-dlfcn", prepend("#include <dlfcn.h>"), "#include <dlfcn", "may include only"),
    Case("include-thread", prepend("#include <thread>"), "#include <thread>", "may include only"),
    Case("include-sys", prepend("#include <sys/mman.h>"), "#include <sys", "may include only"),
    Case(
        "include-filesystem", prepend("#include <filesystem>"), "#include <filesys", "include only"
    ),
    Case(
        "include-local", prepend('#include "expected.h"'), '#include "expected.h"', "include only"
    ),
    Case(
        "include-escapes-allowed-dir",
        prepend("#include <cub/../../fstream>"),
        "#include <cub",
        "may include only",
    ),
    Case(
        "static-initializer-forges-result",
        append("static int forge() { return 0; }\nstatic int forged = forge();"),
        "static int forged",
        "file-scope variable `forged` added",
    ),
    Case(
        "atexit-handler",
        append("static int registered = atexit(+[] { });"),
        "static int registered",
        "file-scope variable `registered` added",
    ),
    Case(
        "constructor-attribute",
        append("__attribute__((constructor)) static void forge() { }"),
        "constructor",
        "attribute `constructor` is not allowed",
    ),
    Case(
        "constructor-attribute-on-device-function",
        append("__attribute__((constructor)) __device__ void helper() { }"),
        "constructor",
        "attribute `constructor` is not allowed",
    ),
    Case(
        "cxx11-destructor-attribute",
        append("[[gnu::destructor]] __host__ __device__ void bye() { }"),
        "destructor",
        "attribute `destructor` is not allowed",
    ),
    Case(
        "section-attribute",
        append('__attribute__((section(".init_array"))) __device__ int hook;'),
        "section",
        "attribute `section` is not allowed",
    ),
    Case(
        "zero-case-result-at-load",
        append("struct Forger {\n    Forger() { }\n};\nstatic Forger forger;"),
        "static Forger forger",
        "constructor, which runs when the object is loaded",
    ),
    Case(
        "global-object-member-constructor",
        append("struct Forger {\n    Forger() { }\n};"),
        "Forger() { }",
        "host member function `Forger`",
    ),
    Case(
        "static-member-with-initializer",
        append("int tick();\nstruct S {\n    static inline int t = tick();\n};"),
        "static inline int t",
        "static data member with an initializer",
    ),
    # host code that moves the timed work or slows the reference down
    Case(
        "work-on-another-stream",
        replace(
            "saxpy<<<blocks, threads, 0, stream>>>",
            "cudaStream_t side;\n    cudaStreamCreate(&side);\n"
            "    saxpy<<<blocks, threads, 0, side>>>",
        ),
        "void run_saxpy",
        "host function `run_saxpy` changed",
    ),
    Case(
        "slow-reference-device-limit",
        append("static int slow = (cudaDeviceSetLimit(cudaLimitStackSize, 1 << 20), 0);"),
        "static int slow",
        "file-scope variable `slow` added",
    ),
    Case(
        "slow-reference-func-attribute",
        append(
            "static cudaError_t slow = cudaFuncSetAttribute(\n"
            "    (const void*)saxpy, cudaFuncAttributePreferredSharedMemoryCarveout, 100);"
        ),
        "static cudaError_t slow",
        "file-scope variable `slow` added",
    ),
    Case(
        "const-with-call",
        append("int compute();\nconst int K = compute();"),
        "const int K",
        "file-scope variable `K` added",
    ),
    Case(
        "const-with-lambda",
        append("const int K = [] { return 3; }();"),
        "const int K",
        "file-scope variable `K` added",
    ),
    Case(
        "const-from-function-like-macro",
        append("#define CALL(f) f()\nint compute();\nconst int K = CALL(compute);"),
        "const int K",
        "file-scope variable `K` added",
    ),
    Case(
        "host-data",
        append("int counter;"),
        "int counter",
        "file-scope variable `counter` added",
    ),
    Case(
        "extern-declaration",
        append("extern int runner_state;"),
        "extern int",
        "`extern` declaration of `runner_state` added",
    ),
    # code that behaves differently under compute-sanitizer
    Case(
        "getenv-in-host-device",
        append(
            "__host__ __device__ bool sanitized() {\n"
            '    return getenv("CUDA_INJECTION64_PATH") != nullptr;\n}'
        ),
        "getenv(",
        "`getenv` in a `__host__ __device__` function",
    ),
    Case(
        "proc-maps-in-host-device",
        append(
            "__host__ __device__ int mapped() {\n"
            '    std::ifstream maps("/proc/self/maps");\n'
            "    return 0;\n}"
        ),
        "ifstream",
        "`ifstream` in a `__host__ __device__` function",
    ),
    Case(
        "system-in-host-device",
        append('__host__ __device__ void run() { std::system("true"); }'),
        "system(",
        "`system` in a `__host__ __device__` function",
    ),
    Case(
        "thread-in-host-device",
        append("__host__ __device__ void spawn() { pthread_create(0, 0, 0, 0); }"),
        "pthread_create",
        "`pthread_create` in a `__host__ __device__` function",
    ),
    Case(
        "exit-through-function-pointer",
        append("__host__ __device__ void* quit() { return (void*)&exit; }"),
        "exit;",
        "`exit` in a `__host__ __device__` function",
    ),
    Case(
        "host-asm-in-host-device",
        append(
            "__host__ __device__ int probe() {\n"
            "#ifndef __CUDA_ARCH__\n"
            '    asm volatile("syscall");\n'
            "#endif\n    return 0;\n}"
        ),
        "asm volatile",
        "`asm` in a `__host__ __device__` function outside `#ifdef __CUDA_ARCH__`",
    ),
    Case(
        "host-device-call-through-macro",
        append(
            '#define PEEK getenv("COMPUTE_SANITIZER")\n'
            "__host__ __device__ bool peek() { return PEEK != nullptr; }"
        ),
        "PEEK != nullptr",
        "macro `PEEK` brings `getenv`",
    ),
    Case(
        "original-macro-brings-exit-into-host-device",
        replace(
            "// Clamp helper shared by the kernels below.",
            "__host__ __device__ void check() { CHECK_CUDA(cudaSuccess); }",
        ),
        "CHECK_CUDA(cudaSuccess)",
        "macro `CHECK_CUDA` brings",
        base=MULTI,
        kernel="vec_add",
    ),
    # the preprocessor redefining what the launcher uses
    Case(
        "define-cudaLaunchKernel",
        prepend("#define cudaLaunchKernel(...) cudaSuccess"),
        "#define",
        "`#define cudaLaunchKernel`: a reserved name",
    ),
    Case(
        "define-cudaEventRecord",
        prepend("#define cudaEventRecord(e, s) cudaSuccess"),
        "#define",
        "`#define cudaEventRecord`: a reserved name",
    ),
    Case(
        "define-launcher-parameter",
        append("#define stream 0"),
        "#define stream",
        "`#define stream`: a reserved name (host code or the launcher uses it)",
    ),
    Case("define-dim3", append("#define dim3(...) 0"), "#define dim3", "`#define dim3`"),
    Case("define-main", append("#define main other"), "#define main", "`#define main`"),
    Case("define-exit", append("#define exit(c) 0"), "#define exit", "`#define exit`"),
    Case(
        "define-keyword", append("#define static"), "#define static", "a reserved name (a keyword)"
    ),
    Case(
        "define-cuda-qualifier",
        append("#define __device__ __host__"),
        "#define __device__",
        "`#define __device__`: a reserved name",
    ),
    Case(
        "define-launcher-symbol",
        append("#define optiml_launch other"),
        "#define optiml_launch",
        "`#define optiml_launch`: a reserved name",
    ),
    Case(
        "define-launcher-macro",
        append("#define OPTIML_EXPORT static"),
        "#define OPTIML_EXPORT",
        "`#define OPTIML_EXPORT`: a reserved name",
    ),
    Case(
        "define-launcher-prefix",
        append("#define optiml_result_path 0"),
        "#define optiml_result_path",
        "the launcher's prefix",
    ),
    Case(
        "define-host-code-word",
        replace("#define THREADS_PER_BLOCK 256", "#define THREADS_PER_BLOCK 512"),
        "#define THREADS_PER_BLOCK",
        "`#define THREADS_PER_BLOCK`: a reserved name (host code or the launcher uses it)",
        base=MULTI,
        kernel="vec_add",
    ),
    Case(
        "macro-used-by-host-code-removed",
        replace("#define THREADS_PER_BLOCK 256", "#define TPB 256"),
        "int blocks_for",
        "macro `THREADS_PER_BLOCK`, which this host code uses, was removed",
        base=MULTI,
        kernel="vec_add",
    ),
    Case("undef", append("#undef cudaLaunchKernel"), "#undef", "`#undef cudaLaunchKernel`"),
    Case("line", prepend('#line 1 "elsewhere.cu"'), "#line", "`#line` is not allowed"),
    Case("pragma-operator", append('_Pragma("GCC optimize(0)")'), "_Pragma", "`_Pragma`"),
    Case(
        "pragma-operator-in-kernel",
        in_kernel('    _Pragma("push_macro(\\"cudaLaunchKernel\\")")'),
        "_Pragma",
        "`_Pragma` is not allowed",
    ),
    Case(
        "pragma-file-scope",
        prepend('#pragma GCC optimize("O0")'),
        "#pragma",
        '`#pragma GCC optimize("O0")` added at file scope',
    ),
    Case(
        "pragma-pop-macro-in-kernel",
        in_kernel('#pragma pop_macro("cudaLaunchKernel")'),
        "#pragma pop_macro",
        "only unroll and nounroll",
    ),
    Case(
        "macro-declares-host-code-at-file-scope",
        append(
            "#define ONE 1; void hidden() { *(volatile int*)0 = 0; } const int TWO = 2\n"
            "__device__ int one = ONE;"
        ),
        "ONE;",
        "macro `ONE` outside a function body holds `;`",
    ),
    Case(
        "macro-with-unbalanced-brace",
        append("#define CLOSE }"),
        "#define CLOSE",
        "macro `CLOSE` has unbalanced brackets",
    ),
    Case(
        "macro-with-constructor",
        append("#define AT_LOAD __attribute__((constructor))"),
        "#define AT_LOAD",
        "holds the attribute `constructor`",
    ),
    Case(
        "macro-with-host-capability",
        append('#define OPEN fopen("/tmp/x", "w")'),
        "#define OPEN",
        "macro `OPEN` uses `fopen`",
    ),
    Case(
        "macro-with-launch",
        append("#define RELAUNCH saxpy<<<1, 1>>>(0, 0, 0, 0)"),
        "#define RELAUNCH",
        "macro `RELAUNCH` launches a kernel",
    ),
    Case(
        "line-continuation-joins-a-call",
        append('__host__ __device__ void f() { sys\\\ntem("true"); }'),
        "sys\\",
        "line continuation outside a directive",
    ),
    # names the launcher's unqualified calls would pick
    Case(
        "template-named-like-runtime",
        append(
            "template <class... A>\n"
            "cudaError_t cudaLaunchKernel(const void* f, A... a) { return cudaSuccess; }"
        ),
        "template <class... A>",
        "host function `cudaLaunchKernel` added",
    ),
    Case(
        "host-device-overload-of-runtime",
        append(
            "__host__ __device__ inline int cudaLaunchKernel(const void*, dim3, dim3, void**,"
            " size_t, cudaStream_t) { return 0; }"
        ),
        "cudaLaunchKernel(",
        "`cudaLaunchKernel` is a reserved name",
    ),
    Case(
        "device-function-named-like-launcher",
        append("__device__ const void* optiml_kernel() { return nullptr; }"),
        "optiml_kernel",
        "`optiml_kernel` is a reserved name (the launcher uses it)",
    ),
    Case(
        "type-named-like-runtime",
        append("struct dim3 { };"),
        "dim3",
        "`dim3` is a reserved name",
    ),
    Case(
        "host-device-operator-on-runtime-type",
        append(
            "typedef cudaError_t status;\n"
            "__host__ __device__ bool operator!=(status a, status b) { return false; }"
        ),
        "operator!=",
        "could replace the built-in operator",
    ),
    Case(
        "host-device-allocator",
        append("__host__ __device__ void* operator new(size_t n) { return nullptr; }"),
        "operator new",
        "replaces the host's allocator",
    ),
    Case(
        "asm-label",
        append('__host__ __device__ int hijack(void**) asm("optiml_launch");'),
        'asm("optiml_launch")',
        "asm label",
    ),
    Case(
        "host-device-named-like-host-helper",
        replace(
            "// Clamp helper shared by the kernels below.",
            "__host__ __device__ int blocks_for(long n) { return 1; }",
        ),
        "blocks_for(long",
        "named like something host code calls",
        base=MULTI,
        kernel="vec_add",
    ),
    Case(
        "using-namespace",
        append("using namespace std;"),
        "using namespace",
        "changes what host code's names resolve to",
    ),
    Case(
        "namespace-std",
        append("namespace std { __device__ int hidden; }"),
        "std {",
        "namespace `std` is the standard library's",
    ),
    # device code that moves work off the timed stream
    Case(
        "device-side-launch",
        in_kernel("    saxpy<<<1, 1>>>(n, a, x, y);"),
        "saxpy<<<1, 1>>>",
        "kernel launch in device code",
    ),
    Case(
        "device-side-runtime-call",
        in_kernel("    cudaDeviceSynchronize();"),
        "cudaDeviceSynchronize",
        "device-side runtime calls and launches are not allowed",
    ),
    Case(
        "managed-memory",
        append("__device__ __managed__ float expected[1024];"),
        "__managed__",
        "`__managed__` memory",
    ),
    Case("file-scope-asm", append('asm(".globl optiml_launch");'), "asm(", "file-scope `asm`"),
    # host code changed, added, moved
    Case(
        "host-only-function",
        append("__host__ void setup() { }"),
        "__host__ void setup",
        "host function `setup` added",
    ),
    Case(
        "host-helper-changed",
        replace("srand(seed);", "srand(seed + 1);"),
        "void fill_random",
        "host function `fill_random` changed",
        base=MULTI,
        kernel="vec_add",
    ),
    Case(
        "main-changed",
        replace("return ok ? EXIT_SUCCESS : EXIT_FAILURE;", "return EXIT_SUCCESS;"),
        "int main",
        "host function `main` changed",
        base=MULTI,
        kernel="vec_add",
    ),
    Case(
        "host-function-moved",
        lambda text: text.replace(
            "int blocks_for(int n)\n{\n    return (n + THREADS_PER_BLOCK - 1) / THREADS_PER_BLOCK;\n}\n",
            "",
        ).replace(
            "// host helpers\n",
            "// host helpers\n\nint blocks_for(int n)\n{\n"
            "    return (n + THREADS_PER_BLOCK - 1) / THREADS_PER_BLOCK;\n}\n",
        ),
        "int blocks_for",
        "host function `blocks_for` moved",
        base=MULTI,
        kernel="vec_add",
    ),
    Case(
        "host-declaration",
        append("void later(int);"),
        "void later",
        "host function declaration `later` added",
    ),
    # the original's own host code, switched on or changed underneath
    Case(
        "define-switches-on-host-code",
        prepend("#define SELF_TEST 1"),
        "#define SELF_TEST",
        "`#define SELF_TEST`: a reserved name (host code or the launcher uses it)",
        base=SELF_TESTING,
        kernel="scale",
    ),
    Case(
        "type-used-by-host-code-changed",
        replace("return v * s;", "return getpid() ? v : v * s;"),
        "__host__ __device__ float scaled",
        "`__host__ __device__` member of `Scaler`, a type host code uses",
        base=SELF_TESTING,
        kernel="scale",
    ),
    Case(
        "host-device-operator-on-a-type-host-code-uses",
        replace(
            "// Clamp helper shared by the kernels below.",
            "__host__ __device__ inline bool operator==(const std::vector<float>& a, "
            "const std::vector<float>& b) { return true; }",
        ),
        "operator==",
        "on `vector`, a type host code uses",
        base=MULTI,
        kernel="vec_add",
    ),
    Case(
        "line-continuation-between-tokens-of-kept-host-code",
        replace("    const int threads = 256;", "    const int\\\n threads = 256;"),
        "const int\\",
        "line continuation outside a directive",
    ),
    # what the tree cannot read
    Case(
        "digraph-directive",
        append("%:define cudaLaunchKernel other"),
        "%:define",
        "does not parse here",
    ),
    Case(
        "digraphs-end-a-device-function",
        append(
            "__device__ void f(int x) {\n"
            "    if (x) <% %>\n"
            '    %> void evil() <% std::system("true"); %> __device__ void g() <%\n'
            "}"
        ),
        "%> void evil",
        "digraph `%>`: the compiler reads it as `}`",
    ),
    Case(
        "digraph-directive-in-a-kernel",
        in_kernel("%:define cudaLaunchKernel(...) cudaSuccess"),
        "%:define",
        "digraph `%:`: the compiler reads it as `#`",
    ),
    Case(
        "original-macro-with-a-brace-used-in-device-code",
        in_kernel("    CLOSE_BLOCK"),
        "    CLOSE_BLOCK",
        "macro `CLOSE_BLOCK` has unbalanced brackets",
        base="#define CLOSE_BLOCK }\n" + SAXPY.read_text(),
    ),
    Case(
        "carriage-return-ends-a-comment",
        append('// a note\r void evil() { std::system("true"); }\n__device__ int x;'),
        "// a note",
        "carriage return without a line feed",
    ),
    Case(
        "nul-character",
        in_kernel("    int j = 0;\x00"),
        "int j = 0;",
        "NUL character",
    ),
    Case(
        "align-on-a-type",
        lambda _: LLM_SOFTMAX.replace("struct alignas(16) Online", "struct __align__(16) Online"),
        "struct __align__",
        "write `alignas(N)`",
        base=FIXTURES / "softmax.cu",
        kernel="softmax_rows",
    ),
    Case(
        "qualifier-macro",
        append("#define HD __host__ __device__\nHD float twice(float v) { return 2 * v; }"),
        "HD float",
        "`HD` is a macro: write its qualifiers out",
    ),
    Case(
        "qualifier-hidden-by-if-0",
        append("#if 0\n__device__\n#endif\nvoid sneaky() { }"),
        "void sneaky",
        "host function `sneaky` added",
    ),
    Case(
        "macro-invocation-at-file-scope",
        append("#define DEFINE(n) void n() { }\nDEFINE(evil);"),
        "DEFINE(evil)",
        "code at file scope the screen cannot read",
    ),
]


def _check_found(case: Case) -> None:
    text = case.edit(_text(case.base))
    found = _screen(case.base, text, case.kernel)
    line = _line_of(text, case.needle)
    assert any(f.line == line and case.phrase in f.message for f in found), (
        f"no finding with {case.phrase!r} at line {line}; found:\n"
        + "\n".join(f"  {f.line}:{f.column} {f.message}" for f in found)
    )


@pytest.mark.parametrize("case", FORBIDDEN, ids=[c.id for c in FORBIDDEN])
def test_forbidden_code_is_found_where_it_is(case):
    _check_found(case)


def test_a_finding_points_at_the_column_of_what_it_is_about():
    text = append('__host__ __device__ void f() { remove("/tmp/x"); }')(SAXPY.read_text())
    found = _screen(SAXPY, text, "saxpy")
    line = _line_of(text, "remove(")
    column = text.split("\n")[line - 1].index("remove") + 1
    assert [(f.line, f.column) for f in found] == [(line, column)], found


def test_messages_are_one_line_and_name_the_kernel_where_it_helps():
    text = append("void helper() { }")(SAXPY.read_text())
    (f,) = _screen(SAXPY, text, "saxpy")
    assert "\n" not in f.message
    assert f.message == (
        "host function `helper` added: a candidate of `saxpy` may change only device code "
        "(__global__ and __device__ functions)"
    )


# ---- what a candidate may change ---------------------------------------------------------------------

NEW_KERNEL = """__global__ void saxpy(int n, float a, const float* __restrict__ x, float* __restrict__ y)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x)
        y[i] = fmaf(a, x[i], y[i]);
}"""
OLD_KERNEL = """__global__ void saxpy(int n, float a, const float* x, float* y)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        y[i] = a * x[i] + y[i];
}"""
SPEC = "/* @optiml"


# A rewrite the way an LLM writes one: macros, constexpr constants, templates, a namespace alias,
# cooperative groups, a __host__ __device__ constexpr helper, a struct with a device member.
LLM_SOFTMAX = """// softmax.cu - row-wise softmax, one warp per row.

#include <math.h>
#include <cuda_runtime.h>
#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>
#include <cfloat>

namespace cg = cooperative_groups;

#define WARP_SIZE 32
#define WARPS_PER_BLOCK 8
#define FULL_MASK 0xffffffffu
#define DEVICE_INLINE __device__ __forceinline__

constexpr int kThreads = WARP_SIZE * WARPS_PER_BLOCK;
static constexpr float kNegInf = -FLT_MAX;

template <typename T>
__device__ __forceinline__ T warp_max(T v) {
#pragma unroll
    for (int o = WARP_SIZE / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, o));
    return v;
}

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
    for (int o = WARP_SIZE / 2; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

__host__ __device__ constexpr int ceil_div(int a, int b) { return (a + b - 1) / b; }

struct alignas(16) Online {
    float m, s;
    __device__ void add(float x) {
        float m2 = fmaxf(m, x);
        s = s * __expf(m - m2) + __expf(x - m2);
        m = m2;
    }
};

/* @optiml
 *   args:   input: in float[rows * cols], output: out float[rows * cols]
 *   launch: grid = cdiv(rows, 8), block = 256
 *   sizes:  rows, cols = (32768, 1024), (1000, 777)
 *   # outputs are ~1e-3; a variant that reduces the row in another order
 *   # (warp shuffles, online softmax) or uses __expf differs slightly.
 *   tol:    rtol = 1e-4, atol = 1e-6
 */
__global__ void __launch_bounds__(kThreads) softmax_rows(const float* __restrict__ input, float* __restrict__ output, int rows, int cols)
{
    cg::thread_block_tile<32> warp = cg::tiled_partition<32>(cg::this_thread_block());
    const int row = blockIdx.x * WARPS_PER_BLOCK + threadIdx.x / WARP_SIZE;
    const int lane = threadIdx.x % WARP_SIZE;
    if (row >= rows) return;
    const float* x = input + (size_t)row * cols;
    float* y = output + (size_t)row * cols;
    Online acc{kNegInf, 0.0f};
    for (int j = lane; j < cols; j += WARP_SIZE) acc.add(__ldg(x + j));
    float m = warp_max(acc.m);
    float s = warp_sum(acc.s * __expf(acc.m - m));
    const float inv = 1.0f / s;
    for (int j = lane; j < cols; j += WARP_SIZE) y[j] = __expf(x[j] - m) * inv;
    (void)warp;
}
"""


def before_spec(code: str) -> Callable[[str], str]:
    """`code` right before saxpy's spec comment (where the catalog puts helpers)."""
    return replace(SPEC, code.strip("\n") + "\n\n" + SPEC)


ALLOWED = [
    Case("rewritten-kernel", replace(OLD_KERNEL, NEW_KERNEL)),
    Case(
        "llm-style-rewrite",
        lambda _: LLM_SOFTMAX,
        base=FIXTURES / "softmax.cu",
        kernel="softmax_rows",
    ),
    Case(
        "cuda-launch-attributes",
        replace(
            "__global__ void saxpy(int n",
            "__global__ void __attribute__((cluster_dims(2, 1, 1), launch_bounds(256))) saxpy(int n",
        ),
    ),
    Case(
        "spec-comment-launch",
        replace("launch: grid = cdiv(n, 256), block = 256", "launch: grid = 264, block = 512"),
    ),
    Case(
        "device-helper",
        before_spec(
            "__device__ __forceinline__ float axpy(float a, float x, float y) { return fmaf(a, x, y); }"
        ),
    ),
    Case(
        "host-device-math-helper",
        before_spec(
            "__host__ __device__ inline int cdiv(int a, int b) { return (a + b - 1) / b; }"
        ),
    ),
    Case(
        "host-device-asm-in-device-pass",
        before_spec(
            "__host__ __device__ inline unsigned lane() {\n"
            "#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700\n"
            "    unsigned l;\n"
            '    asm volatile("mov.u32 %0, %%laneid;" : "=r"(l));\n'
            "    return l;\n"
            "#else\n"
            "    return 0;\n"
            "#endif\n}"
        ),
    ),
    Case(
        "struct-with-device-members",
        before_spec(
            "struct Pair {\n"
            "    float lo, hi;\n"
            "    static constexpr int WIDTH = 2;\n"
            "    Pair() = default;\n"
            "    __device__ Pair(float l, float h) : lo(l), hi(h) {}\n"
            "    __host__ __device__ float sum() const { return lo + hi; }\n"
            "    __device__ Pair operator+(const Pair& o) const { return {lo + o.lo, hi + o.hi}; }\n"
            "};\n"
            "__host__ __device__ inline Pair operator*(Pair p, float s) { return {p.lo * s, p.hi * s}; }"
        ),
    ),
    Case(
        "template-struct-and-alias",
        before_spec(
            "template <typename T, int N>\n"
            "struct alignas(sizeof(T) * N) Pack { T v[N]; };\n"
            "using Pack4 = Pack<float, 4>;\n"
            "typedef float real;\n"
            "enum class Mode : int { Fast, Exact };"
        ),
    ),
    Case("define-tile", before_spec("#define TILE 32\n#define CDIV(a, b) (((a) + (b) - 1) / (b))")),
    Case(
        "device-headers",
        prepend(
            "#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n#include <cooperative_groups.h>\n"
            "#include <cooperative_groups/reduce.h>\n#include <mma.h>\n#include <cuda/std/cmath>\n"
            "#include <cub/warp/warp_reduce.cuh>\n#include <cstdint>\n#include <type_traits>"
        ),
    ),
    Case(
        "constant-table-and-constants",
        before_spec(
            "__constant__ float weights[4] = {0.1f, 0.2f, 0.3f, 0.4f};\n"
            "__device__ unsigned long long counter;\n"
            "constexpr int BLOCK = 256;\n"
            "static const int ELEMS = 4 * sizeof(float);\n"
            "const float SCALE = 1.0f / BLOCK;\n"
            "static constexpr float taps[] = {1.0f, 2.0f, 1.0f};\n"
            "#define TILE_W (BLOCK / 8)\n"
            "const int WIDE = TILE_W * 2;\n"
            "#define TAPS {1.0f, 2.0f, 1.0f}\n"
            "__constant__ float taps3[3] = TAPS;"
        ),
    ),
    Case(
        "namespace-with-device-helpers",
        before_spec(
            "#include <cooperative_groups.h>\n"
            "#include <mma.h>\n"
            "namespace helpers {\n"
            "template <typename T>\n"
            "__device__ __forceinline__ T warp_sum(T v) {\n"
            "    for (int o = 16; o > 0; o /= 2) v += __shfl_down_sync(0xffffffffu, v, o);\n"
            "    return v;\n"
            "}\n"
            "}  // namespace helpers\n"
            "namespace cg = cooperative_groups;\n"
            "using namespace nvcuda;"
        ),
    ),
    Case(
        "inline-ptx",
        in_kernel('    asm volatile("membar.gl;" ::: "memory");'),
    ),
    Case(
        "pragma-unroll",
        replace(
            "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n",
            "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
            "#pragma unroll 4\n"
            "    for (int k = 0; k < 4; ++k)\n"
            "#pragma unroll\n"
            "        for (int j = 0; j < 2; ++j) { }\n",
        ),
    ),
    Case(
        "launch-bounds-and-cluster-dims",
        replace(
            "__global__ void saxpy(int n",
            "__global__ void __launch_bounds__(256, 2) __cluster_dims__(2, 1, 1) saxpy(int n",
        ),
    ),
    Case(
        "cluster-dims-on-a-template",
        before_spec(
            "template <int B>\n__global__ void __cluster_dims__(2, 1, 1) fill(float* p) { p[0] = B; }"
        ),
    ),
    Case(
        "aligned-shared-memory",
        in_kernel("    extern __shared__ __align__(16) unsigned char smem[];"),
    ),
    Case(
        "pragma-once-and-guard",
        prepend("#pragma once\n#ifndef OPTIML_HELPERS\n#define OPTIML_HELPERS\n#endif"),
    ),
    Case(
        "host-code-left-out",
        lambda text: text[: text.index("// Host-side convenience wrapper")],
    ),
    Case(
        "host-device-read-is-a-variable",
        before_spec("__host__ __device__ inline int twice(int read) { return 2 * read; }"),
    ),
    Case(
        "device-helpers-in-a-multi-kernel-file",
        replace(
            "// Clamp helper shared by the kernels below.",
            "__device__ __forceinline__ float warp_total(float v) { return v; }\n"
            "__host__ __device__ inline float half_of(float v) { return 0.5f * v; }",
        ),
        base=MULTI,
        kernel="vec_add",
    ),
]


@pytest.mark.parametrize("case", ALLOWED, ids=[c.id for c in ALLOWED])
def test_allowed_changes_pass(case):
    text = case.edit(_text(case.base))
    assert text != _text(case.base)
    assert _screen(case.base, text, case.kernel) == []


# ---- every file against itself ---------------------------------------------------------------------

FILES = sorted(p for p in FIXTURES.rglob("*.cu"))


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(FIXTURES)) for p in FILES])
def test_a_file_passes_against_itself(path):
    source = SourceFile(path.read_text(), str(path))
    for kernel in source.kernels or []:
        assert screen(source, source, kernel.name) == [], kernel.name
    assert screen(source, SourceFile(path.read_text(), str(path)), "any") == []


def test_the_checked_in_candidates_pass():
    """Every file in fixtures/candidates/ is a candidate of the fixture of the same stem."""
    candidates = sorted((FIXTURES / "candidates").glob("*.cu"))
    assert candidates
    for path in candidates:
        stem = path.stem.split("_")[0]
        base = FIXTURES / f"{stem}.cu"
        source = SourceFile(path.read_text(), str(path))
        assert _screen(base, source.text, source.kernels[0].name) == [], path.name


# ---- the catalog -----------------------------------------------------------------------------------

TARGETS = MANIFEST + WILD


def test_every_catalog_proposal_passes():
    """Every proposal of every transformation on every fixture and wild kernel, at two SM counts
    (stream-K's configurations depend on it), is screened with no finding: the catalog emits only
    what a candidate may hold."""
    started = time.perf_counter()
    flagged, count = [], 0
    for entry in TARGETS:
        path = FIXTURES / entry["file"]
        original = SourceFile(path.read_text(), str(path))
        for sm_count in (2, 132):
            ctx = Context.of(Variant(original.text), str(path), entry["kernel"], sm_count=sm_count)
            for name, transformation in CATALOG.items():
                for p in transformation.propose(ctx):
                    count += 1
                    candidate = SourceFile(p.variant.text, str(path))
                    for f in screen(original, candidate, entry["kernel"]):
                        flagged.append(f"{entry['file']} {name} {p.params}: {f.line}: {f.message}")
    assert count > 1000, count  # the catalog still proposes on the fixtures
    assert not flagged, "\n".join(flagged[:20])
    assert time.perf_counter() - started < 60


def test_proposals_of_proposals_pass():
    """A search applies transformations to variants; a path of two is screened against the
    user's file too (the first proposal of each transformation, then all proposals on it)."""
    flagged, count = [], 0
    for entry in TARGETS:
        path = FIXTURES / entry["file"]
        original = SourceFile(path.read_text(), str(path))
        ctx = Context.of(Variant(original.text), str(path), entry["kernel"])
        for first in CATALOG.values():
            proposals = first.propose(ctx)[:1]
            for p in proposals:
                inner = Context.of(p.variant, str(path), entry["kernel"])
                for name, second in CATALOG.items():
                    for q in second.propose(inner):
                        count += 1
                        found = screen(
                            original, SourceFile(q.variant.text, str(path)), entry["kernel"]
                        )
                        flagged += [
                            f"{entry['file']} {first.name}+{name}: {f.message}" for f in found
                        ]
    assert count > 1000, count
    assert not flagged, "\n".join(flagged[:20])


TEMPLATED = """
/* @optiml
 *   args:   y: out float[n], x: in float[n]
 *   launch: grid = cdiv(n, 256), block = 256
 *   sizes:  n = 4096, 1000
 *   template: T = float, Acc = float
 */
template <typename T, typename Acc>
__global__ void scale(T* y, const T* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = T(Acc(2) * Acc(x[i]));
}
"""


@pytest.mark.parametrize(
    "argument",
    ['float>(nullptr, nullptr, 0); system("id"); scale<float', 'decltype(puts("x"))', "float{}"],
)
def test_a_candidates_template_argument_that_is_not_a_type_is_refused(argument):
    source = SourceFile(TEMPLATED, "scale.cu")
    spec = parse_spec(source, source.kernel("scale"))
    candidate = SourceFile(TEMPLATED.replace("Acc = float", f"Acc = {argument}"), "cand.cu")
    with pytest.raises(TemplateRefused, match="not a plain type or a number"):
        candidate_spec(spec, candidate, candidate.kernel("scale"))
    assert build_candidate(source, source.kernel("scale"), spec, candidate, EvalOptions()) is None


@pytest.mark.parametrize(
    "argument", ["float", "unsigned int", "const float", "ns::half2", "Vec<4>"]
)
def test_a_candidates_template_argument_may_be_any_plain_type(argument):
    source = SourceFile(TEMPLATED, "scale.cu")
    spec = parse_spec(source, source.kernel("scale"))
    candidate = SourceFile(TEMPLATED.replace("Acc = float", f"Acc = {argument}"), "cand.cu")
    assert candidate_spec(spec, candidate, candidate.kernel("scale")).template == {
        "T": "float",
        "Acc": argument,
    }
