"""OptiML-G's Mixture-of-Thoughts path: a kernel from a task in prose (or a formula) with an LLM.

    K experts draft {kernel, spec, reference}  →  each revises after seeing the others'
    →  agreement matrix (every kernel against every reference; the oracle by vote, or the
    formula's float64 reference)  →  the aggregator writes the final kernel  →  check against the
    oracle  →  bounded repair rounds with the verdict, within the LLM budget.

Everything, the drafts, the matrix, the rounds and their costs, goes into a trajectory; with the
LLM layer's replay the same run is repeated from its recorded answers.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from optiml.errors import ExitCode, OptimlError
from optiml.generate import Generated
from optiml.generate.agreement import (
    Cell,
    Draft,
    Evaluator,
    Matrix,
    describe_interface,
    interface,
    write_draft,
)
from optiml.generate.options import MotOptions
from optiml.llm import LLMClient, LLMError, LLMSettings, load_prompt

STRATEGIES = ("memory", "parallelism", "simple", "numerics")
FORMULA = "formula"


class DraftReply(BaseModel):
    """An expert's draft: the kernel file (headers, spec comment, kernel) and its reference."""

    kernel: str = Field(description="the complete .cu file: headers, @optiml spec, kernel")
    reference: str = Field(description="a Python module: numpy, one function named as the kernel")
    notes: str = Field(description="the approach, or what changed, in two or three sentences")


class FinalReply(BaseModel):
    """The aggregator's final kernel file."""

    kernel: str = Field(description="the complete .cu file: headers, @optiml spec, kernel")
    notes: str = Field(description="which drafts' ideas it takes, or what was wrong, and why")


class NoAgreement(OptimlError):
    exit_code = ExitCode.WRONG_RESULT


class NotVerified(OptimlError):
    exit_code = ExitCode.WRONG_RESULT


@dataclass
class MotRequest:
    task: str  # prose, or the formula
    name: str
    out_dir: Path
    experts: int = 4
    repairs: int = 2
    formula: Generated | None = None  # a formula's plain kernel and float64 reference
    gpu: bool = False  # check the final kernel with the GPU harness as well


@dataclass
class MotResult:
    kernel_path: Path
    reference_path: Path
    trajectory_path: Path
    trajectory: dict[str, Any]
    notes: list[str] = field(default_factory=list)


def _draft_text(d: Draft) -> str:
    return (
        f"Kernel file:\n```\n{d.kernel_text}\n```\nReference module:\n```\n{d.reference_text}\n```"
    )


