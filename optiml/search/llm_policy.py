"""The LLM policy of OptiML-X and the LLM judge's review, on the LLM layer `optiml.llm`.

The policy asks the configured model for several edits of the current kernel at once (prompt
`edit_proposal`: the kernel with its spec comment, its profile, the edits on the way to it, and what
the offline catalog would do), as structured output. Each edit is checked cheaply before it becomes
a candidate of the search, in this order, and rejected with the reason and the stage that failed:

1. apply: exactly one of `code` (the complete new text) or `diff` (a unified diff, applied by a
   small, strict applier: context and removed lines must match exactly) is given and applies;
2. parse: the result parses (tree-sitter), with no syntax error inside the edited text;
3. signature: a kernel of the same name exists, with the same template and parameter names, types
   and order (`const` and `__restrict__` may be added);
4. spec: the spec comment is the original's (a change of its launch line alone counts as a launch
   change), the launch fields of the edit are set into it, and the spec parses and evaluates at
   every size;
5. flags: extra nvcc flags are on the allow-list;
6. unchanged: the edit changes something;
7. compile: nvcc compiles the candidate for the search's architecture (the build is cached, so the
   evaluation later reuses it).

Edits proposed for one variant are pooled: the search asks for one or two more children at a time
(progressive widening), and the policy answers from the pool before it asks the model again. A
failure of the provider (budget, key rejected, unreachable, no valid reply) is logged and recorded
on `rejected`, and the node gets no LLM edit; it never ends the search.

Replay (`--replay`) answers from the response cache. The prompts hold measured numbers (profile,
speedups, timings), which differ a little from run to run, so each answer is also kept under a key
that holds no measurement (`AnswerLog`: model, prompt version, the code and flags asked about, the
round); a replay whose prompt misses the cache uses that record, so a recorded run replays on
another run's measurements. The same holds for the judge's review.
"""

from __future__ import annotations

import asyncio
import difflib
import hashlib
import json
import logging
import os
import random
import re
import tempfile
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from pydantic import BaseModel, Field, ValidationError

from optiml.cuda.source import Kernel, SourceFile
from optiml.errors import OptimlError
from optiml.harness.build import build_kernel
from optiml.harness.gpu import default_arch
from optiml.llm import (
    AuthenticationFailed,
    BudgetExceeded,
    ConfigError,
    LLMClient,
    LLMError,
    LLMSettings,
    ModelNotFound,
    Offline,
    ReplayMiss,
    load_prompt,
    load_settings,
    make_client,
    resolve_api_key,
)
from optiml.llm.errors import redact
from optiml.llm.prompts import prompt_template
from optiml.search.catalog import CATALOG
from optiml.search.policy import Candidate, NodeView, OfflinePolicy
from optiml.search.trajectory import Edit, Measurement
from optiml.search.variant import Variant, launch_value, replace_kernel, set_spec_key
from optiml.spec import Spec, parse_spec

if TYPE_CHECKING:
    from optiml.search.request import OptimizeRequest

logger = logging.getLogger(__name__)
T = TypeVar("T", bound=BaseModel)

PROMPT = "edit_proposal"
JUDGE_PROMPT = "judge"
MIN_EDITS = 3  # edits asked for at once, however few the search needs now
MAX_ROUNDS = 3  # requests per variant: a model that keeps repeating itself is not asked forever
MAX_TOKENS_PER_EDIT = 1500
MAX_TOKENS = 16000
CATALOG_HINTS = 8

# Errors after which no further request can succeed in this run.
_FATAL = (AuthenticationFailed, ModelNotFound, BudgetExceeded, Offline)

_FLAG_ALLOWED = re.compile(
    r"^(?:-{1,2}use_fast_math|-ftz=(?:true|false)|-prec-div=(?:true|false)"
    r"|-prec-sqrt=(?:true|false)|-fmad=(?:true|false)|--extra-device-vectorization"
    r"|-{1,2}maxrregcount=(?P<regs>\d{2,3}))$"
)


# ---- what the model answers -------------------------------------------------------------------


