"""A self-contained HTML report of a search: one file, no scripts, no external assets. Jinja2
templates (`templates/`, autoescaped: kernel code, edit summaries and any LLM text are escaped)
hold the page; matplotlib draws the plots as inline SVG: the best speedup so far over
evaluations, the roofline position of the input and the winner, and the search tree."""

from __future__ import annotations

import difflib
import io
import math
from dataclasses import dataclass, field
from typing import Any

import jinja2
import matplotlib
import numpy as np
from markupsafe import Markup
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from optiml.profile.model import CEILINGS, Ceilings
from optiml.search.trajectory import ProfileSummary, Trajectory, TrajectoryNode

_ENV = jinja2.Environment(
    loader=jinja2.PackageLoader("optiml.search", "templates"),
    autoescape=jinja2.select_autoescape(enabled_extensions=("html", "j2"), default=True),
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)

# Colours of a node's verdict, in the tree picture and its legend.
_COLOURS = {
    "input": "#5b6b7f",
    "faster": "#1a7f37",
    "not faster": "#c58a00",
    "failed": "#b42318",
    "not evaluated": "#c8c8c8",
}
_BLUE = "#1a73e8"


def render(t: Trajectory) -> str:
    """The report of trajectory `t`, one HTML document."""
    nodes = {n.id: n for n in t.nodes}
    root = next((n for n in t.nodes if n.parent is None), None)
    winner = nodes.get(t.winner) if t.winner is not None else None
    before = t.baseline.profile if t.baseline else None
    after = t.winner_profile
    confirmed = next((c for c in t.confirmed if c.node == t.winner), None)
    return _ENV.get_template("report.html.j2").render(
        t=t,
        root=root,
        winner=winner,
        winner_path=[nodes[i].edit.summary for i in reversed(_ancestry(t)) if nodes[i].edit],
        confirmed=confirmed,
        profile_rows=[(label, get(before), get(after)) for label, get in _PROFILE_ROWS],
        before=before,
        after=after,
        speedup_plot=speedup_plot(t),
        roofline_plot=roofline_plot(t),
        tree_plot=tree_plot(t),
        tree=_tree_items(root, t) if root is not None else [],
        diff=_diff(root, winner) if root is not None and winner is not None else None,
        llm_judge=_flat(t.judge.llm) if t.judge is not None and t.judge.llm else [],
    )


@dataclass
class Plot:
    """A figure as inline SVG with what it shows and what it lacks, in words."""

    svg: Markup | None
    caption: list[str] = field(default_factory=list)


# ---------------------------------------------------------------- speedup over evaluations


def best_so_far(t: Trajectory) -> list[tuple[int, float | None, float | None]]:
    """Per evaluation, in the order the search ran them: (evaluation number, that variant's
    measured speedup or None where it failed or was not timed, the best measured speedup so far).
    The best is over measured speedups, so it never goes down; the search's own ranking (its
    reward) can prefer a slightly slower variant, which is why `Trajectory.progress` may."""
    runs = sorted(
        (n for n in t.nodes if n.order is not None and n.measurement is not None),
        key=lambda n: n.order,
    )
    out: list[tuple[int, float | None, float | None]] = []
    best: float | None = None
    for i, n in enumerate(runs, 1):
        m = n.measurement
        s = m.speedup if m.status == "ok" and m.speedup is not None else None
        if s is not None and (best is None or s > best):
            best = s
        out.append((i, s, best))
    return out


