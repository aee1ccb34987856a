"""Proposals: what an optimize job found (the confirmed, judged variant of the whole file), or the
kernel a generate job made from a comment (to go below it, with its reference as a new file), held
until the user accepts or rejects it. Shown as code lenses over the kernel; accepted as a
`workspace/applyEdit` with the fewest whole-line edits, versioned against the document as it is now
(the server never writes the user's file); compared as a diff with a copy of the variant in the
job's folder; explained by the job's HTML report.

A proposal is about the kernel's lines at the job's snapshot (spec comment to closing brace, and
the helpers the variant puts right before them). While those lines are unchanged it still applies,
wherever the kernel has moved; once they changed it is refused, and kept for Compare."""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from lsprotocol import types
from pygls.exceptions import JsonRpcInvalidParams

from optiml.api import GeneratedKernel, OptimizeResult, ProfileSummary, Trajectory, outline
from server.capabilities import ClientCapabilities
from server.documents import Block, Model, Snapshot, kernel_block
from server.protocol import shown

ACCEPT_COMMAND = "optiml.acceptProposal"
REJECT_COMMAND = "optiml.rejectProposal"
COMPARE_COMMAND = "optiml.compareProposal"
REPORT_COMMAND = "optiml.openReport"
COMMANDS = (ACCEPT_COMMAND, REJECT_COMMAND, COMPARE_COMMAND, REPORT_COMMAND)
_ANNOTATION = "optiml.proposal"


@dataclass(frozen=True)
class LineEdit:
    """Lines [start, end) of a text replaced by `lines`."""

    start: int
    end: int
    lines: tuple[str, ...]


@dataclass(frozen=True)
class Proposal:
    id: str  # the job's
    snapshot: Snapshot  # what the job optimized
    kernel: str
    block: Block  # the kernel's lines at the snapshot
    variant: str  # the whole file, as the job's winner has it
    new_block: tuple[str, ...] | None  # the variant's lines for `block`, if nothing else changed
    speedup: float | None  # None: a generated kernel that was not optimized
    before_ms: float | None
    after_ms: float | None
    before: ProfileSummary | None
    after: ProfileSummary | None
    summaries: tuple[str, ...]  # the winner's edits, first to last
    outcome: str
    folder: Path  # the job's folder
    report: Path | None
    trajectory: Path | None
    # A generated kernel's proposal is about the comment it came from (`block`: the comment's
    # lines), not a kernel; it inserts the kernel below it and creates its reference file.
    anchor: Literal["kernel", "comment"] = "kernel"
    files: tuple[tuple[str, str], ...] = ()  # (name next to the document, text) to create
    notes: tuple[str, ...] = ()  # what the generator said (default sizes, say)

    @property
    def label(self) -> str:
        """`OptiML: 2.31× faster (dram → dram)`; a generated kernel's: `OptiML: y_kernel, generated
        (2.31× faster than the plain kernel)`"""
        shift = f" ({self.before.bottleneck} → {self.after.bottleneck})" if self.shifted else ""
        if self.anchor == "comment":
            if self.speedup is None:
                return f"OptiML: `{self.kernel}`, generated (the plain kernel)"
            return f"OptiML: `{self.kernel}`, generated ({self.speedup:.2f}× faster than the plain kernel){shift}"
        return f"OptiML: {self.speedup:.2f}× faster{shift}"

    @property
    def accept_title(self) -> str:
        if self.speedup is None:
            return f"Accept `{self.kernel}` (plain, not optimized)"
        if self.anchor == "comment":
            return f"Accept `{self.kernel}` ({self.speedup:.2f}× faster than plain)"
        return f"Accept ({self.speedup:.2f}× faster)"

    @property
    def shifted(self) -> bool:
        return self.before is not None and self.after is not None

    @property
    def file_name(self) -> str:
        return Path(self.snapshot.path).name if self.snapshot.path != "<memory>" else "kernel.cu"