class ProposedEdit(BaseModel):
    """One edit of the kernel as the model proposes it."""

    title: str = Field(description="a short title, e.g. 'float4 loads with a scalar tail'")
    bottleneck: str = Field(description="the bottleneck it targets, e.g. 'dram', 'latency'")
    code: str | None = Field(
        description="the complete new text of what was shown (spec comment and kernel "
        "definition, helpers above it allowed), or null when `diff` is given"
    )
    diff: str | None = Field(
        description="a unified diff against exactly the text shown, or null when `code` is given"
    )
    grid: str | None = Field(description="a new launch grid expression, or null to keep it")
    block: str | None = Field(description="a new launch block expression, or null to keep it")
    smem: str | None = Field(
        description="a new dynamic shared memory expression in bytes, or null to keep it"
    )
    flags: list[str] = Field(description="extra nvcc flags from the allowed list, [] for none")
    why: str = Field(description="why it should be faster")
    risk: str = Field(description="what could make it wrong or slower")


class EditProposals(BaseModel):
    edits: list[ProposedEdit]


class JudgeReview(BaseModel):
    verdict: Literal["accept", "reject", "uncertain"]
    reasons: list[str]
    risks: list[str]


# ---- validation -------------------------------------------------------------------------------


class EditRejected(Exception):
    """An edit failed a check before evaluation; `stage` names the check."""

    def __init__(self, stage: str, reason: str):
        super().__init__(reason)
        self.stage = stage
        self.reason = reason


class DiffError(ValueError):
    pass


_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_FENCE = re.compile(r"^\s*```[A-Za-z0-9_+-]*[ \t]*\n(.*?)\n?```\s*$", re.DOTALL)


def strip_fence(text: str) -> str:
    """`text` without a Markdown code fence around it."""
    m = _FENCE.match(text)
    return m.group(1) if m else text


def apply_unified_diff(original: str, diff: str) -> str:
    """`original` with the unified diff `diff` applied.

    Strict about content: every hunk's context and removed lines must match consecutive lines of
    `original` exactly (trailing whitespace aside), in order, and each hunk must match at one place
    only (its stated line first). The line counts of the `@@` headers are not checked, since the
    lines themselves say what the hunk is. Raises `DiffError` saying which hunk does not apply.
    """
    lines = original.split("\n")
    body = strip_fence(diff).strip("\n").split("\n")
    hunks: list[tuple[int, list[str], list[str]]] = []
    i = 0
    files = 0
    while i < len(body):
        line = body[i]
        m = _HUNK.match(line)
        if m is None:
            if line.startswith("--- ") and i + 1 < len(body) and body[i + 1].startswith("+++ "):
                files += 1
                if files > 1:
                    raise DiffError("the diff changes more than one file")
                i += 2
                continue
            if hunks or not (line.startswith(("diff ", "index ")) or not line.strip()):
                raise DiffError(f"line {i + 1} of the diff is not part of a hunk: {line[:80]!r}")
            i += 1
            continue
        old, new = [], []
        i += 1
        while i < len(body) and not _HUNK.match(body[i]):
            line = body[i]
            if line.startswith("--- ") and i + 1 < len(body) and body[i + 1].startswith("+++ "):
                break
            if line.startswith("\\"):  # "\ No newline at end of file"
                pass
            elif line == "" or line[0] == " ":
                old.append(line[1:])
                new.append(line[1:])
            elif line[0] == "-":
                old.append(line[1:])
            elif line[0] == "+":
                new.append(line[1:])
            else:
                raise DiffError(
                    f"hunk {len(hunks) + 1}: line {i + 1} starts with neither ' ', '-' nor '+'"
                )
            i += 1
        hunks.append((int(m.group(1)), old, new))
    if not hunks:
        raise DiffError("the diff has no @@ hunks")
    out: list[str] = []
    cursor = 0
    stripped = [line.rstrip() for line in lines]
    for number, (start, old, new) in enumerate(hunks, 1):
        if old == new:
            continue
        if not old:
            at = min(max(start, cursor), len(lines))  # `-N,0`: insert after line N
        else:
            want = [line.rstrip() for line in old]
            width = len(want)
            places = [
                p for p in range(cursor, len(lines) - width + 1) if stripped[p : p + width] == want
            ]
            if not places:
                raise DiffError(
                    f"hunk {number} does not apply: its lines from {old[0].strip()[:60]!r} on "
                    "are not in the code"
                )
            if start - 1 in places:
                at = start - 1
            elif len(places) == 1:
                at = places[0]
            else:
                raise DiffError(f"hunk {number} matches {len(places)} places in the code")
        out += lines[cursor:at] + new
        cursor = at + len(old)
    return "\n".join(out + lines[cursor:])


