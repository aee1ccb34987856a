"""The LLM policy of OptiML-X: it asks the configured model for several edits of the current
kernel at once (prompting.py), as structured output (answers.py), and checks each before it
becomes a candidate of the search (checks.py), recording a rejected one with the reason and the
stage that failed.

Edits proposed for one variant are pooled: the search asks for one or two more children at a time
(progressive widening), and the policy answers from the pool before it asks the model again. A
failure of the provider (budget, key rejected, unreachable, no valid reply) is logged and recorded
on `rejected`, and the node gets no LLM edit; it never ends the search.
"""

from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass, field
from typing import Any

from optiml.errors import OptimlError
from optiml.harness.gpu import default_arch
from optiml.llm import (
    AuthenticationFailed,
    BudgetExceeded,
    LLMClient,
    LLMError,
    ModelNotFound,
    Offline,
    load_prompt,
)
from optiml.search.llm_policy.answers import EditProposals, ProposedEdit
from optiml.search.llm_policy.checks import EditRejected, PreparedEdit, compile_edit, prepare_edit
from optiml.search.llm_policy.prompting import (
    PROMPT,
    already_proposed,
    catalog_hints,
    history_text,
    max_tokens,
    prompt_variables,
    shown_code,
)
from optiml.search.llm_policy.record import AnswerLog, structured_with_record
from optiml.search.policy import Candidate, NodeView
from optiml.search.trajectory import Edit
from optiml.spec import parse_spec

logger = logging.getLogger(__name__)

MIN_EDITS = 3  # edits asked for at once, however few the search needs now
MAX_ROUNDS = 3  # requests per variant: a model that keeps repeating itself is not asked forever

# Errors after which no further request can succeed in this run.
_FATAL = (AuthenticationFailed, ModelNotFound, BudgetExceeded, Offline)


@dataclass
class _Pool:
    """What the model proposed for one variant so far."""

    candidates: list[Candidate] = field(default_factory=list)
    titles: list[str] = field(default_factory=list)
    rounds: int = 0