def make_proposal(
    job: str, snapshot: Snapshot, kernel: str, outcome: OptimizeResult, folder: Path
) -> Proposal | None:
    """The proposal of a finished optimize job, or None without a winner. Parses the snapshot:
    called in the job's thread, not on the event loop."""
    t = outcome.trajectory
    if outcome.winner is None or outcome.speedup is None:
        return None
    found = outline(snapshot.text, snapshot.path).kernel(kernel)
    if found is None:  # the search read the kernel from this very text
        raise ValueError(f"no kernel {kernel} in the optimized snapshot")
    lines = snapshot.text.split("\n")
    block = kernel_block(lines, found)
    variant = outcome.winner
    confirmed = next((c for c in t.confirmed if c.node == t.winner), None)
    return Proposal(
        id=job,
        snapshot=snapshot,
        kernel=kernel,
        block=block,
        variant=variant,
        new_block=_replacement(lines, block, variant.split("\n")),
        speedup=outcome.speedup,
        before_ms=confirmed.reference_ms if confirmed else None,
        after_ms=confirmed.candidate_ms if confirmed else None,
        before=outcome.baseline_profile,
        after=t.winner_profile,
        summaries=tuple(_summaries(t)),
        outcome=t.outcome,
        folder=folder,
        report=outcome.files.get("report"),
        trajectory=outcome.files.get("trajectory"),
    )


def make_generated_proposal(
    job: str,
    snapshot: Snapshot,
    g: GeneratedKernel,
    outcome: OptimizeResult | None,
    not_run: str,
    folder: Path,
) -> Proposal:
    """A generate job's proposal: the delivered kernel (the search's confirmed, judged winner,
    else the plain kernel) below the comment, its reference as a new file next to the document."""
    lines = snapshot.text.split("\n")
    first, last = g.comment_first, g.comment_last
    block = Block(first, last, "\n".join(lines[first : last + 1]))
    won = outcome is not None and outcome.winner is not None
    delivered = outcome.winner if outcome is not None and outcome.winner else g.standalone
    inserted = ["", *g.inserted(delivered).rstrip("\n").split("\n")]
    if last + 1 < len(lines) and lines[last + 1].strip():
        inserted.append("")  # a blank line before what followed the comment
    new_block = (*block.text.split("\n"), *inserted)
    t = outcome.trajectory if outcome is not None else None
    confirmed = next((c for c in t.confirmed if c.node == t.winner), None) if t else None
    if t is None:
        verdict = f"compiled; not run against its reference ({not_run})"
    else:
        verdict = (
            "the plain kernel is correct against its float64 NumPy reference; "
            + t.outcome.replace(" -> ", " → ")
        )
    return Proposal(
        id=job,
        snapshot=snapshot,
        kernel=g.name,
        block=block,
        variant="\n".join([*lines[: last + 1], *inserted, *lines[last + 1 :]]),
        new_block=new_block,
        speedup=outcome.speedup if won and outcome is not None else None,
        before_ms=confirmed.reference_ms if confirmed else None,
        after_ms=confirmed.candidate_ms if confirmed else None,
        before=outcome.baseline_profile if won and outcome is not None else None,
        after=(t.winner_profile if won else outcome.baseline_profile) if t and outcome else None,
        summaries=tuple(_summaries(t)) if won and t is not None else (),
        outcome=verdict,
        folder=folder,
        report=outcome.files.get("report") if outcome is not None else None,
        trajectory=outcome.files.get("trajectory") if outcome is not None else None,
        anchor="comment",
        files=((g.reference_file, g.reference),),
        notes=tuple(g.notes),
    )


def _replacement(lines: list[str], block: Block, new: list[str]) -> tuple[str, ...] | None:
    """The variant's lines in place of the block's, if it has the same lines before and after."""
    after = len(lines) - block.last - 1
    if len(new) < block.first + after:
        return None
    if (
        new[: block.first] != lines[: block.first]
        or new[len(new) - after :] != lines[block.last + 1 :]
    ):
        return None
    return tuple(new[block.first : len(new) - after])