def _syntax_errors(source: SourceFile, start: int, end: int) -> list[str]:
    """Syntax errors tree-sitter finds within characters [start, end) of `source`."""
    found: list[str] = []
    stack = [source.tree.root_node]
    while stack and len(found) < 3:
        node = stack.pop()
        if not (node.has_error or node.is_missing):
            continue
        span = source.span(node)
        if span.end < start or span.start > end:
            continue
        if node.type == "ERROR" or node.is_missing:
            line = span.start_point[0] + 1
            what = f"missing {node.type}" if node.is_missing else "unexpected text"
            found.append(f"line {line}: {what}: {source.node_text(node).strip()[:60]!r}")
            continue
        stack.extend(reversed(node.children))
    return found


def _region(source: SourceFile, kernel: Kernel) -> tuple[int, int]:
    """Where the kernel's spec comment (or the kernel, if it has none) starts, and where it ends."""
    start = kernel.spec_comment.span.start if kernel.spec_comment else kernel.span.start
    return start, kernel.span.end


def kernel_region(source: SourceFile, kernel: Kernel) -> str:
    """The kernel's spec comment and definition: what the model is shown and edits."""
    start, end = _region(source, kernel)
    return source.text[start:end]


def _signature_problems(old: Kernel, new: Kernel) -> list[str]:
    problems = []
    if [(p.name, p.kind, p.type_text) for p in old.template_params] != [
        (p.name, p.kind, p.type_text) for p in new.template_params
    ]:
        problems.append("the template parameters changed")
    if len(old.params) != len(new.params):
        problems.append(f"it has {len(new.params)} parameters, not {len(old.params)}")
    for a, b in zip(old.params, new.params, strict=False):
        if (a.name, a.type_text, a.pointer_depth) != (b.name, b.type_text, b.pointer_depth):
            problems.append(f"parameter `{b.declared} {b.name}` was `{a.declared} {a.name}`")
        elif a.const_pointee and not b.const_pointee:
            problems.append(f"parameter `{b.name}` lost `const`")
        elif a.restrict and not b.restrict:
            problems.append(f"parameter `{b.name}` lost `__restrict__`")
    return problems


def _same_lines(a: str, b: str) -> bool:
    return [line.strip() for line in a.strip().splitlines()] == [
        line.strip() for line in b.strip().splitlines()
    ]


def _contract(spec: Spec) -> dict[str, Any]:
    return spec.model_dump(exclude={"launch"})


def _compiler_errors(messages: Iterable[Any], log: str) -> str:
    errors = [m for m in messages if getattr(m, "severity", "") == "error"]
    if errors:
        text = "; ".join(
            (f"line {m.line}: " if m.line else "") + m.message.strip() for m in errors[:3]
        )
    else:
        text = next((ln for ln in reversed(log.strip().splitlines()) if ln.strip()), "nvcc failed")
    return " ".join(text.split())[:400]


def merge_flags(current: tuple[str, ...], extra: Iterable[str]) -> tuple[str, ...]:
    """`current` with the allow-listed `extra` flags added (one value per option: the new wins);
    raises `EditRejected` for a flag off the allow-list."""
    added: list[str] = []
    for raw in extra:
        flag = raw.strip()
        m = _FLAG_ALLOWED.match(flag)
        if m is None:
            raise EditRejected("flags", f"nvcc flag `{flag[:40]}` is not on the allow-list")
        if m.group("regs") is not None and not 16 <= int(m.group("regs")) <= 255:
            raise EditRejected("flags", f"`{flag}`: -maxrregcount takes 16 to 255")
        flag = "-" + flag.lstrip("-") if "use_fast_math" in flag or "maxrreg" in flag else flag
        if flag not in added:
            added.append(flag)
    names = {f.split("=")[0] for f in added}
    return tuple(f for f in current if f.split("=")[0] not in names) + tuple(added)