def speedup_plot(t: Trajectory) -> Plot:
    points = best_so_far(t)
    timed = [(x, s) for x, s, _ in points if s is not None]
    if not timed:
        return Plot(None, ["No evaluation was timed correctly: there is no speedup to plot."])
    fig, ax = _figure(7.5, 3.2)
    xs = np.array([x for x, _, b in points if b is not None])
    best = np.array([b for _, _, b in points if b is not None])
    ax.axhline(1.0, color="#999", lw=1, ls="--")
    ax.annotate("input (1.0x)", (0, 1.0), xycoords=("axes fraction", "data"), xytext=(4, 3),
                textcoords="offset points", fontsize=8, color="#666")  # fmt: skip
    ax.scatter(*zip(*timed, strict=True), s=14, color="#7a7a7a", zorder=3, label="each evaluation")
    failed = [x for x, s, _ in points if s is None]
    if failed:
        ax.plot(failed, [0.03] * len(failed), "x", color=_COLOURS["failed"], ms=5,
                transform=ax.get_xaxis_transform(), label="failed a check", clip_on=False)  # fmt: skip
    (line,) = ax.step(xs, best, where="post", color=_BLUE, lw=2, label="best so far", zorder=4)
    line.set_gid("best-so-far")
    ax.annotate(f"{best[-1]:.2f}x", (xs[-1], best[-1]), xytext=(4, 4),
                textcoords="offset points", fontsize=9, color=_BLUE)  # fmt: skip
    confirmed = next((c for c in t.confirmed if c.node == t.winner), None)
    if confirmed is not None:
        ax.axhline(confirmed.speedup, color=_COLOURS["faster"], lw=1, ls=":",
                   label=f"winner re-measured: {confirmed.speedup:.2f}x")  # fmt: skip
    ax.set_xlabel("evaluations")
    ax.set_ylabel("speedup over the input")
    ax.set_xlim(0.5, max(len(points), 1) + 0.5)
    ax.set_ylim(bottom=0)
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.legend(loc="lower right", fontsize=8, frameon=False)
    caption = [
        f"{len(points)} evaluations, {len(timed)} correct and timed at the search's first size; "
        "the line is the best measured speedup so far."
    ]
    return Plot(_svg(fig, "speedup"), caption)


# ---------------------------------------------------------------- roofline


@dataclass
class _Position:
    label: str
    colour: str
    profile: ProfileSummary | None
    flops: float | None = None

    @property
    def seconds(self) -> float | None:
        p = self.profile
        return p.duration_ms / 1e3 if p is not None and p.duration_ms else None

    @property
    def dram_tbps(self) -> float | None:
        p = self.profile
        if p is None:
            return None
        if p.dram_bytes is not None and self.seconds:
            return p.dram_bytes / self.seconds / 1e12
        return p.dram_tbps

    @property
    def intensity(self) -> float | None:  # FLOP per DRAM byte
        p = self.profile
        return self.flops / p.dram_bytes if self.flops is not None and p and p.dram_bytes else None

    @property
    def tflops(self) -> float | None:
        return self.flops / self.seconds / 1e12 if self.flops is not None and self.seconds else None


def roofline_plot(t: Trajectory) -> Plot:
    """Arithmetic intensity against achieved FLOP/s under the device's ceilings where the
    trajectory has the numbers; beside it, each unit's share of its peak (speed of light)."""
    positions = [
        _Position("input", _COLOURS["input"], t.baseline.profile if t.baseline else None),
        _Position("winner", _COLOURS["faster"], t.winner_profile),
    ]
    for pos in positions:
        # A profile summary that keeps the FLOP count (ncu's full set) places the kernel.
        pos.flops = getattr(pos.profile, "flops", None)
    if t.winner is None:
        positions.pop()
    if all(p.profile is None for p in positions):
        return Plot(None, ["The trajectory has no profile of the input or of a winner."])
    ceilings = CEILINGS.get(t.device or "")
    caption: list[str] = []
    fig = Figure(figsize=(10, 3.6), layout="constrained")
    roof_ax, sol_ax = fig.subplots(1, 2, width_ratios=[3, 2])
    _roofline(roof_ax, positions, ceilings, caption)
    _speed_of_light(sol_ax, positions, ceilings)
    if ceilings is not None:
        caption.append(
            f"Ceilings of the {ceilings.device}: {ceilings.dram_tbps} TB/s DRAM, "
            f"{ceilings.fp32_tflops} FP32 TFLOP/s ({ceilings.source})."
        )
    else:
        caption.append(
            f"No ceilings are known for the device {t.device or '(not recorded)'}: the roof is not "
            "drawn; the right panel's shares of peak are Nsight Compute's own."
        )
    for pos in positions:
        if pos.profile is None:
            caption.append(f"The {pos.label} has no profile in this trajectory.")
    return Plot(_svg(fig, "roofline"), caption)


