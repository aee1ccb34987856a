"""The judge: before a variant is offered as faster, deterministic checks confirm it — correct at a
problem size and seeds the search never saw, no constant equal to a problem size that the input did
not have, time that grows with the size as the input's does (no skipped work), and compute-sanitizer's
memcheck and racecheck clean — plus an LLM's review where a provider is configured."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from optiml.cuda.kernel_ast import KernelAST
from optiml.cuda.source import SourceFile
from optiml.errors import OptimlError
from optiml.executors.base import Executor, Job
from optiml.harness.evaluate import EvalOptions
from optiml.search.trajectory import Check, JudgeVerdict, Measurement
from optiml.spec import Spec

logger = logging.getLogger(__name__)

UNSEEN_SEEDS = (9001, 9002)
SCALING_TOLERANCE = 2.0  # the candidate's time ratio between two sizes within 2x of the input's


def unseen_sizes(spec: Spec) -> dict[str, int]:
    """A problem size none of the spec's sizes is: about 3/4 of the first size, and odd."""
    first = spec.sizes[0]
    out = {k: max(3, (v * 3) // 4) | 1 for k, v in first.items()}
    while out in spec.sizes:
        out = {k: v + 2 for k, v in out.items()}
    return out


def hardcoded_constants(
    original: SourceFile, candidate: SourceFile, kernel: str, spec: Spec
) -> list[int]:
    """Integer literals of the candidate's kernel equal to a problem-size value of the spec (over
    255) that the input's kernel does not have: a variant that wires in the size it was tested at."""
    values = {v for s in spec.sizes for v in s.values() if v > 255}
    for s in spec.sizes:
        case = spec.case(s)
        values |= {v for v in case.lengths.values() if v > 255}

    def literals(src: SourceFile) -> set[int]:
        return set(KernelAST(src, src.kernel(kernel)).int_literals())

    return sorted((literals(candidate) - literals(original)) & values)


async def judge(
    executor: Executor,
    job: Job,
    options: EvalOptions,
    at_first_size: Measurement,
    *,
    sanitize: bool = True,
    llm_review: Any | None = None,
) -> JudgeVerdict:
    """Judge `job`'s candidate. `at_first_size` is its confirmed measurement at the first size (for
    the scaling check); `llm_review`, if given, is an async callable returning a dict verdict."""
    checks: list[Check] = []
    spec = job.spec
    unseen = unseen_sizes(spec)
    label = ", ".join(f"{k}={v}" for k, v in unseen.items())
    v = await executor.evaluate(
        job, replace(options, sizes=[unseen], seeds=UNSEEN_SEEDS, time=True, time_all_sizes=True)
    )
    checks.append(
        Check(
            name="unseen size and seeds",
            ok=v.status == "ok",
            detail=f"{v.status} at {label} with seeds {UNSEEN_SEEDS}: {v.message}",
        )
    )
    m = Measurement.of(v)
    if v.status == "ok" and m.speedup and at_first_size.speedup:
        # time(unseen)/time(first) for candidate and input: equal if both do the same work
        cand = m.candidate_ms / at_first_size.candidate_ms
        ref = m.reference_ms / at_first_size.reference_ms
        ratio = cand / ref
        checks.append(
            Check(
                name="time scales with the size",
                ok=1 / SCALING_TOLERANCE <= ratio <= SCALING_TOLERANCE,
                detail=f"from the first size to {label} the candidate's time changes {cand:.2f}x, "
                f"the input's {ref:.2f}x",
            )
        )
    constants = hardcoded_constants(job.source, job.candidate or job.source, job.kernel.name, spec)
    checks.append(
        Check(
            name="no hard-coded sizes",
            ok=not constants,
            detail="none"
            if not constants
            else f"the kernel now contains {', '.join(map(str, constants))}, a problem size",
        )
    )
    if sanitize:
        for tool in ("memcheck", "racecheck"):
            try:
                report = await executor.sanitize(job, tool)
            except OptimlError as e:
                checks.append(Check(name=tool, ok=False, detail=f"could not run: {e}"))
                continue
            detail = (
                f"0 errors at {report.size}"
                if report.ok
                else f"{report.errors} error(s) at {report.size}: {'; '.join(report.messages[:2])}"
            )
            checks.append(Check(name=tool, ok=report.ok, detail=detail))
    llm = None
    if llm_review is not None:
        try:
            llm = await llm_review()
        except Exception as e:  # the LLM's opinion is advisory; its failure is recorded
            logger.warning("LLM judge failed: %s", e)
            llm = {"error": str(e)}
        # Only a verdict is a check: "uncertain" (accept None) is recorded in `llm` and rejects
        # nothing.
        if llm and isinstance(llm.get("accept"), bool):
            checks.append(
                Check(name="LLM review", ok=llm["accept"], detail=str(llm.get("reason", "")))
            )
    return JudgeVerdict(accepted=all(c.ok for c in checks), checks=checks, llm=llm)