@dataclass
class PreparedEdit:
    """An edit that passed every check but the compiler's."""

    source: SourceFile
    kernel: Kernel
    spec: Spec
    variant: Variant


def prepare_edit(edit: ProposedEdit, base: Variant, path: str, kernel_name: str) -> PreparedEdit:
    """The variant `edit` makes of `base`, checked up to compilation; else `EditRejected`."""
    source = SourceFile(base.text, path)
    kernel = source.kernel(kernel_name)
    start, end = _region(source, kernel)
    region = source.text[start:end]
    original_comment = kernel.spec_comment.text if kernel.spec_comment else None
    base_spec = parse_spec(source, kernel)

    # 1. apply
    if (edit.code is None) == (edit.diff is None) or not (edit.code or edit.diff or "").strip():
        raise EditRejected("apply", "give exactly one of `code` and `diff`")
    if edit.code is not None:
        new_region = strip_fence(edit.code).strip("\n")
    else:
        try:
            new_region = apply_unified_diff(region, edit.diff or "")
        except DiffError as e:
            raise EditRejected("apply", str(e)) from None
    text = source.text[:start] + new_region + source.text[end:]

    # 2. parse
    new_source = SourceFile(text, path)
    before = len(_syntax_errors(source, start, end))
    errors = _syntax_errors(new_source, start, start + len(new_region))
    if len(errors) > before:
        raise EditRejected("parse", "; ".join(errors))

    # 3. signature
    try:
        new_kernel = new_source.kernel(kernel_name)
    except OptimlError as e:
        raise EditRejected("signature", str(e)) from None
    problems = _signature_problems(kernel, new_kernel)
    if problems:
        raise EditRejected("signature", f"`{kernel_name}`: " + "; ".join(problems))

    # 4. spec: the original contract, with the launch the edit sets
    if original_comment is not None:
        comment = original_comment
        given = new_kernel.spec_comment
        launch = base_spec.launch
        if given is not None and not _same_lines(given.text, comment):
            try:
                given_spec = parse_spec(new_source, new_kernel)
            except OptimlError as e:
                raise EditRejected("spec", f"the edited spec comment does not parse: {e}") from None
            if _contract(given_spec) != _contract(base_spec):
                raise EditRejected(
                    "spec",
                    "the edit changes the spec comment beyond its launch; "
                    "change the launch with `grid`, `block` and `smem`",
                )
            launch = given_spec.launch
            comment = set_spec_key(
                comment, "launch", launch_value(launch.grid, launch.block, launch.smem)
            )
        if edit.grid or edit.block or edit.smem:
            grid = [edit.grid.strip()] if edit.grid else launch.grid
            block = [edit.block.strip()] if edit.block else launch.block
            smem = edit.smem.strip() if edit.smem else launch.smem
            comment = set_spec_key(comment, "launch", launch_value(grid, block, smem))
        if given is None:
            # Code without its spec comment: the comment goes back right above the kernel.
            at = new_kernel.span.start
            text = new_source.text[:at] + comment + "\n" + new_source.text[at:]
        else:
            definition = new_source.text[new_kernel.span.start : new_kernel.span.end]
            text = replace_kernel(new_source, new_kernel, definition, comment=comment)
        new_source = SourceFile(text, path)
        new_kernel = new_source.kernel(kernel_name)
    try:
        spec = parse_spec(new_source, new_kernel)
        for size in spec.sizes:
            spec.case(size)
    except (OptimlError, ValueError, ArithmeticError, TypeError) as e:
        raise EditRejected("spec", f"the candidate's spec does not hold: {e}") from None

    # 5. flags
    flags = merge_flags(base.flags, edit.flags)

    # 6. unchanged
    variant = Variant(new_source.text, flags)
    if variant.key == base.key:
        raise EditRejected("unchanged", "the edit changes nothing")
    return PreparedEdit(new_source, new_kernel, spec, variant)


def compile_edit(prepared: PreparedEdit, arch: str) -> None:
    """7. compile: nvcc builds the candidate as the evaluation will (the build is cached)."""
    build = build_kernel(
        prepared.source,
        prepared.kernel,
        instantiation=prepared.spec.instantiation,
        arch=arch,
        flags=prepared.variant.flags,
    )
    if not build.ok:
        raise EditRejected("compile", _compiler_errors(build.messages, build.log))


