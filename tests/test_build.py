"""Real nvcc compiles: every fixture, the launcher, the runner; diagnostics at the user's lines;
ptxas's resource report; theoretical occupancy."""

from __future__ import annotations

import subprocess

import pytest

from optiml.api import check_file
from optiml.cuda.source import SourceFile
from optiml.harness.build import build_kernel, runner_binary
from optiml.harness.nvcc import parse_messages, parse_resources
from optiml.profile.static import occupancy
from tests.support import FIXTURES, MANIFEST

FILES = sorted({e["file"] for e in MANIFEST})


@pytest.mark.parametrize("file", FILES)
def test_every_fixture_compiles_or_fails_where_expected(file):
    result = check_file(FIXTURES / file, arch="sm_90")
    expected_errors = [e for e in MANIFEST if e["file"] == file and e["verdict"] == "compile_error"]
    if expected_errors:
        assert result.compile_failed
        errors = [m for m in result.kernels[0].messages if m.severity == "error"]
        assert errors[0].line == expected_errors[0]["error_line"]
        assert errors[0].path == str(FIXTURES / file)
        assert errors[0].column is not None
    else:
        assert not result.compile_failed and not result.spec_failed
        specified = {e["kernel"] for e in MANIFEST if e["file"] == file}
        for k in result.kernels:
            if k.kernel.name in specified:
                assert k.report is not None, k.kernel.name
                assert k.report.resources.registers > 0
                assert k.report.occupancy is not None


def test_spill_fixture_reports_its_spills():
    result = check_file(FIXTURES / "spill.cu", arch="sm_90")
    r = result.kernels[0].report.resources
    # ptxas 13.0 for sm_90, with __launch_bounds__(256, 8)
    assert (r.registers, r.stack_bytes, r.spill_store_bytes, r.spill_load_bytes) == (
        32,
        1488,
        2696,
        3084,
    )
    assert "spills" in result.kernels[0].report.notes[0]


def test_launcher_exports_what_the_runner_looks_up():
    source = SourceFile.read(FIXTURES / "templated.cu")
    build = build_kernel(source, source.kernel("axpby"), instantiation="<float, 256>", arch="sm_90")
    assert build.ok, build.log
    symbols = subprocess.run(
        ["nm", "-D", "--defined-only", str(build.path)], capture_output=True, text=True
    ).stdout
    for name in ("optiml_launch", "optiml_attributes", "optiml_occupancy", "optiml_state"):
        assert f" T {name}" in symbols
    assert build.resources.name == "void axpby<float, 256>(int, float, float const*, float, float*)"
    again = build_kernel(source, source.kernel("axpby"), instantiation="<float, 256>", arch="sm_90")
    assert again.cached and again.path == build.path


def test_bad_instantiation_is_reported_at_the_spec():
    source = SourceFile.read(FIXTURES / "templated.cu")
    kernel = source.kernel("axpby")
    build = build_kernel(
        source, kernel, instantiation="<float, 256, 3>", arch="sm_90", mode="cubin"
    )
    assert not build.ok
    first = next(m for m in build.messages if m.severity == "error")
    assert first.line == kernel.spec_comment.span.start_point[0] + 1
    assert "instantiating `axpby` from its spec" in first.message


def test_runner_builds():
    assert runner_binary().exists()


def test_compile_error_in_a_candidate_points_at_its_line(tmp_path):
    text = (
        (FIXTURES / "saxpy.cu")
        .read_text()
        .replace("y[i] = a * x[i] + y[i];", "y[i] = a * x[i] + z;")
    )
    bad = tmp_path / "saxpy.cu"
    bad.write_text(text)
    line = next(i for i, line in enumerate(text.splitlines(), 1) if "+ z;" in line)
    source = SourceFile.read(bad)
    build = build_kernel(source, source.kernel("saxpy"), instantiation="", arch="sm_90")
    assert not build.ok
    err = build.messages[0]
    assert (err.path, err.line, err.severity) == (str(bad), line, "error")
    assert 'identifier "z" is undefined' in err.message
    assert text.splitlines()[line - 1][err.column - 1] == "z"


