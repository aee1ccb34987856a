"""The HTML report of a search: its sections, its plots (matplotlib's SVG, read back here), its
escaping of code and LLM text, and that it stands alone. The committed H200 trajectory of the
SGEMM search is one input; the others are built here to reach what it lacks (failures, an LLM's
text, no winner, a FLOP count, an unknown device, a large tree)."""

from __future__ import annotations

import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from html.parser import HTMLParser

import pytest

from optiml.search.report import best_so_far, render, roofline_plot, speedup_plot, tree_plot
from optiml.search.trajectory import (
    Check,
    Confirmation,
    Edit,
    JudgeVerdict,
    Measurement,
    ProfileSummary,
    Trajectory,
    TrajectoryNode,
)
from tests.support import ROOT

SGEMM = ROOT / "benchmarks" / "results" / "optimize-sgemm-h200-trajectory.json"
SVG = "{http://www.w3.org/2000/svg}"


def sgemm() -> Trajectory:
    return Trajectory.model_validate_json(SGEMM.read_text())


def profile(**kw) -> ProfileSummary:
    base = dict(
        bottleneck="dram",
        explanation="DRAM at 80 % of peak",
        duration_ms=2.0,
        dram_bytes=6e9,
        dram_tbps=3.0,
        sol_compute_pct=20.0,
        sol_memory_pct=80.0,
    )
    return ProfileSummary(**(base | kw))


def node(i, parent, depth, order, status="ok", speedup=None, kernel="k", summary=None, **kw):
    m = None
    if status is not None:
        m = Measurement(status=status, message=f"{status} at n=1000", speedup=speedup)
    edit = None if parent is None else Edit(transform="t", summary=summary or f"edit {i}", **kw)
    return TrajectoryNode(
        id=i, parent=parent, depth=depth, edit=edit, kernel=kernel, flags=[], order=order,
        measurement=m,
    )  # fmt: skip


def synthetic(nodes, winner=None, **kw) -> Trajectory:
    base = dict(
        file="k.cu", kernel="k", device="NVIDIA H200", arch="sm_90", nvcc="13.0", date="2026-01-01",
        policy="offline", seed=0, budget=len(nodes), nodes=nodes, winner=winner,
        baseline=Measurement(status="ok", message="ok", speedup=1.0, profile=profile()),
    )  # fmt: skip
    return Trajectory(**(base | kw))


def svg_of(fragment) -> ET.Element:
    assert fragment.svg is not None, fragment.caption
    return ET.fromstring(str(fragment.svg))


def by_gid(svg: ET.Element, gid: str) -> ET.Element:
    found = svg.find(f".//*[@id='{gid}']")
    assert found is not None, f"no element {gid!r} in the SVG"
    return found


def path_points(el: ET.Element) -> list[tuple[float, float]]:
    d = el.find(f".//{SVG}path").get("d")
    nums = [float(v) for v in re.findall(r"-?\d+(?:\.\d+)?", d)]
    return list(zip(nums[::2], nums[1::2], strict=True))


# ---------------------------------------------------------------- the best-so-far curve


def test_the_speedup_curve_never_goes_down_where_the_searchs_best_did():
    t = sgemm()
    recorded = [p.best_speedup for p in t.progress]
    assert any(b < a for a, b in zip(recorded, recorded[1:], strict=False))  # the old curve fell
    points = best_so_far(t)
    best = [b for _, _, b in points]
    assert best == sorted(best)
    measured = [n.measurement.speedup for n in t.nodes if n.measurement.status == "ok"]
    assert best[-1] == max(measured)
    assert [x for x, _, _ in points] == list(range(1, len(t.nodes) + 1))


def test_the_drawn_curve_is_the_best_so_far():
    t = sgemm()
    line = by_gid(svg_of(speedup_plot(t)), "best-so-far")
    pts = path_points(line)
    ys = [y for _, y in pts]  # SVG's y grows downwards: a rising curve has falling y
    assert all(b <= a + 1e-9 for a, b in zip(ys, ys[1:], strict=False))
    assert ys[0] > ys[-1]  # it rises from the input's 1.0x to the best


def test_failures_are_marked_and_do_not_lower_the_best():
    nodes = [
        node(0, None, 0, 0, speedup=1.0),
        node(1, 0, 1, 1, speedup=1.5),
        node(2, 0, 1, 2, status="wrong_result"),
        node(3, 1, 2, 3, speedup=1.2),
        node(4, 1, 2, None, status=None),  # expanded, never evaluated
    ]
    points = best_so_far(synthetic(nodes))
    assert points == [(1, 1.0, 1.0), (2, 1.5, 1.5), (3, None, 1.5), (4, 1.2, 1.5)]
    plot = speedup_plot(synthetic(nodes))
    assert "4 evaluations, 3 correct and timed" in plot.caption[0]
    assert "failed a check" in str(plot.svg)