def _summaries(t: Trajectory) -> Iterator[str]:
    nodes = {n.id: n for n in t.nodes}
    path, node = [], nodes.get(t.winner) if t.winner is not None else None
    while node is not None:
        if node.edit is not None:
            path.append(node.edit.summary)
        node = nodes.get(node.parent) if node.parent is not None else None
    return reversed(path)


class Proposals:
    """One proposal per (document, kernel): a newer job's replaces the older one."""

    def __init__(self) -> None:
        self._by_id: dict[str, Proposal] = {}

    def add(self, proposal: Proposal) -> None:
        for p in list(self._by_id.values()):
            if (p.snapshot.uri, p.kernel) == (proposal.snapshot.uri, proposal.kernel):
                del self._by_id[p.id]
        self._by_id[proposal.id] = proposal

    def get(self, proposal_id: str) -> Proposal | None:
        return self._by_id.get(proposal_id)

    def drop(self, proposal_id: str) -> Proposal | None:
        return self._by_id.pop(proposal_id, None)

    def of(self, uri: str, kernel: str | None = None) -> list[Proposal]:
        return [
            p for p in self._by_id.values() if p.snapshot.uri == uri and kernel in (None, p.kernel)
        ]


def proposal_arg(command: str, args: tuple[Any, ...]) -> str:
    """`[{proposal}]` → the id; a clear InvalidParams otherwise."""
    if len(args) == 1 and isinstance(args[0], dict) and isinstance(args[0].get("proposal"), str):
        return args[0]["proposal"]
    raise JsonRpcInvalidParams(f"{command} takes [{{proposal}}], got {shown(args)}")


# ---- code lenses ----------------------------------------------------------------------------


def code_lenses(proposals: list[Proposal], model: Model) -> list[types.CodeLens]:
    """Accept, Reject, Compare and Report over each kernel with a proposal: the lenses' range is the
    kernel's lines, so that a client that runs the lenses of the cursor's line finds them anywhere
    in the kernel."""
    out = []
    for p in proposals:
        block = anchor(p, model)
        if block is None:
            continue
        at = model.range((block.first, 0), model.line_end(block.last))
        arg = [{"proposal": p.id}]
        titles = [
            (p.accept_title, ACCEPT_COMMAND),
            ("Reject", REJECT_COMMAND),
            ("Compare", COMPARE_COMMAND),
        ]
        if p.report is not None:
            titles.append(("Report", REPORT_COMMAND))
        out += [
            types.CodeLens(range=at, command=types.Command(title=t, command=c, arguments=arg))
            for t, c in titles
        ]
    return out


# ---- accept -----------------------------------------------------------------------------------


def line_edits(old: list[str], new: list[str] | tuple[str, ...], at: int = 0) -> list[LineEdit]:
    """The fewest whole-line edits that turn `old` into `new` (difflib), `at` lines down."""
    matcher = difflib.SequenceMatcher(None, old, list(new), autojunk=False)
    return [
        LineEdit(at + i1, at + i2, tuple(new[j1:j2]))
        for tag, i1, i2, j1, j2 in matcher.get_opcodes()
        if tag != "equal"
    ]


def anchor(p: Proposal, model: Model) -> Block | None:
    """Where the proposal is in the document now: its kernel's lines, or (a generated kernel's)
    the comment's lines where they still are as they were (the nearest such place)."""
    if p.anchor == "kernel":
        kernel = model.kernel(p.kernel)
        return model.block(kernel) if kernel is not None else None
    want = p.block.text.split("\n")
    n = len(want)
    if model.lines[p.block.first : p.block.first + n] == want:  # where it was: no search
        return Block(p.block.first, p.block.last, p.block.text)
    places = [i for i in range(len(model.lines) - n + 1) if model.lines[i : i + n] == want]
    if not places:
        return None
    first = min(places, key=lambda i: abs(i - p.block.first))
    return Block(first, first + n - 1, p.block.text)


