"""The offline catalog: real CUDA transformations, one module each, found here by discovery (a new
transformation is one new file in this package). `CATALOG` lists them by name, in a fixed order."""

from __future__ import annotations

import importlib
import pkgutil

from optiml.search.catalog.base import Context, Rewrite, Transformation

__all__ = ["CATALOG", "Context", "Rewrite", "Transformation", "by_name"]


def _discover() -> dict[str, Transformation]:
    found: dict[str, Transformation] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name == "base" or info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and issubclass(value, Transformation)
                and value is not Transformation
                and value.__module__ == module.__name__
            ):
                found[value.name] = value()
    return dict(sorted(found.items()))


CATALOG: dict[str, Transformation] = _discover()


def by_name(name: str) -> Transformation:
    try:
        return CATALOG[name]
    except KeyError:
        raise KeyError(f"no transformation `{name}`; known: {', '.join(CATALOG)}") from None
