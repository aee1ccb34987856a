"""The LLM judge's review of a confirmed candidate: the diff against the original and the
evidence measured for it, asked as prompt `judge`; its verdict accept, reject or uncertain."""

from __future__ import annotations

import difflib
from collections.abc import Awaitable, Callable
from typing import Any

from optiml.cuda.source import SourceFile
from optiml.errors import OptimlError
from optiml.llm import LLMClient, load_prompt
from optiml.llm.prompts import prompt_template
from optiml.search.llm_policy.answers import JudgeReview
from optiml.search.llm_policy.record import AnswerLog, structured_with_record
from optiml.search.trajectory import Measurement
from optiml.search.variant import Variant
from optiml.spec import Spec, parse_spec

JUDGE_PROMPT = "judge"


def make_llm_review(
    client: LLMClient,
    original_text: str,
    path: str,
    kernel: str,
    *,
    log: AnswerLog | None = None,
) -> Callable[[Variant, Measurement], Awaitable[dict[str, Any]]]:
    """The LLM judge: `await review(variant, measurement)` gives {"accept": True, False or None
    (uncertain), "reason": ...} plus the verdict, reasons and risks as the model gave them."""
    try:
        source = SourceFile(original_text, path)
        spec: Spec | None = parse_spec(source, source.kernel(kernel))
    except OptimlError:
        spec = None

    original_key = Variant(original_text).key

    async def review(variant: Variant, measurement: Measurement) -> dict[str, Any]:
        prompt = load_prompt(
            JUDGE_PROMPT,
            kernel=kernel,
            diff=_file_diff(original_text, variant),
            evidence=_evidence(measurement, spec),
        )
        verdict = await structured_with_record(
            client,
            prompt.messages(),
            JudgeReview,
            prompt_id=prompt.id,
            log=log,
            about={"kernel": kernel, "original": original_key, "candidate": variant.key},
        )
        accept = {"accept": True, "reject": False, "uncertain": None}[verdict.verdict]
        reasons = [" ".join(r.split()) for r in verdict.reasons if r.strip()]
        return {
            "accept": accept,
            "reason": f"{verdict.verdict}: " + ("; ".join(reasons) or "no reason given"),
            "verdict": verdict.verdict,
            "reasons": reasons,
            "risks": [" ".join(r.split()) for r in verdict.risks if r.strip()],
        }

    return review


def _file_diff(original: str, variant: Variant) -> str:
    lines = difflib.unified_diff(
        original.splitlines(), variant.text.splitlines(), "original", "candidate", n=25, lineterm=""
    )
    text = "\n".join(lines) or "(the code is unchanged)"
    return text + f"\n\nnvcc flags of the candidate: {' '.join(variant.flags) or '(none)'}"


def _evidence(m: Measurement, spec: Spec | None) -> str:
    lines = [f"Checks against the original: {m.status}: {m.message}"]
    if spec is not None:
        sizes = "; ".join(", ".join(f"{k}={v}" for k, v in s.items()) for s in spec.sizes)
        tol = f"rtol {spec.rtol}, atol {spec.atol}" if spec.rtol or spec.atol else "the defaults"
        lines.append(f"Sizes checked: {sizes}; {spec.seeds} seeds each; tolerances: {tol}")
    if m.candidate_ms is not None and m.reference_ms is not None:
        lines.append(
            f"Time at the first size: candidate {m.candidate_ms:.4g} ms "
            f"(IQR {m.candidate_iqr_ms or 0:.2g}), original {m.reference_ms:.4g} ms "
            f"(IQR {m.reference_iqr_ms or 0:.2g}); speedup {m.speedup or 0:.3f}x, "
            f"noise {m.noise:.1%}"
        )
    resources = [
        f"{label} {value}"
        for label, value in (
            ("registers/thread", m.registers),
            ("local memory bytes", m.local_bytes),
            ("blocks/SM", m.blocks_per_sm),
        )
        if value is not None
    ]
    if resources:
        lines.append("Candidate resources: " + ", ".join(resources))
    if m.device:
        lines.append(f"Device: {m.device}")
    lines.append("Profile of the candidate:")
    lines.append(m.profile.text() if m.profile else "not profiled")
    return "\n".join(lines)


# The prompt template is read at import time, so a broken one fails here, not mid-review.
prompt_template(JUDGE_PROMPT)