def check_edit(
    edit: ProposedEdit, base: Variant, path: str, kernel_name: str, arch: str
) -> Variant:
    """The variant `edit` makes of `base`, if it passes every check; else `EditRejected`."""
    prepared = prepare_edit(edit, base, path, kernel_name)
    compile_edit(prepared, arch)
    return prepared.variant


# ---- the policy ---------------------------------------------------------------------------------


@dataclass
class _Pool:
    """What the model proposed for one variant so far."""

    candidates: list[Candidate] = field(default_factory=list)
    titles: list[str] = field(default_factory=list)
    rounds: int = 0


class AnswerLog:
    """The model's answers by a key that holds no measurement, for replay on other measurements.

    The response cache keys an answer by the whole prompt, measured numbers included; this keys it
    by what was asked about (model, prompt version, the code). One JSON file per answer under
    `directory`, written then renamed; secrets are redacted."""

    def __init__(self, directory: Path, secrets: Iterable[str] = ()):
        self.directory = directory
        self._secrets = tuple(s for s in secrets if s)

    @staticmethod
    def key(client: LLMClient, prompt_id: str, **about: Any) -> tuple[str, dict[str, Any]]:
        s = client.settings
        what = {
            "provider": s.provider,
            "model": s.model,
            "base_url": s.base_url if s.provider == "openai-compatible" else None,
            "prompt": prompt_id,
            **about,
        }
        return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest(), what

    def _path(self, key: str) -> Path:
        return self.directory / key[:2] / f"{key}.json"

    def get(self, key: str, schema: type[T]) -> T | None:
        try:
            entry = json.loads(self._path(key).read_text(encoding="utf-8"))
            return schema.model_validate(entry["answer"])
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError, ValidationError) as e:
            logger.warning("ignoring unreadable recorded answer %s: %s", key[:12], e)
            return None

    def put(self, key: str, what: dict[str, Any], answer: BaseModel) -> None:
        entry = {"key": key, "request": what, "answer": answer.model_dump()}
        text = redact(json.dumps(entry, indent=1), self._secrets, key_shaped=False)
        path = self._path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(text)
            os.replace(tmp, path)
        except OSError as e:
            logger.warning("could not record the answer %s: %s", key[:12], e)


