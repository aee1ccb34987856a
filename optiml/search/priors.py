"""Family priors for the offline policy: how much each rewrite has gained on kernels of a family
(as the lifting reads them), learned from measurements on kernels written apart from the catalog
by benchmarks/priors.py into family_priors.json (its sources and sets are in the file). A rewrite
with no measurement in a family keeps the catalog's gain."""

from __future__ import annotations

import functools
import json
from importlib import resources

from optiml.cuda.source import SourceFile
from optiml.lift import Lifted, lift
from optiml.lift.families import describe
from optiml.spec import parse_spec


@functools.cache
def family_priors() -> dict[str, dict[str, float]]:
    """family -> rewrite -> prior (a learned geometric-mean speedup, shrunk toward 1.0)."""
    text = resources.files("optiml.search").joinpath("family_priors.json").read_text()
    families = json.loads(text)["families"]
    return {f: {name: v["prior"] for name, v in by.items()} for f, by in families.items()}


@functools.lru_cache(maxsize=256)
def family_of(text: str, path: str, kernel: str) -> str | None:
    """The kernel's family as the lifting reads it; None where it cannot be read at all."""
    try:
        source = SourceFile(text, path)
        k = source.kernel(kernel)
        spec = parse_spec(source, k)
        lifted = lift(source, k, spec)
    except Exception:  # a variant the lifting cannot read: no family, the catalog's gains
        return None
    return describe(lifted, spec).family if isinstance(lifted, Lifted) else "opaque"


def gain(family: str | None, transform: str, default: float) -> float:
    """The rewrite's prior in `family`, else `default` (the catalog's gain)."""
    if family is None:
        return default
    return family_priors().get(family, {}).get(transform, default)