class MixtureOfThoughts:
    def __init__(self, request: MotRequest, client: LLMClient):
        self.r = request
        self.client = client
        self.evaluator = Evaluator(request.out_dir / "work")
        self.strategies = [STRATEGIES[i % len(STRATEGIES)] for i in range(request.experts)]
        self.labels = [
            s if self.strategies.count(s) == 1 else f"{s}{i}" for i, s in enumerate(self.strategies)
        ]
        self.trajectory: dict[str, Any] = {
            "task": request.task,
            "name": request.name,
            "experts": [
                {"label": label, "strategy": s}
                for label, s in zip(self.labels, self.strategies, strict=True)
            ],
            "rounds": [],
            "matrix": None,
            "oracle": None,
            "outcome": "running",
            "stopped": None,
            "accounting": None,
            "check": "CPU check: kernels run as host C++ at small sizes"
            + ("; the GPU harness decides the final kernel" if request.gpu else ""),
        }
        self._spent = client.accounting.as_dict()

    # ---- the LLM's rounds -------------------------------------------------------------------

    def _phase_cost(self) -> dict[str, Any]:
        now = self.client.accounting.as_dict()
        cost = {
            k: round(now[k] - self._spent[k], 6)
            for k in ("requests", "cache_hits", "input_tokens", "output_tokens", "cost_usd")
        }
        self._spent = now
        return cost

    def _interface_text(self, drafts: list[Draft] | None = None) -> str:
        if self.r.formula is not None:
            return (
                "Keep exactly the interface of this plain kernel generated from the task's formula "
                "(the same parameters, buffers, sizes and scalars; a faster kernel is welcome):\n"
                f"```\n{self.r.formula.kernel}\n```"
            )
        specs = [d.spec for d in drafts or [] if d.spec is not None]
        if not specs:
            return "Choose the interface (buffers, size variables, scalars) the task implies."
        common, _ = Counter(interface(s) for s in specs).most_common(1)[0]
        spec = next(s for s in specs if interface(s) == common)
        return (
            f"Most drafts share this interface; use it: {describe_interface(spec)}"
            f" (kernel parameters in the order {', '.join(spec.params)})."
        )

    async def _ask(self, prompt: str, schema: type[BaseModel], **values: object) -> Any:
        rendered = load_prompt(prompt, **values)
        return await self.client.structured(rendered.messages(), schema, prompt_id=rendered.id)

    def _strategy(self, s: str) -> str:
        return load_prompt(f"generate_strategy_{s}").user

    def _write(self, label: str, folder: str, kernel: str, reference: str) -> Draft:
        return write_draft(label, self.r.out_dir / folder / label, self.r.name, kernel, reference)

    def _record(self, phase: str, entries: list[dict[str, Any]]) -> None:
        self.trajectory["rounds"].append(
            {"phase": phase, "entries": entries, "cost": self._phase_cost()}
        )

    @staticmethod
    def _entry(d: Draft, notes: str) -> dict[str, Any]:
        return {
            "label": d.label,
            "kernel_file": str(d.cu_path),
            "reference_file": str(d.ref_path),
            "spec_problem": d.problem,
            "notes": notes,
        }

    async def _draft_round(self) -> list[Draft]:
        replies = await asyncio.gather(
            *(
                self._ask(
                    "generate_expert",
                    DraftReply,
                    strategy=self._strategy(s),
                    task=self.r.task,
                    kernel_name=self.r.name,
                    interface=self._interface_text(),
                )
                for s in self.strategies
            )
        )
        drafts = [
            self._write(label, "round1", reply.kernel, reply.reference)
            for label, reply in zip(self.labels, replies, strict=True)
        ]
        self._record(
            "draft", [self._entry(d, r.notes) for d, r in zip(drafts, replies, strict=True)]
        )
        return drafts

    async def _revise_round(self, drafts: list[Draft]) -> list[Draft]:
        shared = self._interface_text(drafts)

        def others(i: int) -> str:
            return "\n\n".join(
                f"Draft of the {d.label} expert:\n{_draft_text(d)}"
                for j, d in enumerate(drafts)
                if j != i
            )

        replies = await asyncio.gather(
            *(
                self._ask(
                    "generate_revise",
                    DraftReply,
                    strategy=self._strategy(s),
                    task=self.r.task,
                    kernel_name=self.r.name,
                    own=_draft_text(drafts[i]),
                    others=others(i),
                    interface=shared,
                )
                for i, s in enumerate(self.strategies)
            )
        )
        revised = [
            self._write(label, "round2", reply.kernel, reply.reference)
            for label, reply in zip(self.labels, replies, strict=True)
        ]
        self._record(
            "revise", [self._entry(d, r.notes) for d, r in zip(revised, replies, strict=True)]
        )
        return revised

    # ---- verification -----------------------------------------------------------------------

    def _vote(self, drafts: list[Draft]) -> tuple[Matrix, Draft]:
        references = list(drafts)
        final_say = None
        if self.r.formula is not None:
            g = self.r.formula
            references.append(self._write(FORMULA, "formula", g.kernel, g.reference))
            final_say = FORMULA
        m = self.evaluator.matrix(drafts, references, final_say)
        self.trajectory["matrix"] = m.as_dict()
        self.trajectory["oracle"] = m.oracle
        if m.oracle is None:
            raise NoAgreement(
                f"no draft kernel agrees with any draft reference ({m.why}); the drafts are in "
                f"{self.r.out_dir / 'round2'} and the matrix in the trajectory"
            )
        return m, next(r for r in references if r.label == m.oracle)

    def _check(self, final: Draft, oracle: Draft) -> Cell:
        cell = self.evaluator.check(final, oracle)
        if not cell.agrees or not self.r.gpu:
            return cell
        from optiml.harness.evaluate import evaluate_file

        verdict = evaluate_file(final.cu_path, self.r.name)
        return Cell(verdict.ok, f"GPU harness: {verdict.status}: {verdict.message}")

    async def _aggregate(self, drafts: list[Draft], m: Matrix, oracle: Draft) -> tuple[Draft, str]:
        reply = await self._ask(
            "generate_aggregate",
            FinalReply,
            task=self.r.task,
            kernel_name=self.r.name,
            drafts="\n\n".join(f"Draft of the {d.label} expert:\n{_draft_text(d)}" for d in drafts),
            matrix=m.text(),
            oracle=f"{oracle.label}'s\n```\n{oracle.reference_text}\n```",
        )
        return self._final(0, reply, oracle), reply.notes

    def _final(self, attempt: int, reply: FinalReply, oracle: Draft) -> Draft:
        return self._write(f"final{attempt}", "final", reply.kernel, oracle.reference_text)

    async def _verify_and_repair(self, final: Draft, oracle: Draft, notes: str) -> Draft:
        attempt = 0
        while True:
            cell = self._check(final, oracle)
            entry = {**self._entry(final, notes), "agrees": cell.agrees, "verdict": cell.detail}
            self._record("aggregate" if attempt == 0 else "repair", [entry])
            if cell.agrees:
                return final
            if attempt >= self.r.repairs:
                raise NotVerified(
                    f"the final kernel still fails its check after {attempt} repair round(s): "
                    f"{cell.detail}; every attempt is in {self.r.out_dir / 'final'}"
                )
            attempt += 1
            reply = await self._ask(
                "generate_repair",
                FinalReply,
                task=self.r.task,
                kernel_name=self.r.name,
                kernel=final.kernel_text,
                verdict=cell.detail,
                oracle=f"{oracle.label}'s\n```\n{oracle.reference_text}\n```",
            )
            final, notes = self._final(attempt, reply, oracle), reply.notes

    async def run(self) -> MotResult:
        try:
            drafts = await self._draft_round()
            revised = await self._revise_round(drafts)
            m, oracle = self._vote(revised)
            aggregated, notes = await self._aggregate(revised, m, oracle)
            final = await self._verify_and_repair(aggregated, oracle, notes)
        except (LLMError, OptimlError) as e:
            self.trajectory["outcome"] = "stopped"
            self.trajectory["stopped"] = str(e)
            self._save()
            raise
        kernel_path = self.r.out_dir / f"{self.r.name}.cu"
        reference_path = self.r.out_dir / f"{self.r.name}_ref.py"
        kernel_path.write_text(final.kernel_text)  # its spec names NAME_ref.py, written next to it
        reference_path.write_text(oracle.reference_text)
        self.trajectory["outcome"] = "verified"
        self.trajectory["final"] = {
            "kernel_file": str(kernel_path),
            "reference_file": str(reference_path),
        }
        path = self._save()
        notes = [
            f"oracle: {m.why}",
            "verified by a CPU check (host C++ at small sizes)"
            + (" and the GPU harness" if self.r.gpu else "; run `optiml eval` on a GPU to confirm"),
        ]
        return MotResult(kernel_path, reference_path, path, self.trajectory, notes)

    def _save(self) -> Path:
        self.trajectory["accounting"] = self.client.accounting.as_dict()
        path = self.r.out_dir / "trajectory.json"
        self.r.out_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.trajectory, indent=1))
        return path


async def mixture_of_thoughts(request: MotRequest, client: LLMClient) -> MotResult:
    return await MixtureOfThoughts(request, client).run()


def run_experts(
    task: str,
    name: str,
    out_dir: Path,
    settings: LLMSettings,
    options: MotOptions,
    formula: Generated | None = None,
) -> MotResult:
    """`mixture_of_thoughts` on `task` with a client made from `settings`, as `optiml generate`
    and the editor run it (blocking); on a machine with a GPU the harness checks the final
    kernel too."""
    from optiml.harness.gpu import local_gpus
    from optiml.llm import make_client

    request = MotRequest(
        task=task,
        name=name,
        out_dir=out_dir,
        experts=options.experts,
        repairs=options.repairs,
        formula=formula,
        gpu=bool(local_gpus()),
    )

    async def work():
        async with make_client(settings) as client:
            return await mixture_of_thoughts(request, client)

    return asyncio.run(work())