def test_no_timed_evaluation_is_said_not_drawn():
    t = synthetic([node(0, None, 0, 0, status="compile_error")])
    plot = speedup_plot(t)
    assert plot.svg is None and "no speedup to plot" in plot.caption[0]
    assert "no speedup to plot" in render(t)


# ---------------------------------------------------------------- roofline


def test_the_roofline_says_what_the_trajectory_lacks():
    plot = roofline_plot(sgemm())  # its profiles keep DRAM bytes and time, not FLOPs
    text = " ".join(plot.caption)
    for who in ("input", "winner"):
        assert f"records no FLOP count for the {who}" in text
    svg = svg_of(plot)
    assert by_gid(svg, "roofline-line-input") is not None
    assert by_gid(svg, "roofline-line-winner") is not None
    assert "4.3 TB/s DRAM, 67.0 FP32 TFLOP/s" in text  # the H200's ceilings, with their source


def test_the_roofline_places_a_kernel_whose_flops_are_known():
    class WithFlops(ProfileSummary):  # a summary that keeps ncu's FLOP count
        flops: float | None = None

    t = synthetic([node(0, None, 0, 0, speedup=1.0), node(1, 0, 1, 1, speedup=2.0)], winner=1)
    t.baseline.profile = WithFlops(**profile().model_dump(), flops=3e9)
    t.winner_profile = WithFlops(**profile(duration_ms=1.0).model_dump(), flops=3e9)
    plot = roofline_plot(t)
    svg = svg_of(plot)
    by_gid(svg, "roofline-point-input")
    by_gid(svg, "roofline-point-winner")
    text = ET.tostring(svg, encoding="unicode")
    # 3e9 FLOP over 6e9 bytes; 3e9 FLOP in 2 ms and in 1 ms
    assert "input: 0.5 FLOP/B, 1.5 TFLOP/s" in text
    assert "winner: 0.5 FLOP/B, 3 TFLOP/s" in text
    assert not any("no FLOP count" in c for c in plot.caption)


def test_an_unknown_device_has_no_roof_and_says_so():
    t = synthetic([node(0, None, 0, 0, speedup=1.0)], device="Some Future GPU")
    plot = roofline_plot(t)
    assert any("No ceilings are known for the device Some Future GPU" in c for c in plot.caption)
    assert "device roof" not in str(plot.svg)


def test_without_profiles_there_is_no_roofline():
    t = synthetic([node(0, None, 0, 0, speedup=1.0)], baseline=None)
    plot = roofline_plot(t)
    assert plot.svg is None and "no profile" in plot.caption[0]


# ---------------------------------------------------------------- the tree picture


def test_every_node_is_drawn_and_a_large_tree_renders():
    nodes = [node(0, None, 0, 0, speedup=1.0)]
    for i in range(1, 300):  # a wide and deep tree: each node's parent is a third of its id
        parent = i // 3
        status = "wrong_result" if i % 7 == 0 else "ok"
        nodes.append(node(i, parent, nodes[parent].depth + 1, i, status, speedup=1 + i / 300))
    t = synthetic(nodes, winner=299)
    svg = svg_of(tree_plot(t))
    assert len(by_gid(svg, "tree-nodes").findall(f".//{SVG}use")) == len(nodes)
    html = render(t)
    assert html.count("<li") == len(nodes) == html.count("</li>")
    assert html.count("<ul") == html.count("</ul>") == 1 + sum(1 for n in nodes if 3 * n.id < 300)


def test_a_deep_chain_renders():
    nodes = [node(0, None, 0, 0, speedup=1.0)]
    nodes += [node(i, i - 1, i, i, speedup=1.0 + i / 1000) for i in range(1, 400)]
    html = render(synthetic(nodes, winner=399))
    assert html.count("<li") == 400


# ---------------------------------------------------------------- the page


