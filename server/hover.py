"""Hover on a kernel's name: its static report from the newest finished compile (registers, spills,
stack, shared memory, occupancy and what limits it, notes), its spec from the newest parse, its
profile from the newest profile job (while the kernel is as profiled) and its proposal, if an
optimize job left one (before → after). Hover on a comment a kernel was generated from: that
proposal (its verdict, speedup over the plain kernel, profile)."""

from __future__ import annotations

from lsprotocol import types

from optiml.api import KernelOutline, Spec, StaticReport
from server.checks import CheckOutcome
from server.documents import Model
from server.jobs import Profiles
from server.proposals import Proposals, anchor, hover_section


def hover(
    model: Model,
    check: CheckOutcome | None,
    position: types.Position,
    markdown: bool,
    profiles: Profiles | None = None,
    proposals: Proposals | None = None,
) -> types.Hover | None:
    point = model.point(position)
    kernel = next(
        (
            k
            for k in model.kernels_at(point, point)
            if k.name_range.start <= point <= k.name_range.end
        ),
        None,
    )
    if kernel is None:
        return _generated(model, point, markdown, proposals)
    sections = [f"**`{kernel.name}`**", _feedback(kernel, check)]
    spec = model.specs.get(kernel.name)
    if spec is not None:
        sections.append(_spec(spec))
    elif kernel.spec_range is None:
        sections.append("No `@optiml` spec: the code action *Add OptiML spec* drafts one.")
    else:
        sections.append("The spec has errors: see the diagnostics.")
    found = profiles.get(model, kernel) if profiles is not None else None
    if found is not None:
        sections.append(
            f"Profile (Nsight Compute, document version {found.version}):\n\n"
            + found.profile.markdown()
        )
    for p in proposals.of(model.snapshot.uri, kernel.name) if proposals is not None else []:
        sections.append(hover_section(p))
    text = "\n\n".join(sections)
    if not markdown:
        text = text.replace("**", "").replace("`", "")
    kind = types.MarkupKind.Markdown if markdown else types.MarkupKind.PlainText
    return types.Hover(
        contents=types.MarkupContent(kind=kind, value=text),
        range=model.range(kernel.name_range.start, kernel.name_range.end),
    )


def _generated(
    model: Model, point: tuple[int, int], markdown: bool, proposals: Proposals | None
) -> types.Hover | None:
    """On a comment that a kernel was generated from, while its proposal waits: the proposal."""
    for p in proposals.of(model.snapshot.uri) if proposals is not None else []:
        block = anchor(p, model) if p.anchor == "comment" else None
        if block is not None and block.first <= point[0] <= block.last:
            text = hover_section(p)
            if not markdown:
                text = text.replace("**", "").replace("`", "")
            kind = types.MarkupKind.Markdown if markdown else types.MarkupKind.PlainText
            return types.Hover(
                contents=types.MarkupContent(kind=kind, value=text),
                range=model.range((block.first, 0), model.line_end(block.last)),
            )
    return None


def _feedback(kernel: KernelOutline, check: CheckOutcome | None) -> str:
    if check is None:
        return "Not compiled yet: OptiML compiles the file when it is opened and saved."
    if check.error is not None:
        return f"Not compiled: {check.error}"
    feedback = check.kernels.get(kernel.name)
    if feedback is None:
        return "Not in the last compile: save the file to compile it."
    if feedback.skipped is not None:
        return f"Not compiled: {feedback.skipped}."
    if feedback.report is None:
        return "The last compile failed: see the diagnostics."
    return _report(feedback.report, check.snapshot.version)


def _report(report: StaticReport, version: int) -> str:
    r = report.resources
    dynamic = f" + {report.dynamic_smem} B dynamic" if report.dynamic_smem else ""
    rows = [
        ("registers", f"{r.registers} per thread"),
        ("spills", f"{r.spill_store_bytes} B stored, {r.spill_load_bytes} B loaded"),
        ("stack", f"{r.stack_bytes} B"),
        ("shared memory", f"{r.static_smem_bytes} B static{dynamic}"),
    ]
    occ = report.occupancy
    if occ is None:
        rows.append(("occupancy", "needs a spec with a launch"))
    else:
        rows.append(
            (
                "occupancy",
                f"{occ.occupancy:.0%}: {occ.blocks_per_sm} blocks of {occ.threads_per_block} "
                f"threads per SM, limited by {occ.limiter.replace('_', ' ')}",
            )
        )
    table = "\n".join(
        ["| | |", "| --- | --- |"] + [f"| {name} | {value} |" for name, value in rows]
    )
    notes = "".join(f"\n- {n}" for n in report.notes)
    return f"ptxas, {report.arch}, document version {version}:\n\n{table}{notes}"


def _spec(spec: Spec) -> str:
    if len(spec.size_vars) == 1:
        sizes = f"{spec.size_vars[0]} = " + ", ".join(str(s[spec.size_vars[0]]) for s in spec.sizes)
    else:
        names = ", ".join(spec.size_vars)
        values = ", ".join(
            "(" + ", ".join(str(s[v]) for v in spec.size_vars) + ")" for s in spec.sizes
        )
        sizes = f"{names} = {values}"
    launch = spec.launch
    smem = f", smem = {launch.smem}" if launch.smem != "0" else ""
    lines = [
        f"- sizes: `{sizes}`",
        f"- launch: `grid = {_dims(launch.grid)}, block = {_dims(launch.block)}{smem}`",
    ]
    if spec.template:
        lines.append(
            "- template: `" + ", ".join(f"{k} = {v}" for k, v in spec.template.items()) + "`"
        )
    return "Spec:\n\n" + "\n".join(lines)


def _dims(dims: list[str]) -> str:
    return dims[0] if len(dims) == 1 else "(" + ", ".join(dims) + ")"