class LLMPolicy:
    """Edits from the configured LLM, each checked before it becomes a candidate."""

    name = "llm"

    def __init__(
        self,
        client: LLMClient,
        *,
        arch: str | None = None,
        min_edits: int = MIN_EDITS,
        max_rounds: int = MAX_ROUNDS,
        log: AnswerLog | None = None,
    ):
        self.client = client
        self.arch = arch
        self.min_edits = min_edits
        self.max_rounds = max_rounds
        self.log = log
        self.rejected: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self.disabled: str | None = None  # why no further request is made, after a fatal error
        self._pools: dict[str, _Pool] = {}
        self._origin: dict[str, tuple[str, str]] = {}  # variant key -> (parent key, edit title)
        self._speedups: dict[str, float | None] = {}
        self._hints: dict[str, str] = {}

    @property
    def cost_usd(self) -> float:
        return self.client.accounting.cost_usd

    async def propose(self, request: NodeView, k: int, rng: random.Random) -> list[Candidate]:
        key = request.variant.key
        self._speedups[key] = request.speedup
        pool = self._pools.setdefault(key, _Pool())
        fresh = [c for c in pool.candidates if c.edit.key not in request.tried]
        if len(fresh) >= k or pool.rounds >= self.max_rounds or self.disabled:
            return fresh
        n = max(k, self.min_edits)
        answer = await self._ask(request, pool, n)
        pool.rounds += 1
        if answer is not None:
            await self._admit(request, pool, answer.edits[:n])
        return [c for c in pool.candidates if c.edit.key not in request.tried]

    # -- asking -----------------------------------------------------------------------------

    def prompt_variables(self, request: NodeView, n: int) -> dict[str, Any]:
        code = shown_code(request)
        history, catalog = self._history(request), self._catalog_hints(request)
        return prompt_variables(request, code, n, history, catalog)

    async def _ask(self, request: NodeView, pool: _Pool, n: int) -> EditProposals | None:
        try:
            variables = self.prompt_variables(request, n)
        except OptimlError as e:  # a variant that lost its kernel: nothing to ask about
            self._reject(request, f"{n} edits", f"the variant cannot be shown: {e}", "request")
            return None
        if pool.titles:
            variables["history"] += already_proposed(pool.titles)
        prompt = load_prompt(PROMPT, **variables)
        about = {"kernel": request.kernel, "variant": request.variant.key, "round": pool.rounds}
        try:
            return await structured_with_record(
                self.client,
                prompt.messages(),
                EditProposals,
                prompt_id=prompt.id,
                log=self.log,
                about=about,
                max_tokens=max_tokens(self.client.settings, n),
            )
        except LLMError as e:
            self._failed(request, n, e)
            return None

    def _failed(self, request: NodeView, n: int, error: LLMError) -> None:
        logger.warning("the LLM policy got no edits for %s: %s", request.kernel, error)
        self.errors.append(str(error))
        self._reject(request, f"{n} edits", str(error), "request")
        if isinstance(error, _FATAL):
            self.disabled = str(error)

    def _history(self, request: NodeView) -> str:
        chain: list[tuple[str, float | None]] = []  # (title, speedup after it), root first
        key = request.variant.key
        while key in self._origin:
            parent, title = self._origin[key]
            chain.append((title, self._speedups.get(key)))
            key = parent
        chain.reverse()
        mine = [r for r in self.rejected if r.get("variant") == request.variant.key]
        return history_text(request, chain, mine)

    def _catalog_hints(self, request: NodeView) -> str:
        key = request.variant.key
        if key not in self._hints:
            self._hints[key] = catalog_hints(request)
        return self._hints[key]

    # -- checking -----------------------------------------------------------------------------

    async def _admit(self, request: NodeView, pool: _Pool, edits: list[ProposedEdit]) -> None:
        # Parsing shares one tree-sitter parser, so it stays on this thread; nvcc runs in threads.
        arch = self._arch(request)
        known = {c.edit.digest for c in pool.candidates}
        admitted: list[tuple[ProposedEdit, str, PreparedEdit]] = []
        for edit in edits:
            title = " ".join(edit.title.split())[:120] or "untitled edit"
            pool.titles.append(title)
            try:
                prepared = prepare_edit(edit, request.variant, request.path, request.kernel)
            except EditRejected as e:
                self._reject(request, title, e.reason, e.stage)
                continue
            except Exception as e:  # a bug of a check must not end the search
                logger.exception("checking an LLM edit failed")
                self._reject(request, title, f"{type(e).__name__}: {e}", "internal")
                continue
            if prepared.variant.key in known:
                self._reject(request, title, "the same code as an earlier edit", "duplicate")
                continue
            known.add(prepared.variant.key)
            admitted.append((edit, title, prepared))
        built = await asyncio.gather(
            *(asyncio.to_thread(compile_edit, p, arch) for _, _, p in admitted),
            return_exceptions=True,
        )
        for (edit, title, prepared), error in zip(admitted, built, strict=True):
            if isinstance(error, EditRejected):
                self._reject(request, title, error.reason, error.stage)
                continue
            if isinstance(error, BaseException):
                logger.error("compiling an LLM edit failed: %s", error)
                self._reject(request, title, f"{type(error).__name__}: {error}", "internal")
                continue
            variant = prepared.variant
            params = {"bottleneck": " ".join(edit.bottleneck.split())[:80]}
            if edit.why.strip():
                params["why"] = " ".join(edit.why.split())[:300]
            if edit.risk.strip():
                params["risk"] = " ".join(edit.risk.split())[:300]
            added = [f for f in variant.flags if f not in request.variant.flags]
            if added:
                params["flags"] = " ".join(added)
            # The digest covers the flags too: the same text with other flags is another edit.
            digest = Edit.digest_of(variant.text + "\0" + " ".join(variant.flags))
            edit_ = Edit(transform="llm", origin="llm", summary=title, params=params, digest=digest)
            pool.candidates.append(Candidate(edit_, 1.0 / (1 + len(pool.candidates)), variant))
            self._origin.setdefault(variant.key, (request.variant.key, title))

    def _arch(self, request: NodeView) -> str:
        if self.arch is None:
            try:
                source = request.variant.source(request.path)
                spec_arch = parse_spec(source, source.kernel(request.kernel)).arch
            except OptimlError:
                spec_arch = None
            self.arch = spec_arch or default_arch()
        return self.arch

    def _reject(self, request: NodeView, title: str, reason: str, stage: str) -> None:
        logger.info("LLM edit %r rejected at %s: %s", title, stage, reason)
        self.rejected.append(
            {"title": title, "reason": reason, "stage": stage, "variant": request.variant.key}
        )
