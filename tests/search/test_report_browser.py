"""The report as a browser shows it: headless Chromium loads the report of the committed SGEMM
search, says where each plot lies and what its SVG holds (a copy of the page with a measuring
script; the report itself has none), then screenshots the same page at the same size, and the
plots' regions must hold their drawing: ink, and the colours of the curve, the bars and the tree.
Skipped where Chromium is not installed (CI installs the Debian package `chromium`)."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from optiml.search.report import render
from optiml.search.trajectory import Trajectory
from tests.support import ROOT

BROWSER = next(
    filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None
)
pytestmark = pytest.mark.skipif(
    BROWSER is None, reason="no Chromium here (the Debian package `chromium`)"
)

WIDTH = 1280
# Appended to a copy of the report: each plot's box in page coordinates and what Chromium made of
# its SVG, written into the page for --dump-dom to carry out.
MEASURE = """<script>
const plots = [...document.querySelectorAll("figure.plot")].map(f => {
  const s = f.querySelector("svg");
  if (!s) return {id: f.id, svg: false};
  const r = s.getBoundingClientRect();
  return {id: f.id, svg: s instanceof SVGSVGElement, x: r.left + scrollX, y: r.top + scrollY,
          w: r.width, h: r.height, paths: s.querySelectorAll("path").length,
          texts: s.querySelectorAll("text").length};
});
const height = document.documentElement.scrollHeight;
const out = document.createElement("pre");
out.id = "measured";
out.textContent = JSON.stringify({plots, height});
document.body.append(out);
</script>"""


def chromium(page: Path, profile: Path, height: int, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            BROWSER,
            "--headless",
            "--no-sandbox",  # tests run as root in CI's container
            "--disable-gpu",
            "--hide-scrollbars",
            "--force-device-scale-factor=1",
            f"--user-data-dir={profile}",
            f"--window-size={WIDTH},{height}",
            *args,
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )


def share(pixels: np.ndarray, rgb: tuple[int, int, int], tol: int = 30) -> float:
    return float((np.abs(pixels.astype(int) - rgb).max(axis=2) <= tol).mean())


def test_chromium_draws_every_plot_of_the_report(tmp_path):
    from PIL import Image  # matplotlib's own dependency

    t = Trajectory.model_validate_json(
        (ROOT / "benchmarks/results/optimize-sgemm-h200-trajectory.json").read_text()
    )
    report = render(t)
    page = tmp_path / "measured.html"
    page.write_text(report.replace("</body>", MEASURE + "</body>"), encoding="utf-8")

    dom = chromium(page, tmp_path / "p1", 1000, "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert dom.stdout.count("<svg") == report.count("<svg") == 3  # every plot parsed as SVG
    found = re.search(r'<pre id="measured">(.*?)</pre>', dom.stdout, re.S)
    assert found, "the measuring script did not run"
    measured = json.loads(html.unescape(found.group(1)))
    plots = {p["id"]: p for p in measured["plots"]}
    assert set(plots) == {"plot-speedup", "plot-roofline", "plot-tree"}
    for p in plots.values():
        assert p["svg"] and p["w"] > 300 and p["h"] > 150, p  # laid out, not collapsed
        assert p["paths"] >= 10 and p["texts"] >= 5, p  # axes, ticks, lines, labels

    shot = tmp_path / "report.png"
    run = chromium(page, tmp_path / "p2", measured["height"], f"--screenshot={shot}")
    assert run.returncode == 0 and shot.exists(), run.stderr[-2000:]
    image = np.asarray(Image.open(shot).convert("RGB"))
    assert image.shape[1] == WIDTH and image.shape[0] >= measured["height"] - 1

    def region(name: str) -> np.ndarray:
        p = plots[name]
        x, y, w, h = (round(p[k]) for k in ("x", "y", "w", "h"))
        return image[y : y + h, x : x + w]

    for name in plots:
        ink = (region(name) < 200).any(axis=2).mean()
        assert 0.01 < ink < 0.6, (name, ink)  # drawn, and not a filled or broken box
    # What each plot draws, in its own colour: the best-so-far curve, the input's and the winner's
    # bars, the winner's path through the tree.
    assert share(region("plot-speedup"), (0x1A, 0x73, 0xE8)) > 0.002
    assert share(region("plot-roofline"), (0x5B, 0x6B, 0x7F)) > 0.005
    assert share(region("plot-roofline"), (0x1A, 0x7F, 0x37)) > 0.005
    assert share(region("plot-tree"), (0x1A, 0x7F, 0x37)) > 0.002
    # a page region with no plot in it (the top margin) is blank: the checks above can fail
    assert (image[:10] < 200).any(axis=2).mean() == 0