def _roofline(ax, positions: list[_Position], ceilings: Ceilings | None, caption: list[str]):
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / DRAM byte)")
    ax.set_ylabel("achieved TFLOP/s")
    x = np.logspace(-2, 3, 200)
    if ceilings is not None:
        roof = np.minimum(ceilings.fp32_tflops, x * ceilings.dram_tbps)
        ax.plot(x, roof, color="#222", lw=1.5, label="device roof")
        ax.set_ylim(1e-3 * ceilings.fp32_tflops, 2 * ceilings.fp32_tflops)
    for pos in positions:
        if pos.intensity is not None and pos.tflops is not None:
            (mark,) = ax.plot([pos.intensity], [pos.tflops], "o", ms=8, color=pos.colour,
                              label=f"{pos.label}: {pos.intensity:.3g} FLOP/B, "
                              f"{pos.tflops:.3g} TFLOP/s")  # fmt: skip
            mark.set_gid(f"roofline-point-{pos.label}")
        elif pos.dram_tbps:
            # Without a FLOP count the kernel lies somewhere on FLOP/s = intensity x its DRAM
            # throughput: the line is drawn, the point is not.
            (mark,) = ax.plot(x, x * pos.dram_tbps, ls="--", lw=1.2, color=pos.colour,
                              label=f"{pos.label}: somewhere on this line "
                              f"({pos.dram_tbps:.3g} TB/s DRAM)")  # fmt: skip
            mark.set_gid(f"roofline-line-{pos.label}")
            caption.append(
                f"The trajectory records no FLOP count for the {pos.label}, so its arithmetic "
                "intensity is unknown: the dashed line is every position its measured DRAM "
                f"throughput ({pos.dram_tbps:.3g} TB/s) allows."
            )
        elif pos.profile is not None:
            caption.append(
                f"The {pos.label}'s profile has neither a FLOP count nor DRAM bytes and a "
                "duration: it cannot be placed on the roofline."
            )
    ax.set_xlim(x[0], x[-1])
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="lower right", fontsize=7, frameon=False)
    ax.set_title("roofline", fontsize=9)


def _speed_of_light(ax, positions: list[_Position], ceilings: Ceilings | None):
    units = ["compute (SM)", "memory", "DRAM vs ceiling"]
    width = 0.8 / len(positions)
    for i, pos in enumerate(positions):
        p = pos.profile
        dram = (
            100 * pos.dram_tbps / ceilings.dram_tbps
            if ceilings is not None and pos.dram_tbps is not None
            else None
        )
        values = [p and p.sol_compute_pct, p and p.sol_memory_pct, dram]
        ys = np.arange(len(units)) + (i - (len(positions) - 1) / 2) * width
        bars = ax.barh(ys, [v or 0 for v in values], height=width, color=pos.colour,
                       label=pos.label)  # fmt: skip
        for bar, v in zip(bars, values, strict=True):
            text = "n/a" if v is None else f"{v:.0f} %"
            ax.annotate(text, (bar.get_width(), bar.get_y() + bar.get_height() / 2),
                        xytext=(3, 0), textcoords="offset points", va="center", fontsize=7)  # fmt: skip
    ax.set_yticks(np.arange(len(units)), units, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, 115)
    ax.set_xlabel("% of peak")
    ax.legend(loc="lower right", fontsize=7, frameon=False)
    ax.set_title("speed of light", fontsize=9)


# ---------------------------------------------------------------- the search tree


def _kind(n: TrajectoryNode) -> str:
    m = n.measurement
    if n.parent is None:
        return "input"
    if m is None:
        return "not evaluated"
    if m.status != "ok":
        return "failed"
    return "faster" if m.speedup is not None and m.speedup > 1 else "not faster"


def _children(t: Trajectory) -> dict[int, list[TrajectoryNode]]:
    children: dict[int, list[TrajectoryNode]] = {}
    for n in sorted(t.nodes, key=lambda n: n.id):
        if n.parent is not None:
            children.setdefault(n.parent, []).append(n)
    return children