PTXAS_LOG = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_Z9transposePfPKfii' for 'sm_90'
ptxas info    : Function properties for _Z9transposePfPKfii
    8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 4224 bytes smem, 384 bytes cmem[0]
ptxas info    : Function properties for _Z6helperf
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function 'vec_add' for 'sm_90'
ptxas info    : Function properties for vec_add
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 12 registers, used 0 barriers, 380 bytes cmem[0]
"""


def test_ptxas_report_is_read_per_entry_function():
    t, v = parse_resources(PTXAS_LOG)
    assert (t.name, t.registers, t.barriers, t.static_smem_bytes, t.cmem_bytes) == (
        "transpose(float*, float const*, int, int)",
        40,
        1,
        4224,
        384,
    )
    assert (t.stack_bytes, t.spill_store_bytes, t.spill_load_bytes) == (8, 4, 12)
    assert (v.mangled, v.name, v.registers, v.static_smem_bytes) == ("vec_add", "vec_add", 12, 0)


def test_messages_of_each_tool():
    log = """\
/src/k.cu(12): error: identifier "q" is undefined
      int i = q + 1;
              ^

/src/k.cu(20): warning #177-D: variable "t" was declared but never referenced
      int t;
          ^

/src/host.cpp:7:3: error: 'foo' was not declared in this scope
ptxas fatal   : Unresolved extern function '_Z3barv'
"""
    msgs = parse_messages(log)
    assert [(m.severity, m.path, m.line, m.column) for m in msgs] == [
        ("error", "/src/k.cu", 12, 13),
        ("warning", "/src/k.cu", 20, 9),
        ("error", "/src/host.cpp", 7, 3),
        ("error", None, None, None),
    ]
    assert msgs[3].message == "ptxas: Unresolved extern function '_Z3barv'"


# Blocks per SM on sm_90, worked out by hand from the limits in the CUDA programming guide; the GPU
# benchmark compares the same formula with cudaOccupancyMaxActiveBlocksPerMultiprocessor for every
# fixture (benchmarks/results/).
OCCUPANCY = [
    # threads, registers, smem bytes -> blocks, limiter
    (256, 10, 0, 8, "warps"),
    (256, 64, 0, 4, "registers"),
    (128, 255, 0, 2, "registers"),
    (1024, 32, 0, 2, "warps"),
    (256, 32, 48 * 1024, 4, "shared_memory"),
    (32, 16, 0, 32, "blocks"),
    (1024, 33, 0, 1, "registers"),
    (256, 32, 228 * 1024, 0, "shared_memory"),  # more than a block may have
]


@pytest.mark.parametrize(("threads", "regs", "smem", "blocks", "limiter"), OCCUPANCY)
def test_theoretical_occupancy(threads, regs, smem, blocks, limiter):
    occ = occupancy("sm_90", threads, regs, smem)
    assert (occ.blocks_per_sm, occ.limiter) == (blocks, limiter)
    assert occ.occupancy == pytest.approx(blocks * ((threads + 31) // 32) / 64)


# Newer architectures, by hand from their rows (CUDA Programming Guide, tables 30 and 31).
OCCUPANCY_BY_ARCH = [
    # arch, threads, registers, smem bytes -> blocks, limiter, occupancy
    ("sm_100", 256, 10, 0, 8, "warps", 1.0),  # 64 warps, like sm_90
    ("sm_103", 128, 255, 0, 2, "registers", 0.125),
    ("sm_110", 1024, 32, 0, 1, "warps", 32 / 48),  # 48 warps: one 1024-thread block
    ("sm_120", 32, 16, 0, 24, "blocks", 0.5),  # 24 blocks of one warp in 48
    ("sm_121", 256, 32, 50 * 1024, 1, "shared_memory", 8 / 48),  # 100 KB, 1 KB reserved a block
    ("sm_87", 256, 32, 50 * 1024, 3, "shared_memory", 24 / 48),  # 164 KB
    ("sm_88", 256, 32, 50 * 1024, 1, "shared_memory", 8 / 48),  # like sm_86: 100 KB
    ("sm_100f", 256, 10, 0, 8, "warps", 1.0),
]


@pytest.mark.parametrize(
    ("arch", "threads", "regs", "smem", "blocks", "limiter", "fraction"), OCCUPANCY_BY_ARCH
)
def test_theoretical_occupancy_of_newer_architectures(
    arch, threads, regs, smem, blocks, limiter, fraction
):
    occ = occupancy(arch, threads, regs, smem)
    assert (occ.blocks_per_sm, occ.limiter) == (blocks, limiter)
    assert occ.occupancy == pytest.approx(fraction)


def test_every_target_of_the_installed_nvcc_has_limits():
    from optiml.arch import nvcc_targets
    from optiml.profile.static import table_for

    targets = nvcc_targets()
    if not targets:
        pytest.skip("needs nvcc to list its targets")
    assert [t for t in targets if table_for(t)[1] is not None] == []


def test_an_architecture_without_limits_falls_back_to_the_nearest_older_one():
    from optiml.harness.nvcc import Resources
    from optiml.profile.static import static_report

    r = Resources(mangled="k", name="k", arch="sm_130", registers=32)
    report = static_report("k", "sm_130", r, (256, 1, 1), None)
    assert report.notes == [
        "no occupancy table for sm_130: the occupancy shown uses sm_121's limits"
    ]
    assert report.occupancy.blocks_per_sm == 6
    old = static_report("k", "sm_50", r, (256, 1, 1), None)
    assert old.notes == ["no occupancy table for sm_50: the occupancy shown uses sm_70's limits"]


def test_kernel_resources_found_by_demangled_name_with_template_arguments():
    from optiml.harness.build import kernel_resources
    from optiml.harness.nvcc import Resources

    source = SourceFile.read(FIXTURES / "templated.cu")
    kernel = source.kernel("axpby")
    # cu++filt spells value arguments as casts; c++filt does not
    for name in (
        "void axpby<float, (int)256>(int, float, const float *, float, float *)",
        "void axpby<float, 256>(int, float, float const*, float, float*)",
    ):
        r = Resources(mangled="_Z5axpbyIfLi256EEvifPKT_S0_PS0_", name=name, arch="sm_90")
        assert kernel_resources([r], kernel) is r


def test_spec_arch_is_the_target_when_none_is_given(tmp_path):
    text = (
        (FIXTURES / "saxpy.cu")
        .read_text()
        .replace(
            " *   sizes:  n = 1 << 26, 1000003",
            " *   sizes:  n = 1 << 26, 1000003\n *   arch:   sm_80",
        )
    )
    f = tmp_path / "saxpy.cu"
    f.write_text(text)
    result = check_file(f)
    assert result.arch == "sm_80"
    assert result.kernels[0].report.resources.arch == "sm_80"
    assert check_file(f, arch="sm_90").arch == "sm_90"


def test_a_failing_numpy_reference_is_one_clear_error(tmp_path):
    import shutil

    from optiml.harness.evaluate import EvalOptions, ReferenceFailed, evaluate
    from optiml.spec import load

    shutil.copy(FIXTURES / "numpy_ref" / "rmsnorm.cu", tmp_path / "rmsnorm.cu")
    (tmp_path / "rmsnorm_ref.py").write_text(
        "def rmsnorm(x, w, y, rows, cols, eps):\n    return x.reshape(rows, cols) @ w.reshape(3, 3)\n"
    )
    source, kernel, spec = load(tmp_path / "rmsnorm.cu", "rmsnorm")
    with pytest.raises(
        ReferenceFailed,
        match=r"the NumPy reference `rmsnorm` failed at rows=8192, cols=1024, seed \d+: ValueError",
    ):
        evaluate(source, kernel, spec, None, EvalOptions(arch="sm_90", time=False))


def test_the_launcher_reaches_a_files_device_variables():
    source = SourceFile(
        """