class Tags(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


def tags(html: str) -> list[tuple[str, dict]]:
    p = Tags()
    p.feed(html)
    return p.tags


def test_the_report_has_every_section_of_the_sgemm_search():
    t = sgemm()
    html = render(t)
    ids = {a.get("id") for _, a in tags(html)}
    assert {"summary", "computes", "progress", "bottleneck", "tree", "diff", "judge"} <= ids
    assert {"plot-speedup", "plot-roofline", "plot-tree"} <= ids
    assert "8.80x</b>" in html  # the confirmed speedup of the winner, #3
    assert "#3:" in html and "__restrict__ (and const where read-only) on A, B, C" in html
    assert "accepted by the judge" in html
    for c in t.judge.checks:
        assert c.name in html
    assert "l1_shared → compute" in html  # the bottleneck's shift
    assert "Not recorded in this trajectory." in html  # it predates `computes`
    assert '<span class="add">+__global__ void __launch_bounds__(256, 2) sgemm_naive' in html
    assert html.count("<svg") == 3


def test_the_report_stands_alone():
    html = render(sgemm())
    kinds = [tag for tag, _ in tags(html)]
    assert "script" not in kinds and "link" not in kinds and "iframe" not in kinds
    for tag, attrs in tags(html):
        for key in ("src", "href", "xlink:href"):
            target = attrs.get(key)
            if target is not None:  # only references inside the page (matplotlib's glyphs, clips)
                assert target.startswith("#"), (tag, key, target)
    assert "url(http" not in html and "@import" not in html


def test_kernel_code_edits_and_llm_text_are_escaped():
    evil = "<script>alert(1)</script>"
    nodes = [
        node(0, None, 0, 0, speedup=1.0, kernel="if (a < b && c > d) {}"),
        node(
            1,
            0,
            1,
            1,
            speedup=2.0,
            kernel=f"// {evil}\nif (a < b) {{}}",
            summary=evil,
            origin="llm",
        ),  # fmt: skip
    ]
    t = synthetic(
        nodes,
        winner=1,
        confirmed=[
            Confirmation(
                node=1, speedup=2.0, candidate_ms=1, reference_ms=2, noise=0.01, repeats=10
            )
        ],  # fmt: skip
        judge=JudgeVerdict(
            accepted=False,
            checks=[Check(name="LLM review", ok=False, detail=f"says {evil}")],
            llm={"verdict": f"</td>{evil}", "concerns": [evil]},
        ),
        rejected=[{"title": evil, "reason": "<b>bad</b>", "stage": "screen"}],
        computes=f"map: {evil}",
        outcome=evil,
    )
    html = render(t)
    assert "<script" not in html and "<b>bad</b>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "if (a &lt; b &amp;&amp; c &gt; d) {}" in html
    assert "rejected by the judge" in html and 'class="origin">LLM' in html


def test_without_a_winner_there_is_no_after_and_no_diff():
    nodes = [node(0, None, 0, 0, speedup=1.0), node(1, 0, 1, 1, speedup=0.9)]
    html = render(
        synthetic(nodes, outcome="no improvement: the best candidate re-measured at 0.90x")
    )
    ids = {a.get("id") for _, a in tags(html)}
    assert "diff" not in ids and "<th>input</th><th>winner</th>" not in html
    assert "dram → no winner" in html
    assert re.search(r"<th>winner</th><td>\s*none\s*</td>", html)


def test_the_same_trajectory_gives_the_same_bytes():
    assert render(sgemm()) == render(sgemm())


@pytest.mark.parametrize("broken", ["nodes", "parent"])
def test_a_trajectory_with_holes_still_renders(broken):
    t = sgemm()
    if broken == "nodes":
        t.nodes = []
    else:
        t.nodes[3].parent = 99  # a parent the trajectory does not hold
    html = render(t)
    assert "Search tree" in html


def test_the_example_script_writes_the_report_and_refuses_bad_input(tmp_path):
    script = [sys.executable, str(ROOT / "benchmarks" / "example_report.py")]
    out = tmp_path / "r.html"
    ok = subprocess.run([*script, str(SGEMM), "--out", str(out)], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert out.read_text(encoding="utf-8").count("<svg") == 3
    bad = tmp_path / "bad.json"
    for text, code, said in (
        (None, 3, f"{tmp_path / 'missing.json'}: No such file"),
        ('{"file": ', 2, f"{bad}:1:10: not JSON"),
        ('{"file": "k.cu"}', 2, f"{bad}: not a trajectory: kernel: Field required"),
    ):
        path = tmp_path / "missing.json" if text is None else bad
        if text is not None:
            bad.write_text(text)
        p = subprocess.run([*script, str(path), "--out", str(out)], capture_output=True, text=True)
        assert p.returncode == code and p.stderr.startswith(said), p.stderr
        assert len(p.stderr.strip().splitlines()) == 1
        assert out.read_text(encoding="utf-8").count("<svg") == 3  # the report is kept
