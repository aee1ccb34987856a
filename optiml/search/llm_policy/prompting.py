"""What the policy shows the model: prompt `edit_proposal` with the kernel and its spec comment,
its nvcc flags, its profile, the edits on the way to it (and those rejected for it, so they are
not repeated), and what the offline catalog would do."""

from __future__ import annotations

from typing import Any

from optiml.cuda.source import Kernel, SourceFile
from optiml.llm import LLMSettings
from optiml.llm.prompts import prompt_template
from optiml.search.catalog import CATALOG
from optiml.search.llm_policy.checks import editable_span
from optiml.search.policy import NodeView, OfflinePolicy

PROMPT = "edit_proposal"
MAX_TOKENS_PER_EDIT = 1500
MAX_TOKENS = 16000
CATALOG_HINTS = 8


def kernel_region(source: SourceFile, kernel: Kernel) -> str:
    """The kernel's spec comment and definition: what the model is shown and edits."""
    start, end = editable_span(source, kernel)
    return source.text[start:end]


def shown_code(view: NodeView) -> str:
    """The spec comment and definition of the variant's kernel (an `OptimlError` where the variant
    lost its kernel: nothing to ask about)."""
    source = view.variant.source(view.path)
    return kernel_region(source, source.kernel(view.kernel))


def prompt_variables(
    view: NodeView, code: str, n: int, history: str, catalog: str
) -> dict[str, Any]:
    """The variables of prompt `edit_proposal` for `n` edits of `code`, the variant `view` shows."""
    return {
        "code": code,
        "flags": " ".join(view.variant.flags) or "(none)",
        "profile": (
            "not profiled"
            if view.profile is None
            else view.profile.text()
            if view.profile_from is None
            else "not profiled itself; the profile of the kernel it comes from "
            f"({view.profile_from:.2f}x):\n{view.profile.text()}"
        ),
        "history": history,
        "catalog": catalog,
        "k": n,
    }


def already_proposed(titles: list[str]) -> str:
    """What `history` gains once edits were asked for this exact code before."""
    return "\n\nAlready proposed for this exact code (propose different edits):\n" + "\n".join(
        f"- {t}" for t in titles
    )


def max_tokens(settings: LLMSettings, n: int) -> int:
    """The answer's token limit for `n` edits: the settings', raised for many edits, bounded."""
    return min(MAX_TOKENS, max(settings.max_tokens, MAX_TOKENS_PER_EDIT * n + 500))


def speedup_text(speedup: float | None) -> str:
    return f"{speedup:.2f}x the input's speed" if speedup else "not measured (or failed)"


def history_text(
    view: NodeView, chain: list[tuple[str, float | None]], rejected: list[dict[str, Any]]
) -> str:
    """The edits on the way to the variant (`chain`: each edit's title and the speedup after it,
    the input's first), or the search's own account of them; then the edits rejected for it."""
    lines = []
    if chain:
        lines.append("Starting from the input kernel:")
        for i, (title, speedup) in enumerate(chain, 1):
            lines.append(f"{i}. {title}: {speedup_text(speedup)}")
    elif view.applied:
        lines.append("Edits applied: " + ", ".join(view.applied))
        lines.append(f"Result: {speedup_text(view.speedup)}")
    else:
        lines.append("None: this is the input kernel as the user wrote it.")
    if rejected:
        lines.append("\nRejected before measurement (do not repeat these mistakes):")
        lines += [f"- {r['title']}: {r['stage']}: {r['reason']}" for r in rejected[-6:]]
    return "\n".join(lines)


def catalog_hints(view: NodeView) -> str:
    """What the offline catalog proposes for the variant, one line per transformation (at most
    `CATALOG_HINTS`), with an example of each."""
    seen: dict[str, str] = {}
    for c in OfflinePolicy().candidates(view):
        if c.edit.transform not in seen and len(seen) < CATALOG_HINTS:
            seen[c.edit.transform] = c.edit.summary
    lines = [
        f"- {name}: {CATALOG[name].description} (for example: {summary})"
        if name in CATALOG
        else f"- {name}: {summary}"
        for name, summary in seen.items()
    ]
    return "\n".join(lines) or "(none applies)"


# The prompt template is read at import time, so a broken one fails here, not mid-search.
prompt_template(PROMPT)