def plan(p: Proposal, model: Model) -> list[LineEdit] | str:
    """The edits that put the proposal in the document as it is now, or why they cannot."""
    name = f"`{p.kernel}`"
    if p.anchor == "comment":
        block = anchor(p, model)
        if block is None:
            return (
                f"OptiML: the comment that {name} was generated from changed; the proposal is "
                "kept (Compare shows it), or generate it again"
            )
        assert p.new_block is not None  # a generated kernel's lines always go below the comment
        return line_edits(p.block.text.split("\n"), p.new_block, block.first)
    if model.snapshot.text == p.snapshot.text:
        if p.new_block is None:  # the variant changed more than the kernel: the whole diff
            return line_edits(model.lines, p.variant.split("\n"))
        return line_edits(p.block.text.split("\n"), p.new_block, p.block.first)
    kernel = model.kernel(p.kernel)
    if kernel is None:
        return (
            f"OptiML: {name} is no longer in {p.file_name}; the proposal is kept (Compare shows it)"
        )
    block = model.block(kernel)
    if block.text != p.block.text:
        return (
            f"OptiML: {name} changed since the optimize job started, so its proposal no longer "
            "applies; it is kept: Compare shows it, or optimize the kernel again"
        )
    if p.new_block is None:
        return (
            f"OptiML: the proposal for {name} changes more than the kernel and {p.file_name} "
            "changed since the job started; optimize the kernel again"
        )
    return line_edits(p.block.text.split("\n"), p.new_block, block.first)


def workspace_edit(
    p: Proposal, model: Model, edits: list[LineEdit], caps: ClientCapabilities
) -> types.WorkspaceEdit:
    """The edits against the document's current version; annotated (to be confirmed) where the
    client supports change annotations."""
    uri = model.snapshot.uri
    plain = [types.TextEdit(range=r, new_text=t) for r, t in text_edits(model, edits)]
    if not caps.document_changes:
        return types.WorkspaceEdit(changes={uri: plain})
    annotations = None
    body: list[types.TextEdit | types.AnnotatedTextEdit] = list(plain)
    if caps.change_annotations:
        body = [
            types.AnnotatedTextEdit(range=e.range, new_text=e.new_text, annotation_id=_ANNOTATION)
            for e in plain
        ]
        annotations = {
            _ANNOTATION: types.ChangeAnnotation(
                label=p.label, description=description(p), needs_confirmation=True
            )
        }
    document = types.OptionalVersionedTextDocumentIdentifier(
        uri=uri, version=model.snapshot.version
    )
    changes: list[Any] = []
    if caps.creates_files:  # else the server writes them once the edit is applied
        for name, text in p.files:
            new = (Path(p.snapshot.path).parent / name).as_uri()
            created = types.OptionalVersionedTextDocumentIdentifier(uri=new, version=None)
            start = types.Range(types.Position(0, 0), types.Position(0, 0))
            changes += [
                types.CreateFile(uri=new, options=types.CreateFileOptions(ignore_if_exists=False)),
                types.TextDocumentEdit(
                    text_document=created, edits=[types.TextEdit(range=start, new_text=text)]
                ),
            ]
    changes.append(types.TextDocumentEdit(text_document=document, edits=body))
    return types.WorkspaceEdit(document_changes=changes, change_annotations=annotations)


def files_in_the_way(p: Proposal) -> list[Path]:
    """The files the proposal would create that exist now (it never overwrites one)."""
    folder = Path(p.snapshot.path).parent
    return [folder / name for name, _ in p.files if (folder / name).exists()]


def write_files(p: Proposal) -> None:
    """The proposal's new files, for a client that cannot create them in its edit; never over
    an existing file."""
    folder = Path(p.snapshot.path).parent
    for name, text in p.files:
        with open(folder / name, "x", encoding="utf-8") as f:
            f.write(text)


