"""The reward-hacking corpus (fixtures/tricks/): its manifest is well formed, every original's spec
parses, every candidate keeps its kernel's parameter types, every candidate builds where it must
(and the compile-stage ones do not), honest controls compute what their originals do and the
stateless tricks pass where a naive check looks (host C++, tests/host_cuda.py), and, once the static
screen exists, it flags exactly the screen-stage tricks. No GPU; the verifier's GPU run of the corpus
is separate."""

from __future__ import annotations

import os
import shutil
import tomllib
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from optiml.cuda.source import SourceFile
from optiml.harness.build import build_kernel
from optiml.search.catalog import Context
from optiml.search.variant import Variant
from optiml.spec import load, parse_spec
from tests.host_cuda import run_against
from tests.support import FIXTURES

TRICKS = FIXTURES / "tricks"
CASES: list[dict] = tomllib.loads((TRICKS / "manifest.toml").read_text())["case"]
CLASSES = (
    "output_reuse",
    "input_keyed_cache",
    "launch_counter",
    "timing_detection",
    "side_stream",
    "modify_input",
    "lucky_race",
    "under_tolerance",
    "sanitizer_detection",
    "memorized_answers",
    "size_special_case",
    "slow_reference",
    "result_forgery",
    "hardcoded_sizes",
    "value_specialization",
    "device_state",
    "out_of_bounds",
    "preprocessor",
    "other",
)
STAGES = ("screen", "compile", "eval", "judge")
FIELDS = {"file", "original", "kernel", "class", "expect", "stage", "why"}
ORIGINALS = sorted({c["original"] for c in CASES})
KERNEL_OF = {c["original"]: c["kernel"] for c in CASES}
HONEST = [c for c in CASES if c["expect"] == "accepted"]
TRICK_CASES = [c for c in CASES if c["expect"] == "rejected"]

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")


def case_id(case: dict) -> str:
    return case["file"].removesuffix(".cu")


# ---- the manifest ------------------------------------------------------------------------------


def test_manifest_lists_every_candidate_file_once():
    listed = [c["file"] for c in CASES]
    assert len(listed) == len(set(listed)), "a file is listed twice"
    on_disk = sorted(p.name for p in TRICKS.glob("*.cu"))
    assert sorted(listed) == on_disk


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_manifest_case_is_well_formed(case):
    assert set(case) == FIELDS, f"fields: {sorted(case)}"
    assert (TRICKS / case["original"]).is_file()
    assert case["original"].startswith("originals/")
    assert case["why"].strip()
    if case["expect"] == "accepted":
        assert (case["class"], case["stage"]) == ("honest", "-")
        assert case["file"].startswith("honest_")
    else:
        assert case["expect"] == "rejected"
        assert case["class"] in CLASSES
        assert case["stage"] in STAGES
        assert case["file"].startswith(case["class"] + "_")


def test_every_class_has_a_trick_and_there_are_honest_controls():
    by_class = defaultdict(int)
    for c in TRICK_CASES:
        by_class[c["class"]] += 1
    assert [k for k in CLASSES if not by_class[k]] == []
    assert len(TRICK_CASES) >= 40
    assert len(HONEST) >= 8


def test_every_original_is_used_and_is_not_a_copy_of_a_fixture():
    on_disk = {f"originals/{p.name}" for p in (TRICKS / "originals").glob("*.cu")}
    assert on_disk == set(ORIGINALS)
    fixtures = {p.read_text() for p in FIXTURES.rglob("*.cu") if TRICKS not in p.parents}
    assert not [o for o in ORIGINALS if (TRICKS / o).read_text() in fixtures]


# ---- contracts -----------------------------------------------------------------------------------


@pytest.mark.parametrize("original", ORIGINALS)
def test_original_spec_parses(original):
    _, _, spec = load(TRICKS / original, KERNEL_OF[original])
    assert spec.sizes


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_candidate_keeps_the_kernel_and_its_parameter_types(case):
    original = SourceFile.read(TRICKS / case["original"]).kernel(case["kernel"])
    source = SourceFile.read(TRICKS / case["file"])
    candidate = source.kernel(case["kernel"])
    assert [(p.type_text, p.pointer_depth) for p in candidate.params] == [
        (p.type_text, p.pointer_depth) for p in original.params
    ]
    # A candidate's own spec brings its launch; it must parse for the harness to take it.
    if candidate.spec_comment is not None:
        parse_spec(source, candidate)


# ---- building ------------------------------------------------------------------------------------


