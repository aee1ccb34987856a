"""Code actions on the kernel under the cursor: "Add OptiML spec" for a kernel without one, an edit
that inserts the drafted spec above the kernel, versioned against the parsed document (drafted —
a draft is checked with nvcc — only once the user picks it, through codeAction/resolve, where the
client can); "Optimize
kernel" and "Profile kernel" for a kernel whose spec is valid, and "Generate kernel from comment"
in a comment with a formula (or prose, with an LLM configured): commands that start a job."""

from __future__ import annotations

import logging
from typing import Any

from lsprotocol import types
from pygls.exceptions import JsonRpcInvalidParams

from optiml.api import (
    KernelOutline,
    comment_start,
    draft_spec,
    formula_in_comment,
    prose_in_comment,
)
from server.capabilities import ClientCapabilities
from server.documents import Model
from server.jobs import GENERATE_COMMAND, OPTIMIZE_COMMAND, PROFILE_COMMAND
from server.protocol import shown

logger = logging.getLogger(__name__)

KIND = types.CodeActionKind.RefactorRewrite
JOB_KIND = types.CodeActionKind.Refactor  # starts a job; the edit comes later, as a proposal
KINDS = [KIND, JOB_KIND]
ADD_SPEC_COMMAND = "optiml.addSpec"  # for clients that take only Commands
_ANNOTATION = "optiml.draftedSpec"


def code_actions(
    model: Model,
    selection: types.Range,
    only: list[str] | None,
    caps: ClientCapabilities,
    llm: bool = False,
) -> list[types.CodeAction | types.Command]:
    """The actions at `selection`; `llm`: an LLM is configured, so that a comment in prose can
    become a kernel too."""
    start, end = model.point(selection.start), model.point(selection.end)
    out: list[types.CodeAction | types.Command] = []
    for k in model.kernels_at(start, end):
        if k.spec_range is None and _wanted(KIND, only):
            title = f"Add OptiML spec for `{k.name}`"
            args = [model.snapshot.uri, model.snapshot.version, k.name]
            if not caps.code_action_literals:
                out.append(types.Command(title=title, command=ADD_SPEC_COMMAND, arguments=args))
            elif caps.code_action_resolve:  # the draft (it compiles) once the user picks it
                out.append(types.CodeAction(title=title, kind=KIND, data=args))
            elif (edit := add_spec_edit(model, k, caps)) is not None:
                out.append(types.CodeAction(title=title, kind=KIND, edit=edit))
        if k.name in model.specs and _wanted(JOB_KIND, only):
            target = {
                "uri": model.snapshot.uri,
                "version": model.snapshot.version,
                "kernel": k.name,
            }
            for title, command in (
                (f"Optimize kernel `{k.name}`", OPTIMIZE_COMMAND),
                (f"Profile kernel `{k.name}`", PROFILE_COMMAND),
            ):
                cmd = types.Command(title=title, command=command, arguments=[target])
                if caps.code_action_literals:
                    out.append(types.CodeAction(title=title, kind=JOB_KIND, command=cmd))
                else:
                    out.append(cmd)
    line = selection.start.line
    text, path = model.snapshot.text, model.snapshot.path
    if (
        _wanted(JOB_KIND, only)
        and comment_start(model.lines, line) is not None
        and (
            formula_in_comment(text, path, line) is not None
            or (llm and prose_in_comment(text, line) is not None)
        )
    ):
        title = "Generate kernel from comment"
        target = {"uri": model.snapshot.uri, "version": model.snapshot.version, "line": line}
        cmd = types.Command(title=title, command=GENERATE_COMMAND, arguments=[target])
        out.append(
            types.CodeAction(title=title, kind=JOB_KIND, command=cmd)
            if caps.code_action_literals
            else cmd
        )
    return out


def needs_draft(model: Model, selection: types.Range, only: list[str] | None, caps) -> bool:
    """Whether `code_actions` would draft a spec now (a client without codeAction/resolve, a
    kernel without a spec under the selection): the draft compiles, so the server runs it off
    its event loop."""
    if caps.code_action_resolve or not caps.code_action_literals or not _wanted(KIND, only):
        return False
    start, end = model.point(selection.start), model.point(selection.end)
    return any(k.spec_range is None for k in model.kernels_at(start, end))


def spec_arg(args: tuple[Any, ...]) -> tuple[str, int, str]:
    """`optiml.addSpec`'s `[uri, version, kernel]` (what its Command carries); a clear
    InvalidParams otherwise."""
    if len(args) == 3:
        uri, version, kernel = args
        if (
            isinstance(uri, str)
            and isinstance(version, int)
            and not isinstance(version, bool)
            and isinstance(kernel, str)
        ):
            return uri, version, kernel
    raise JsonRpcInvalidParams(
        f"{ADD_SPEC_COMMAND} takes [uri, version, kernel], got {shown(args)}"
    )


def _wanted(kind: str, only: list[str] | None) -> bool:
    return not only or any(kind == o or kind.startswith(f"{o}.") for o in only)


def add_spec_edit(
    model: Model, kernel: KernelOutline, caps: ClientCapabilities
) -> types.WorkspaceEdit | None:
    """The drafted spec inserted above the kernel's first line (its `template <...>` line, if any),
    indented like it; None if the draft fails."""
    try:
        draft = draft_spec(model.snapshot.text, model.snapshot.path, kernel.name)
    except Exception:  # a bug in drafting: offer nothing rather than a broken spec
        logger.exception("drafting a spec for %s", kernel.name)
        return None
    line = kernel.range.start[0]
    text = model.lines[line]
    indent = text[: len(text) - len(text.lstrip())]
    new_text = "".join(indent + row + "\n" for row in draft.splitlines())
    at = types.Range(types.Position(line, 0), types.Position(line, 0))
    uri, version = model.snapshot.uri, model.snapshot.version
    if not caps.document_changes:
        return types.WorkspaceEdit(changes={uri: [types.TextEdit(range=at, new_text=new_text)]})
    edit: types.TextEdit | types.AnnotatedTextEdit = types.TextEdit(range=at, new_text=new_text)
    annotations = None
    if caps.change_annotations:
        edit = types.AnnotatedTextEdit(range=at, new_text=new_text, annotation_id=_ANNOTATION)
        annotations = {
            _ANNOTATION: types.ChangeAnnotation(
                label=f"OptiML spec for {kernel.name}",
                description="drafted from the kernel's body and launch site: check sizes and values",
                needs_confirmation=False,
            )
        }
    document = types.OptionalVersionedTextDocumentIdentifier(uri=uri, version=version)
    return types.WorkspaceEdit(
        document_changes=[types.TextDocumentEdit(text_document=document, edits=[edit])],
        change_annotations=annotations,
    )