def _layout(root: TrajectoryNode, children) -> dict[int, tuple[float, int]]:
    """A layered layout: leaves side by side in depth-first order, a parent above the middle of
    its children, one row per depth."""
    at: dict[int, tuple[float, int]] = {}
    next_leaf = 0.0
    stack: list[tuple[TrajectoryNode, int, bool]] = [(root, 0, False)]
    while stack:  # iterative: a deep tree does not hit Python's recursion limit
        n, depth, done = stack.pop()
        kids = children.get(n.id, [])
        if not kids:
            at[n.id] = (next_leaf, depth)
            next_leaf += 1
        elif done:
            at[n.id] = ((at[kids[0].id][0] + at[kids[-1].id][0]) / 2, depth)
        else:
            stack.append((n, depth, True))
            stack.extend((k, depth + 1, False) for k in reversed(kids))
    return at


def tree_plot(t: Trajectory) -> Plot:
    root = next((n for n in t.nodes if n.parent is None), None)
    if root is None:
        return Plot(None, ["The trajectory has no nodes."])
    children = _children(t)
    at = _layout(root, children)
    leaves = sum(1 for n in at if n not in children)
    depth = max(d for _, d in at.values())
    fig, ax = _figure(min(max(2 + 0.6 * leaves, 5), 14), min(max(1.2 + 0.9 * (depth + 1), 2.4), 9))
    winners = set(_ancestry(t))
    for n in t.nodes:
        if n.parent in at and n.id in at:
            (x0, y0), (x1, y1) = at[n.parent], at[n.id]
            on_path = n.id in winners
            ax.plot([x0, x1], [y0, y1], color="#1a7f37" if on_path else "#bbb",
                    lw=2.2 if on_path else 0.9, zorder=1)  # fmt: skip
    size = 90 if len(at) <= 60 else 30 if len(at) <= 300 else 10
    shown = [n for n in t.nodes if n.id in at]
    dots = ax.scatter([at[n.id][0] for n in shown], [at[n.id][1] for n in shown], s=size,
                      c=[_COLOURS[_kind(n)] for n in shown], zorder=2, edgecolors="white",
                      linewidths=0.5)  # fmt: skip
    dots.set_gid("tree-nodes")
    if t.winner in at:
        ax.scatter(*at[t.winner], s=size * 3.5, facecolors="none", edgecolors="#111",
                   linewidths=1.6, zorder=3)  # fmt: skip
    for n in shown:
        if len(at) <= 40 or n.id in (t.winner, root.id):
            m = n.measurement
            speed = f"\n{m.speedup:.2f}x" if m and m.status == "ok" and m.speedup else ""
            ax.annotate(f"#{n.id}{speed}", at[n.id], xytext=(0, -9), textcoords="offset points",
                        ha="center", va="top", fontsize=7)  # fmt: skip
    ax.set_ylim(depth + 0.8, -0.5)
    ax.set_xlim(-0.7, max(leaves - 0.3, 0.7))
    ax.set_yticks(range(depth + 1))
    ax.set_ylabel("depth (edits from the input)")
    ax.set_xticks([])
    for side in ("top", "right", "bottom"):
        ax.spines[side].set_visible(False)
    handles = [
        Line2D([], [], marker="o", ls="", color=c, label=k)
        for k, c in _COLOURS.items()
        if any(_kind(n) == k for n in shown)
    ]
    if t.winner in at:
        handles.append(Line2D([], [], marker="o", ls="", mfc="none", mec="#111", label="winner"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8,
              frameon=False)  # fmt: skip
    unplaced = len(t.nodes) - len(at)
    caption = [f"{len(at)} nodes, {depth} edits deep; the winner's path is drawn in green."]
    if unplaced:
        caption.append(f"{unplaced} nodes have a parent missing from the trajectory: not drawn.")
    return Plot(_svg(fig, "tree"), caption)


def _ancestry(t: Trajectory) -> list[int]:
    """The winner's id and its ancestors' (none without a winner)."""
    parents = {x.id: x.parent for x in t.nodes}
    out: list[int] = []
    n = t.winner if t.winner in parents else None
    while n in parents and n not in out:
        out.append(n)
        n = parents.get(n)
    return out


def _tree_items(root: TrajectoryNode, t: Trajectory) -> list[dict[str, Any]]:
    """The tree as a nested list, flattened for the template: items in depth-first order, each
    saying whether a sub-list opens after it (`opens`) or how many close (`closes`). No recursion,
    in Python or in the template, however deep the tree."""
    children = _children(t)
    order: list[tuple[TrajectoryNode, int]] = []
    stack = [(root, 0)]
    while stack:
        n, depth = stack.pop()
        order.append((n, depth))
        stack.extend((c, depth + 1) for c in reversed(children.get(n.id, [])))
    items = []
    for i, (n, depth) in enumerate(order):
        m = n.measurement
        following = order[i + 1][1] if i + 1 < len(order) else 0
        items.append(
            {
                "id": n.id,
                "edit": n.edit.summary if n.edit else None,
                "origin": n.edit.origin if n.edit else None,
                "status": None if m is None else m.status,
                "message": "" if m is None else m.message[:160],
                "speedup": None if m is None else m.speedup,
                "bottleneck": m.profile.bottleneck if m is not None and m.profile else None,
                "winner": n.id == t.winner,
                "opens": following > depth,
                "closes": max(depth - following, 0),
            }
        )
    return items


# ---------------------------------------------------------------- the rest


def _diff(root: TrajectoryNode, winner: TrajectoryNode) -> dict[str, Any]:
    lines = difflib.unified_diff(
        root.kernel.splitlines(), winner.kernel.splitlines(), "input", "winner", lineterm="", n=3
    )
    classes = (("+++", "file"), ("---", "file"), ("@@", "hunk"), ("+", "add"), ("-", "del"))
    return {
        "lines": [
            (next((c for p, c in classes if line.startswith(p)), ""), line) for line in lines
        ],
        "flags": None if root.flags == winner.flags else (root.flags, winner.flags),
    }


def _flat(d: dict[str, Any]) -> list[tuple[str, str]]:
    """An LLM judge's structured verdict as (key, text) rows."""
    return [(str(k), v if isinstance(v, str) else repr(v)) for k, v in d.items()]


def _fmt(v, unit: str = "", digits: str = ".1f") -> str:
    return "?" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:{digits}}{unit}"