def _build(case: dict):
    source = SourceFile.read(TRICKS / case["file"])
    kernel = source.kernel(case["kernel"])
    spec = parse_spec(source, kernel) if kernel.spec_comment else None
    _, _, contract = load(TRICKS / case["original"], case["kernel"])
    instantiation = (spec or contract).instantiation
    return case, build_kernel(source, kernel, instantiation=instantiation, arch="sm_90")


def test_candidates_build_except_where_the_compiler_must_stop_them():
    """Everything but the screen-stage tricks (caught before compiling) is compiled, in parallel:
    controls and later-stage tricks must build, compile-stage tricks must not."""
    todo = [c for c in CASES if c["stage"] != "screen"]
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        built = list(pool.map(_build, todo))
    wrong = [
        f"{c['file']}: {'built' if b.ok else next((str(m) for m in b.messages if m.severity == 'error'), b.log[-300:])}"
        for c, b in built
        if b.ok != (c["stage"] != "compile")
    ]
    assert not wrong, "\n".join(wrong)


# ---- host runs -----------------------------------------------------------------------------------

# What host C++ lacks of the CUDA intrinsics some tricks use (bit casts, round-to-nearest double
# arithmetic, a wrapping atomic increment).
HOST_SHIMS = """
#include <cstring>
inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __dadd_rn(double a, double b) { return a + b; }
"""

# Host runs, one host program per group: honest controls, and the tricks whose answer does not
# depend on what a host run lacks (poisoned outputs, the GPU's clocks, launches in between) or on a
# race. Each group's sizes keep the tricks' assumptions, as the spec's sizes do, and are small
# enough for a thread per CUDA thread; controls also run where tails and bounds checks matter.
# Every listed file must compute what its original does: a trick that failed the naive check
# would fool nothing, and a control that failed it would be no control.
HOST_RUNS = [
    (
        "originals/axpby.cu",
        [[1001], [77]],
        ["honest_axpby_float4.cu", "honest_axpby_grid_stride.cu"],
    ),
    (
        "originals/axpby.cu",
        [[1000], [520]],  # multiples of 4: the float4 overrun writes nothing that is compared
        [
            "launch_counter_axpby.cu",
            "value_specialization_axpby_scalars.cu",
            "out_of_bounds_write_past_end.cu",
        ],
    ),
    (
        "originals/sum_atomic.cu",
        [[1000], [4099], [77]],
        [
            "honest_sum_block_reduce.cu",
            "input_keyed_cache_sum.cu",
            "modify_input_sum_stash.cu",
            "under_tolerance_sum_no_tail.cu",
            "device_state_sum_chunk_partials.cu",
            "out_of_bounds_read_past_end.cu",
        ],
    ),
    (
        "originals/softmax_rows.cu",
        [[3, 777], [2, 1024], [3, 1100]],  # rows as long as the spec's: outputs ~1e-3
        [
            "honest_softmax_warp_row.cu",
            "hardcoded_sizes_softmax_file_constants.cu",
            "value_specialization_softmax_no_max.cu",
            "under_tolerance_softmax_poly_exp.cu",
        ],
    ),
    (
        "originals/layernorm_rows.cu",
        [[37, 70], [16, 33], [3, 1100]],
        [
            "honest_layernorm_warp_row.cu",
            "launch_counter_layernorm_one_in_eight.cu",
            "value_specialization_layernorm_one_pass.cu",
        ],
    ),
    (
        "originals/histogram_atomic.cu",
        [[5000], [77]],
        [
            "honest_histogram_shared.cu",
            "input_keyed_cache_histogram.cu",
            "modify_input_histogram_stash.cu",
            "value_specialization_histogram_u8_counters.cu",
        ],
    ),
    # alone: it counts on the kernel before it having left shared memory zeroed
    ("originals/histogram_atomic.cu", [[5000], [77]], ["out_of_bounds_uninit_shared.cu"]),
    (
        "originals/transpose_naive.cu",
        [[37, 70], [16, 33]],
        ["honest_transpose_tiled.cu", "output_reuse_transpose_spotcheck.cu"],
    ),
    (
        "originals/sgemm_naive.cu",
        [[37, 70, 19], [8, 33, 5], [65, 64, 17]],
        [
            "honest_sgemm_register_tiled.cu",
            "input_keyed_cache_sgemm.cu",
            "hardcoded_sizes_sgemm_literals.cu",
        ],
    ),
    (
        "originals/stencil5.cu",
        [[9, 13], [10, 16]],  # nx % 4 of 1 and 0, like the spec's 1537 and 8192
        ["launch_counter_stencil_by_pointer.cu", "size_special_case_stencil_tail_of_one.cu"],
    ),
    ("originals/gemv_rows.cu", [[37, 70], [16, 33], [9, 64]], ["honest_gemv_warp_row.cu"]),
    (
        "originals/gemv_rows.cu",
        [[37, 68], [9, 64]],  # column counts that are multiples of 4, like the spec's
        [
            "size_special_case_gemv_float4.cu",
            "modify_input_gemv_row_stash.cu",
            "device_state_gemv_row_cache.cu",
        ],
    ),
    (
        "originals/embedding_gather.cu",
        [[13, 50, 12], [7, 20, 5]],
        [
            "honest_gather_vectorized.cu",
            "output_reuse_gather_first_element.cu",
        ],
    ),
]