__device__ unsigned launches;
static __device__ float partial[64], other;
namespace scratch { __device__ int flags[4]; }
__constant__ float table[4];
__device__ const int fixed = 3;
#ifdef NEVER_DEFINED
__device__ int hidden;
#endif
/* @optiml
 *   args: y: out float[n]
 *   launch: grid = cdiv(n, 64), block = 64
 *   sizes: n = 1000, 77
 */
__global__ void count(float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i == 0) launches++;
    if (i < n) y[i] = launches + partial[i % 64] + scratch::flags[i % 4] + table[i % 4] + fixed;
}
"""
    )
    assert source.device_variables == ["launches", "partial", "other", "scratch::flags"]
    build = build_kernel(source, source.kernel("count"), instantiation="", arch="sm_90")
    assert build.ok, build.log


# A GPU's limits as `runner --device` reports them (cudaGetDeviceProperties), for one newer than
# the table: 48 warps, 24 blocks, 64K registers, 100 KB of shared memory per SM.
NEWER_GPU = {
    "arch": "sm_130",
    "max_threads_per_sm": 1536,
    "max_blocks_per_sm": 24,
    "registers_per_sm": 65536,
    "smem_per_sm": 102400,
    "smem_per_block_optin": 101376,
    "smem_reserved_per_block": 1024,
}


def test_the_gpus_own_limits_are_used_where_it_is_the_target():
    from optiml.harness.nvcc import Resources
    from optiml.profile.static import static_report, table_for

    r = Resources(mangled="k", name="k", arch="sm_130", registers=32, static_smem_bytes=40000)
    report = static_report("k", "sm_130", r, (256, 1, 1), None, NEWER_GPU)
    # no "no occupancy table" note: the runtime's limits, not sm_121's row (16 of its 48 warps)
    assert report.notes == ["theoretical occupancy 33%, limited by shared memory"]
    occ = report.occupancy
    # shared memory: (40000 + 1024 reserved) rounded to 128 -> 2 blocks in 100 KB
    assert (occ.blocks_per_sm, occ.limiter) == (2, "shared_memory")
    limits, _ = table_for("sm_130", NEWER_GPU)
    assert (limits.max_warps, limits.max_blocks, limits.smem_per_sm) == (48, 24, 102400)
    # another target than the GPU's: the table
    assert table_for("sm_90", NEWER_GPU) == table_for("sm_90")
    assert static_report("k", "sm_90", r, (256, 1, 1), None, NEWER_GPU).occupancy.blocks_per_sm == 5


def test_the_gpus_limits_are_read_once_and_kept_per_gpu_and_driver(monkeypatch, tmp_path):
    from optiml.harness import device

    monkeypatch.setenv("OPTIML_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(device, "_gpu_identity", lambda: "GPU-1234-580.159.04")
    reads = []
    monkeypatch.setattr(
        device, "_properties", lambda: reads.append(1) or {**NEWER_GPU, "sm_count": 7}
    )
    device.gpu_limits.cache_clear()
    try:
        assert device.gpu_limits() == NEWER_GPU
        device.gpu_limits.cache_clear()  # another process: read from the file kept
        assert device.gpu_limits() == NEWER_GPU and reads == [1]
        assert (tmp_path / "device" / "GPU-1234-580.159.04.json").is_file()
        monkeypatch.setattr(device, "_gpu_identity", lambda: None)  # no GPU
        device.gpu_limits.cache_clear()
        assert device.gpu_limits() is None
    finally:
        device.gpu_limits.cache_clear()