async def structured_with_record(
    client: LLMClient,
    messages: list[Any],
    schema: type[T],
    *,
    prompt_id: str,
    log: AnswerLog | None,
    about: dict[str, Any],
    max_tokens: int | None = None,
) -> T:
    """`client.structured`, and the answer kept in `log` under what it was about; in replay, a
    prompt that is not in the response cache is answered from `log` (else `ReplayMiss`)."""
    key, what = AnswerLog.key(client, prompt_id, **about)
    try:
        answer = await client.structured(
            messages, schema, max_tokens=max_tokens, prompt_id=prompt_id
        )
    except ReplayMiss:
        recorded = log.get(key, schema) if log is not None else None
        if recorded is None:
            raise
        logger.info("replayed the recorded answer for %s", json.dumps(about, sort_keys=True))
        return recorded
    if log is not None and not client.settings.replay:
        log.put(key, what, answer)
    return answer


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
        source = request.variant.source(request.path)
        kernel = source.kernel(request.kernel)
        return {
            "code": kernel_region(source, kernel),
            "flags": " ".join(request.variant.flags) or "(none)",
            "profile": request.profile.text() if request.profile else "not profiled",
            "history": self._history(request),
            "catalog": self._catalog_hints(request),
            "k": n,
        }

    async def _ask(self, request: NodeView, pool: _Pool, n: int) -> EditProposals | None:
        try:
            variables = self.prompt_variables(request, n)
        except OptimlError as e:  # a variant that lost its kernel: nothing to ask about
            self._reject(request, f"{n} edits", f"the variant cannot be shown: {e}", "request")
            return None
        if pool.titles:
            variables["history"] += (
                "\n\nAlready proposed for this exact code (propose different edits):\n"
                + "\n".join(f"- {t}" for t in pool.titles)
            )
        prompt = load_prompt(PROMPT, **variables)
        settings = self.client.settings
        max_tokens = min(MAX_TOKENS, max(settings.max_tokens, MAX_TOKENS_PER_EDIT * n + 500))
        about = {"kernel": request.kernel, "variant": request.variant.key, "round": pool.rounds}
        try:
            return await structured_with_record(
                self.client,
                prompt.messages(),
                EditProposals,
                prompt_id=prompt.id,
                log=self.log,
                about=about,
                max_tokens=max_tokens,
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
        chain: list[tuple[str, str]] = []  # (title, variant key after it), root first
        key = request.variant.key
        while key in self._origin:
            parent, title = self._origin[key]
            chain.append((title, key))
            key = parent
        chain.reverse()
        lines = []
        if chain:
            lines.append("Starting from the input kernel:")
            for i, (title, after) in enumerate(chain, 1):
                lines.append(f"{i}. {title}: {_speedup_text(self._speedups.get(after))}")
        elif request.applied:
            lines.append("Edits applied: " + ", ".join(request.applied))
            lines.append(f"Result: {_speedup_text(request.speedup)}")
        else:
            lines.append("None: this is the input kernel as the user wrote it.")
        mine = [r for r in self.rejected if r.get("variant") == request.variant.key]
        if mine:
            lines.append("\nRejected before measurement (do not repeat these mistakes):")
            lines += [f"- {r['title']}: {r['stage']}: {r['reason']}" for r in mine[-6:]]
        return "\n".join(lines)

    def _catalog_hints(self, request: NodeView) -> str:
        cached = self._hints.get(request.variant.key)
        if cached is not None:
            return cached
        seen: dict[str, str] = {}
        for c in OfflinePolicy().candidates(request):
            if c.edit.transform not in seen and len(seen) < CATALOG_HINTS:
                seen[c.edit.transform] = c.edit.summary
        lines = [
            f"- {name}: {CATALOG[name].description} (for example: {summary})"
            if name in CATALOG
            else f"- {name}: {summary}"
            for name, summary in seen.items()
        ]
        text = "\n".join(lines) or "(none applies)"
        self._hints[request.variant.key] = text
        return text

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


def _speedup_text(speedup: float | None) -> str:
    return f"{speedup:.2f}x the input's speed" if speedup else "not measured (or failed)"


# ---- the judge's review -------------------------------------------------------------------------


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


# ---- construction -------------------------------------------------------------------------------


def llm_settings(request: OptimizeRequest) -> LLMSettings:
    overrides = {k: v for k, v in (request.llm_overrides or {}).items() if v is not None}
    start = Path(request.file).expanduser().resolve().parent
    return load_settings(
        cli_overrides=overrides, editor_settings=request.editor_settings, start_dir=start
    )


def make_llm_policy(
    request: OptimizeRequest, out_dir: Path
) -> tuple[LLMPolicy, Callable[[Variant, Measurement], Awaitable[dict[str, Any]]], LLMClient]:
    """The LLM policy, the LLM judge's review and the client they share (the caller closes it).

    Raises `ConfigError` when no provider is configured (or it is `offline`) and `MissingAPIKey`
    when the provider's key is not set, before any search work. `out_dir` is the run's folder;
    the answers are kept in the response cache (the settings' `cache_dir`), not there, so a run
    with another `--out` replays them."""
    settings = llm_settings(request)
    if settings.provider == "offline":
        raise ConfigError(
            "--policy llm needs an LLM provider and none is configured: set --provider and "
            "--model (or OPTIML_LLM_PROVIDER and OPTIML_LLM_MODEL, or [llm] in optiml.toml; "
            "see docs/llm.md), or use --policy offline"
        )
    client = make_client(settings)
    key = resolve_api_key(settings.provider)
    log = None
    if settings.cache and settings.cache_dir is not None:
        log = AnswerLog(settings.cache_dir / "by-code", (key.reveal(),) if key else ())
    policy = LLMPolicy(client, arch=request.arch, log=log)
    if request.text is not None:
        original = request.text
    elif request.original_text:
        original = request.original_text
    else:
        original = SourceFile.read(request.file).text
    review = make_llm_review(client, original, str(request.file), request.kernel, log=log)
    return policy, review, client


# The prompt templates are read at import time, so a broken one fails here, not mid-search.
prompt_template(PROMPT)
prompt_template(JUDGE_PROMPT)