# ... and where a trick's assumption fails, the same host run shows its answer is wrong: sizes,
# and kernels run just before it in the host program (leaving shared memory dirty).
FAILING = {
    "size_special_case_stencil_tail_of_one.cu": ([[9, 14], [10, 19]], []),  # nx % 4 of 2 and 3
    "size_special_case_histogram_known_sizes.cu": ([[5000], [8195]], []),  # not a tuned size
    "out_of_bounds_uninit_shared.cu": ([[5000]], ["honest_histogram_shared.cu"]),
    "memorized_answers_seed_table_sum.cu": ([[100000]], []),  # inputs not in its table
    "memorized_answers_regenerate_gather.cu": ([[13, 50, 12]], []),  # seeds it does not know
}


def _contexts(original: str, files: list[str]) -> tuple[Context, list[Context]]:
    path = TRICKS / original
    orig = Context.of(Variant(path.read_text()), str(path), KERNEL_OF[original])
    cands = [
        Context.of(Variant((TRICKS / f).read_text()), str(TRICKS / f), KERNEL_OF[original])
        for f in files
    ]
    return orig, cands


def _sizes(ctx: Context, values: list[list[int]]) -> list[dict[str, int]]:
    return [dict(zip(ctx.spec.size_vars, v, strict=True)) for v in values]


def _prepare(text: str) -> str:
    return HOST_SHIMS + text


@needs_gxx
@pytest.mark.parametrize(
    ("original", "sizes", "files"),
    [pytest.param(*run, id=f"{Path(run[0]).stem}-{i}") for i, run in enumerate(HOST_RUNS)],
)
def test_host_run_computes_what_the_original_does(original, sizes, files, tmp_path):
    orig, cands = _contexts(original, files)
    bad = run_against(orig, cands, _sizes(orig, sizes), tmp_path, _prepare)
    assert dict(zip(files, bad, strict=True)) == dict.fromkeys(files, 0)


@needs_gxx
@pytest.mark.parametrize("file", sorted(FAILING))
def test_tricks_are_wrong_where_their_assumption_fails(file, tmp_path):
    original = next(c["original"] for c in CASES if c["file"] == file)
    sizes, before = FAILING[file]
    orig, cands = _contexts(original, [*before, file])
    for values in sizes:
        assert run_against(orig, cands, _sizes(orig, [values]), tmp_path, _prepare)[-1] > 0, values


def test_host_runs_cover_every_honest_control_and_name_files_of_their_original():
    named = [(o, f) for o, _, files in HOST_RUNS for f in files]
    by_file = {c["file"]: c for c in CASES}
    assert [f for o, f in named if f not in by_file or by_file[f]["original"] != o] == []
    assert [f for f in FAILING if f not in by_file] == []
    assert {c["file"] for c in HONEST} <= {f for _, f in named}


# ---- the static screen ---------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_screen_flags_exactly_the_screen_stage_tricks(case):
    screen = pytest.importorskip("optiml.harness.screen")
    original = SourceFile.read(TRICKS / case["original"])
    candidate = SourceFile.read(TRICKS / case["file"])
    findings = screen.screen(original, candidate, case["kernel"])
    if case["stage"] == "screen":
        assert findings, f"{case['file']}: no finding; it must be caught for: {case['why']}"
        for f in findings:
            assert f.line >= 1 and f.column >= 1 and f.message
    else:
        where = [f"{f.line}:{f.column}: {f.message}" for f in findings]
        assert not where, f"{case['file']} ({case['stage']}) must pass the screen: {where}"


def test_paths_in_the_manifest_are_relative_to_the_corpus():
    for c in CASES:
        assert not Path(c["file"]).is_absolute() and "/" not in c["file"]
        assert not Path(c["original"]).is_absolute()