_PROFILE_ROWS = [
    ("bottleneck", lambda p: "?" if p is None else f"{p.bottleneck}: {p.explanation}"),
    ("duration", lambda p: _fmt(p and p.duration_ms, " ms", ".4g")),
    ("profiled at", lambda p: "?" if p is None else p.size or "the first declared size"),
    ("DRAM bandwidth", lambda p: _fmt(p and p.dram_tbps, " TB/s", ".2f")),
    ("DRAM bytes", lambda p: _fmt(p and p.dram_bytes and p.dram_bytes / 1e9, " GB", ".3g")),
    (
        "SOL compute / memory",
        lambda p: (
            "?"
            if p is None
            else f"{_fmt(p.sol_compute_pct, ' %')} / {_fmt(p.sol_memory_pct, ' %')}"
        ),
    ),
    (
        "occupancy achieved / theoretical",
        lambda p: (
            "?"
            if p is None
            else f"{_fmt(p.achieved_occupancy_pct, ' %')} / "
            f"{_fmt(p.theoretical_occupancy_pct, ' %')} ({p.limiter})"
        ),
    ),
    ("registers / thread", lambda p: _fmt(p and p.registers_per_thread, "", ".0f")),
    ("top stalls", lambda p: "?" if p is None else ", ".join(p.top_stalls) or "none"),
    ("Nsight Compute hints", lambda p: "?" if p is None else "; ".join(p.advice) or "none"),
]


def _figure(width: float, height: float):
    fig = Figure(figsize=(width, height), layout="constrained")
    ax = fig.subplots()
    ax.grid(True, color="#eee", lw=0.6)
    ax.set_axisbelow(True)
    return fig, ax


def _svg(fig: Figure, salt: str) -> Markup:
    """`fig` as an inline <svg> element: text kept as text, ids fixed by `salt` (one per figure,
    so two figures of a page never share one), no date, so the same trajectory gives the same
    bytes."""
    buf = io.StringIO()
    with matplotlib.rc_context({"svg.hashsalt": f"optiml-{salt}", "svg.fonttype": "none"}):
        fig.savefig(buf, format="svg", metadata={"Date": None})
    text = buf.getvalue()
    return Markup(text[text.index("<svg") :])