def description(p: Proposal) -> str:
    edits = "; ".join(p.summaries) or "the winner of the search"
    return f"`{p.kernel}`: {edits}. {p.outcome}"


def text_edits(model: Model, edits: list[LineEdit]) -> Iterator[tuple[types.Range, str]]:
    """Whole-line edits as ranges in the client's units. The last line has no newline after it,
    so edits that reach the end of the text take the newline before them instead."""
    lines = model.lines
    n = len(lines)
    for e in edits:
        if e.end < n:
            yield model.range((e.start, 0), (e.end, 0)), "".join(x + "\n" for x in e.lines)
        elif e.start < n and e.lines:
            yield model.range((e.start, 0), (n - 1, len(lines[n - 1]))), "\n".join(e.lines)
        elif e.start < n:  # lines deleted up to the end
            start = (e.start - 1, len(lines[e.start - 1])) if e.start > 0 else (0, 0)
            yield model.range(start, (n - 1, len(lines[n - 1]))), ""
        else:  # lines added after the last
            end = (n - 1, len(lines[n - 1]))
            yield model.range(end, end), "".join("\n" + x for x in e.lines)


# ---- compare, report, hover -------------------------------------------------------------------


def compare(p: Proposal) -> dict[str, str]:
    """`{original, variant, title}`: the document and a copy of the variant, under the file's name
    in the job's folder (so that the diff highlights it alike)."""
    variant = p.folder / p.file_name
    variant.parent.mkdir(parents=True, exist_ok=True)
    variant.write_text(p.variant, encoding="utf-8")
    return {
        "original": p.snapshot.uri,
        "variant": variant.as_uri(),
        "title": f"{p.file_name} ↔ {p.label.removeprefix('OptiML: ')}",
    }


def hover_section(p: Proposal) -> str:
    if p.anchor == "comment":
        return _generated_section(p)
    rows = [f"**OptiML proposal**: {p.speedup:.2f}× faster, confirmed and judged"]
    if p.before_ms is not None and p.after_ms is not None:
        rows.append(f"- time: {p.before_ms:.4g} ms → {p.after_ms:.4g} ms")
    if p.before is not None and p.after is not None:
        rows.append(f"- bottleneck: {p.before.bottleneck} → {p.after.bottleneck}")
        if p.after.explanation:
            rows.append(f"- after: {p.after.explanation}")
    if p.summaries:
        rows.append("- edits: " + "; ".join(p.summaries))
    rows.append("- Accept, Reject, Compare or Report: the code lenses over the kernel")
    return "\n".join(rows)


def _generated_section(p: Proposal) -> str:
    rows = [f"**OptiML proposal**: `{p.kernel}`, generated from this comment"]
    refs = ", ".join(f"`{name}`" for name, _ in p.files)
    rows.append(
        f"- verdict: {p.outcome}"
        if p.outcome
        else "- verdict: compiled; not run against its reference"
    )
    if p.speedup is not None:
        rows.append(
            f"- optimized: {p.speedup:.2f}× faster than the plain kernel, confirmed and judged"
        )
    if p.before_ms is not None and p.after_ms is not None:
        rows.append(f"- time: {p.before_ms:.4g} ms (plain) → {p.after_ms:.4g} ms")
    if p.after is not None:
        rows.append(
            f"- profile: {p.after.bottleneck}"
            + (f" — {p.after.explanation}" if p.after.explanation else "")
        )
    if p.summaries:
        rows.append("- edits: " + "; ".join(p.summaries))
    if refs:
        rows.append(f"- its float64 NumPy reference: {refs}, created next to the file on Accept")
    rows += [f"- note: {n}" for n in p.notes]
    rows.append("- Accept, Reject, Compare or Report: the code lenses over the comment")
    return "\n".join(rows)
