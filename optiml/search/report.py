"""A self-contained HTML report of a search (one file, no scripts, no external assets): the outcome,
the best speedup over evaluations, the search tree with the edits on its edges, the bottleneck before
and after, the judge's checks and the diff of the kernel."""

from __future__ import annotations

import difflib
import html

from optiml.search.trajectory import Trajectory, TrajectoryNode

_CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 72em; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.15em; margin-top: 2em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; } td, th { padding: .2em .7em; border-bottom: 1px solid #eee; text-align: left; }
.ok { color: #1a7f37; } .bad { color: #b42318; } .dim { color: #777; }
ul.tree { list-style: none; padding-left: 1.2em; border-left: 1px dotted #bbb; }
ul.tree li { margin: .15em 0; } .edge { color: #555; } .win { font-weight: bold; background: #e6f4ea; }
pre.diff { background: #f7f7f7; padding: 1em; overflow-x: auto; font-size: 12px; }
.add { color: #1a7f37; } .del { color: #b42318; } .hunk { color: #6639ba; }
"""


def render(t: Trajectory) -> str:
    nodes = {n.id: n for n in t.nodes}
    root = next((n for n in t.nodes if n.parent is None), None)
    winner = nodes.get(t.winner) if t.winner is not None else None
    e = html.escape
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>OptiML: {e(t.kernel)}</title><style>{_CSS}</style></head><body>",
        f"<h1>OptiML-X on <code>{e(t.kernel)}</code></h1>",
        f"<p><b>{e(t.outcome)}</b></p>",
        "<table>",
        _row("file", e(t.file)),
        _row("computes", e(t.computes or "?")),
        _row("device", e(t.device or "?")),
        _row("tools", f"nvcc {e(t.nvcc)}" + (f", ncu {e(t.ncu)}" if t.ncu else "")),
        _row("date", e(t.date)),
        _row("policy", f"{e(t.policy)}, seed {t.seed}"),
        _row(
            "evaluations",
            f"{t.evaluations} (budget {t.budget if t.budget is not None else 'none'}), "
            f"{t.wall_s:.1f} s, stopped: {e(t.stop)}",
        ),
    ]
    if t.llm_cost_usd:
        parts.append(_row("LLM cost", f"${t.llm_cost_usd:.4f}"))
    parts.append("</table>")

    parts.append("<h2>Best speedup over evaluations</h2>")
    parts.append(_chart(t))

    parts.append("<h2>Bottleneck before and after</h2><table><tr><th></th><th>input</th>")
    after = t.winner_profile
    parts.append("<th>winner</th></tr>" if after else "</tr>")
    before = t.baseline.profile if t.baseline else None
    for label, get in _PROFILE_ROWS:
        parts.append(
            f"<tr><td>{label}</td><td>{e(get(before))}</td>"
            + (f"<td>{e(get(after))}</td>" if after else "")
            + "</tr>"
        )
    parts.append("</table>")

    if t.confirmed:
        parts.append("<h2>Confirmation (re-measured, interleaved with the input)</h2><table>")
        parts.append(
            "<tr><th>node</th><th>speedup</th><th>candidate</th><th>input</th><th>spread</th></tr>"
        )
        for c in t.confirmed:
            cls = " class='win'" if c.node == t.winner else ""
            parts.append(
                f"<tr{cls}><td>#{c.node}</td><td>{c.speedup:.3f}x</td><td>{c.candidate_ms:.4g} ms</td>"
                f"<td>{c.reference_ms:.4g} ms</td><td>{c.noise:.1%}</td></tr>"
            )
        parts.append("</table>")
    if t.judge is not None:
        verdict = "accepted" if t.judge.accepted else "rejected"
        parts.append(f"<h2>Judge: {verdict}</h2><table>")
        for c in t.judge.checks:
            mark = "<span class='ok'>pass</span>" if c.ok else "<span class='bad'>fail</span>"
            parts.append(f"<tr><td>{e(c.name)}</td><td>{mark}</td><td>{e(c.detail)}</td></tr>")
        parts.append("</table>")

    parts.append("<h2>Search tree</h2>")
    if root is not None:
        children: dict[int, list[TrajectoryNode]] = {}
        for n in t.nodes:
            if n.parent is not None:
                children.setdefault(n.parent, []).append(n)
        parts.append("<ul class='tree'>" + _tree(root, children, t.winner) + "</ul>")

    if winner is not None and root is not None:
        parts.append("<h2>Diff of the kernel</h2>")
        parts.append(_diff(root.kernel, winner.kernel, root.flags, winner.flags))
    parts.append("</body></html>")
    return "\n".join(parts)


def _row(k: str, v: str) -> str:
    return f"<tr><th>{k}</th><td>{v}</td></tr>"


def _fmt(v, unit: str = "", digits: str = ".1f") -> str:
    return "?" if v is None else f"{v:{digits}}{unit}"


_PROFILE_ROWS = [
    ("bottleneck", lambda p: "?" if p is None else f"{p.bottleneck}: {p.explanation}"),
    ("duration", lambda p: _fmt(p and p.duration_ms, " ms", ".4g")),
    ("DRAM bandwidth", lambda p: _fmt(p and p.dram_tbps, " TB/s", ".2f")),
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
            else f"{_fmt(p.achieved_occupancy_pct, ' %')} / {_fmt(p.theoretical_occupancy_pct, ' %')} ({p.limiter})"
        ),
    ),
    ("registers / thread", lambda p: _fmt(p and p.registers_per_thread, "", ".0f")),
    ("top stalls", lambda p: "?" if p is None else ", ".join(p.top_stalls)),
]


def _chart(t: Trajectory, width: int = 640, height: int = 220) -> str:
    points = [(p.evaluations, p.best_speedup) for p in t.progress if p.best_speedup]
    if not points:
        return "<p class='dim'>no timed candidate</p>"
    max_x = max(x for x, _ in points) or 1
    max_y = max(max(y for _, y in points), 1.0) * 1.1
    pad = 40

    def sx(x: float) -> float:
        return pad + (width - 2 * pad) * x / max_x

    def sy(y: float) -> float:
        return height - pad - (height - 2 * pad) * y / max_y

    path = " ".join(
        f"{'M' if i == 0 else 'L'}{sx(x):.1f},{sy(y):.1f}" for i, (x, y) in enumerate(points)
    )
    one = sy(1.0)
    return (
        f"<svg width='{width}' height='{height}' xmlns='http://www.w3.org/2000/svg'>"
        f"<line x1='{pad}' y1='{one:.1f}' x2='{width - pad}' y2='{one:.1f}' stroke='#bbb' stroke-dasharray='4'/>"
        f"<text x='4' y='{one + 4:.1f}' font-size='11'>1.0x</text>"
        f"<path d='{path}' fill='none' stroke='#1a73e8' stroke-width='2'/>"
        f"<text x='4' y='{sy(points[-1][1]) + 4:.1f}' font-size='11'>{points[-1][1]:.2f}x</text>"
        f"<text x='{width - pad}' y='{height - 10}' font-size='11' text-anchor='end'>{max_x} evaluations</text>"
        "</svg>"
    )


def _tree(n: TrajectoryNode, children: dict[int, list[TrajectoryNode]], winner: int | None) -> str:
    e = html.escape
    m = n.measurement
    if m is None:
        status = "<span class='dim'>not evaluated</span>"
    elif m.status != "ok":
        status = (
            f"<span class='bad'>{e(m.status)}</span> <span class='dim'>{e(m.message[:120])}</span>"
        )
    else:
        speed = f"{m.speedup:.2f}x" if m.speedup else "ok"
        bott = f" · {e(m.profile.bottleneck)}" if m.profile else ""
        status = f"<span class='ok'>{speed}</span>{bott}"
    edge = f"<span class='edge'>{e(n.edit.summary)}</span> → " if n.edit else "<b>input</b> "
    cls = " class='win'" if n.id == winner else ""
    inner = "".join(_tree(c, children, winner) for c in children.get(n.id, []))
    sub = f"<ul class='tree'>{inner}</ul>" if inner else ""
    return f"<li{cls}>#{n.id} {edge}{status}{sub}</li>"


def _diff(before: str, after: str, flags_before: list[str], flags_after: list[str]) -> str:
    lines = list(
        difflib.unified_diff(
            before.splitlines(), after.splitlines(), "input", "winner", lineterm="", n=3
        )
    )
    out = []
    for line in lines:
        cls = (
            "add"
            if line.startswith("+")
            else "del"
            if line.startswith("-")
            else "hunk"
            if line.startswith("@@")
            else ""
        )
        out.append(f"<span class='{cls}'>{html.escape(line)}</span>" if cls else html.escape(line))
    flags = (
        ""
        if flags_before == flags_after
        else f"<p>nvcc flags: {html.escape(' '.join(flags_before))} → {html.escape(' '.join(flags_after))}</p>"
    )
    return flags + "<pre class='diff'>" + "\n".join(out) + "</pre>"
