"""What the offline catalog proposes for kernels it was not written against, no GPU needed: for
every kernel of the given sets, its family as the lifting reads it and the transformations that
propose a variant of it, split into rewrites (how the kernel moves its data or shares its work:
tiles, wide accesses, a warp per row, privatization...) and light touches (qualifiers, launch
bounds, unrolling, block size, fast math, a grid-stride loop). A kernel with no rewrite is one the
search can only touch lightly: the figure to watch on code the catalog was not shaped to.

Sets: `corpus` (fixtures/corpus), `holdout` (fixtures/holdout, written apart from the catalog),
`wild` (fixtures/wild), `intents` (the kernels OptiML-G writes from benchmarks/intents.py's
formulas), `kernelbench` (from the level-1 tasks under --tasks, translated by
`optiml generate --from-torch`) and `kb_extra` (the same from fixtures/kb_extra, the level-1
operations not in the shared set, written as tasks of our own).

    python3 benchmarks/catalog_coverage.py --out benchmarks/results/catalog-coverage.json \\
        [--sets corpus,holdout,wild,intents,kernelbench,kb_extra]
        [--tasks ../shared/kernelbench/level1]

Proposals are what the catalog offers, not what they gain: speed is measured on a GPU
(benchmarks/intents.py, kernelbench.py); correctness of the proposals on these sets is checked as
host C++ (tests/search/test_catalog_host.py).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from optiml import __version__  # noqa: E402
from optiml.cuda.source import SourceFile  # noqa: E402
from optiml.lift import Lifted, lift  # noqa: E402
from optiml.lift.families import describe  # noqa: E402
from optiml.search.catalog import CATALOG  # noqa: E402
from optiml.search.policy import NodeView, OfflinePolicy  # noqa: E402
from optiml.search.variant import Variant  # noqa: E402
from optiml.spec import parse_spec  # noqa: E402

SETS = ("corpus", "holdout", "wild", "intents", "kernelbench", "kb_extra")


def manifest_kernels(folder: Path, table: str) -> list[tuple[Path, str]]:
    entries = tomllib.loads((folder / "manifest.toml").read_text())[table]
    return [(folder / e["file"], e["kernel"]) for e in entries]


def generated_intents(work: Path) -> list[tuple[Path, str]]:
    from intents import INTENTS, generate_step

    out = []
    for intent in INTENTS:
        done = generate_step(intent, work / intent.name)
        if done.get("generated"):
            out.append((Path(done["file"]), intent.name))
    return out


def translated_tasks(tasks: Path, work: Path) -> tuple[list[tuple[Path, str]], list[str]]:
    out, refused = [], []
    for task in sorted(tasks.glob("*.py")):
        cu = work / f"{task.stem}.cu"
        done = subprocess.run(
            [sys.executable, "-m", "optiml.cli", "generate", "--from-torch", str(task)]
            + ["--no-optimize", "--out", str(cu)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        if done.returncode != 0 or not cu.is_file():
            refused.append(task.stem)
            continue
        source = SourceFile(cu.read_text(), str(cu))
        out += [(cu, k.name) for k in source.kernels if k.spec_comment is not None]
    return out, refused


def row(path: Path, kernel: str) -> dict:
    text = path.read_text()
    view = NodeView(variant=Variant(text), path=str(path), kernel=kernel)
    names = sorted({c.edit.transform for c in OfflinePolicy().candidates(view)})
    source = SourceFile(text, str(path))
    k = source.kernel(kernel)
    lifted = lift(source, k, parse_spec(source, k))
    family = (
        describe(lifted, parse_spec(source, k)).family if isinstance(lifted, Lifted) else "opaque"
    )
    return {
        "file": str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name,
        "kernel": kernel,
        "family": family,
        "rewrites": [n for n in names if CATALOG[n].gain >= 1.0],
        "light": [n for n in names if CATALOG[n].gain < 1.0],
    }


def environment() -> dict:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    return {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "optiml": __version__,
        "commit": commit or None,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "gpu": None,
    }


def run(args: argparse.Namespace) -> dict:
    report: dict = {**environment(), "sets": {}}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for name in args.sets:
            refused: list[str] = []
            if name == "corpus":
                kernels = manifest_kernels(ROOT / "fixtures" / "corpus", "kernel")
            elif name == "holdout":
                kernels = manifest_kernels(ROOT / "fixtures" / "holdout", "kernel")
            elif name == "wild":
                kernels = manifest_kernels(ROOT / "fixtures" / "wild", "fixture")
            elif name == "intents":
                kernels = generated_intents(work / "intents")
            else:
                tasks = args.tasks if name == "kernelbench" else ROOT / "fixtures" / "kb_extra"
                (work / name).mkdir()
                kernels, refused = translated_tasks(tasks, work / name)
            rows = [row(p, k) for p, k in kernels]
            covered = sum(bool(r["rewrites"]) for r in rows)
            report["sets"][name] = {
                "kernels": len(rows),
                "with_a_rewrite": covered,
                "refused": refused,
                "rows": rows,
            }
            print(f"{name}: {covered} of {len(rows)} kernels get a rewrite", file=sys.stderr)
    return report


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--sets", default=",".join(SETS))
    p.add_argument("--tasks", type=Path, default=ROOT.parent / "shared" / "kernelbench" / "level1")
    args = p.parse_args(argv)
    args.sets = [s for s in args.sets.split(",") if s]
    unknown = set(args.sets) - set(SETS)
    if unknown:
        p.error(f"unknown set(s): {', '.join(sorted(unknown))}; known: {', '.join(SETS)}")
    if "kernelbench" in args.sets and not args.tasks.is_dir():
        p.error(f"no KernelBench tasks at {args.tasks} (--tasks)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    report = run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
