"""The offline policy's family priors, learned from what the catalog's rewrites measured on kernels
written apart from it (benchmarks/schedules.py's results), and how well they rank rewrites on
kernels they were not learned from.

    python3 benchmarks/priors.py [--results benchmarks/results/schedules] [--learn corpus,wild]
        [--check holdout] [--priors optiml/search/family_priors.json]
        [--report benchmarks/results/priors-holdout.json]

Learning. For every kernel of the --learn sets and every rewrite measured on it, the rewrite's
best correct speedup over its parameter choices (a wrong or failed one counts as 0.5: an
evaluation spent for nothing); per family (as the lifting reads the kernel) and rewrite, the
geometric mean over kernels, shrunk toward 1.0 (the catalog's gain for a rewrite) as if two more
kernels had measured 1.0: few measurements move a prior little. A later file's measurement of a
kernel replaces an earlier one's (the fixes after a run). The priors are written as JSON with
their sources; the offline policy multiplies a rewrite's prior by its family's value where there
is one (optiml/search/priors.py).

Checking. For every kernel of the --check sets with a correct rewrite, the rewrite each ranking
puts first among those measured (without a profile: the catalog's gains and the transformations'
own parameter weights, before and with the family priors) against the best measured: how often it
is the best (within 5 %) and the geometric mean of best / first-ranked (the regret of trying one).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from optiml.search.priors import family_of  # noqa: E402

SHRINK = 2.0  # kernels' worth of a 1.0 measurement every prior starts from
FAILED = 0.5  # what a wrong or failed rewrite counts as
WITHIN = 1.05  # "the best" up to this factor
PRIOR_RANGE = (0.25, 16.0)


def measurements(results: Path) -> dict[tuple[str, str], dict]:
    """(set, kernel) -> the latest row measured for it, over the result files in name order,
    the fixes after the runs (`fixes*` sort after `shard*` in the listing below)."""
    files = sorted(results.glob("shard-*.json")) + sorted(results.glob("fixes*.json"))
    rows: dict[tuple[str, str], dict] = {}
    for f in files:
        for row in json.loads(f.read_text())["rows"]:
            rows[(row["set"], row["kernel"])] = {**row, "source": f.name}
    for row in rows.values():
        if not row.get("family"):  # an earlier run did not record it: read it again
            path = ROOT / row["file"]
            row["family"] = family_of(path.read_text(), str(path), row["kernel"]) or "opaque"
    return rows


def per_rewrite(row: dict) -> dict[str, float]:
    """A kernel's best correct speedup per rewrite (FAILED for one never correct)."""
    best: dict[str, float] = {}
    for p in row.get("proposals", []):
        s = p.get("speedup") if p.get("status") == "ok" else None
        value = s if s and s > 0 else FAILED
        best[p["transform"]] = max(best.get(p["transform"], 0.0), value)
    return best


def learn(rows: dict, sets: list[str]) -> dict:
    logs: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for (set_, _), row in sorted(rows.items()):
        if set_ not in sets or not row.get("family"):
            continue
        for name, s in per_rewrite(row).items():
            logs[row["family"]][name].append(math.log(s))
    families = {}
    for family, by_name in sorted(logs.items()):
        families[family] = {}
        for name, values in sorted(by_name.items()):
            prior = math.exp(sum(values) / (len(values) + SHRINK))
            prior = min(max(prior, PRIOR_RANGE[0]), PRIOR_RANGE[1])
            families[family][name] = {
                "kernels": len(values),
                "geomean_speedup": round(math.exp(sum(values) / len(values)), 4),
                "prior": round(prior, 4),
            }
    return families


def proposal_weights(row: dict) -> dict[str, float]:
    """Each measured rewrite's own weight of its best-weighted parameters, asked of the catalog
    again on the kernel as written (the benchmark keeps parameters, not weights)."""
    from optiml.search.catalog import CATALOG, Context
    from optiml.search.variant import Variant

    path = ROOT / row["file"]
    ctx = Context.of(Variant(path.read_text()), str(path), row["kernel"])
    measured = {
        (p["transform"], json.dumps(p.get("params"), sort_keys=True)) for p in row["proposals"]
    }
    weights: dict[str, float] = {}
    for name in {t for t, _ in measured}:
        for p in CATALOG[name].propose(ctx) if name in CATALOG else []:
            if (name, json.dumps(p.params, sort_keys=True)) in measured:
                weights[name] = max(weights.get(name, 0.0), p.weight)
    return weights


def first_ranked(row: dict, families: dict | None) -> str | None:
    """The rewrite a ranking without a profile tries first on this kernel: its prior is the
    catalog's gain (times the family's learned value) times the transformation's own weight of
    its best-weighted parameters; ties go by name, as the policy's do."""
    from optiml.search.catalog import CATALOG

    weights = proposal_weights(row)
    ranked = []
    for name, w in weights.items():
        gain = CATALOG[name].gain if name in CATALOG else 1.0
        if families is not None:
            gain = families.get(row.get("family"), {}).get(name, {}).get("prior", gain)
        ranked.append((-gain * w, name))
    return min(ranked)[1] if ranked else None


def check(rows: dict, sets: list[str], families: dict) -> dict:
    report = {}
    for label, fam in (("catalog gains", None), ("family priors", families)):
        hits, regrets, detail = 0, [], []
        for (set_, kernel), row in sorted(rows.items()):
            if set_ not in sets:
                continue
            speed = per_rewrite(row)
            best = max(speed.values(), default=0.0)
            if best <= FAILED:
                continue
            first = first_ranked(row, fam)
            got = speed.get(first, FAILED)
            hits += best <= got * WITHIN
            regrets.append(best / got)
            detail.append({"kernel": kernel, "first": first, "its_speedup": got, "best": best})
        report[label] = {
            "kernels": len(regrets),
            "first_is_best": hits,
            "geomean_regret": round(math.exp(sum(map(math.log, regrets)) / len(regrets)), 4)
            if regrets
            else None,
            "rows": detail,
        }
    return report


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--results", type=Path, default=ROOT / "benchmarks/results/schedules")
    p.add_argument("--learn", default="corpus,wild")
    p.add_argument("--check", default="holdout")
    p.add_argument("--priors", type=Path, default=ROOT / "optiml/search/family_priors.json")
    p.add_argument("--report", type=Path, default=ROOT / "benchmarks/results/priors-holdout.json")
    args = p.parse_args(argv)
    args.learn = [s for s in args.learn.split(",") if s]
    args.check = [s for s in args.check.split(",") if s]
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    rows = measurements(args.results)
    families = learn(rows, args.learn)
    sources = sorted({row["source"] for row in rows.values()})
    priors = {
        "about": "learned by benchmarks/priors.py from benchmarks/results/schedules: per family "
        "and rewrite, the geometric mean of its best correct speedup over kernels of the "
        f"sets {', '.join(args.learn)}, shrunk toward 1.0 by {SHRINK:g} kernels' worth",
        "sources": sources,
        "sets": args.learn,
        "families": families,
    }
    args.priors.write_text(json.dumps(priors, indent=1) + "\n")
    report = {"learned_from": args.learn, "checked_on": args.check, "sources": sources}
    report |= check(rows, args.check, families)
    args.report.write_text(json.dumps(report, indent=1) + "\n")
    for label in ("catalog gains", "family priors"):
        r = report[label]
        print(
            f"{label}: the first-ranked rewrite is the best on {r['first_is_best']} of "
            f"{r['kernels']} {'/'.join(args.check)} kernels; geomean best/first {r['geomean_regret']}"
        )
    return report


if __name__ == "__main__":
    main()
