"""What the client can do, resolved once at `initialize` into plain booleans, so that no handler
walks lsprotocol's capability tree."""

from __future__ import annotations

from dataclasses import dataclass

from lsprotocol import types
from pygls.capabilities import get_capability


@dataclass(frozen=True)
class ClientCapabilities:
    inlay_hints: bool  # else static feedback goes out as Hint diagnostics
    inlay_hint_refresh: bool  # the server may ask for hints again when a compile finishes
    work_done_progress: bool  # compiles show as progress
    code_action_literals: bool  # else code actions are Commands the server applies itself
    document_changes: bool  # versioned edits
    change_annotations: bool
    hover_markdown: bool
    configuration: bool  # `workspace/configuration` can be asked
    code_lens_refresh: bool  # the server may ask for code lenses again when a proposal comes
    show_document: bool  # `window/showDocument`
    code_action_resolve: bool = False  # a code action's edit may come later (codeAction/resolve)
    creates_files: bool = False  # a versioned workspace edit may create a file
    # `experimental.optiml`, declared by the VS Code extension: it opens what
    # `optiml.compareProposal` and `optiml.openReport` answer itself
    opens_diff: bool = False
    opens_report: bool = False


def resolve(caps: types.ClientCapabilities) -> ClientCapabilities:
    hover_formats = get_capability(caps, "text_document.hover.content_format", None) or []
    return ClientCapabilities(
        inlay_hints=get_capability(caps, "text_document.inlay_hint", None) is not None,
        inlay_hint_refresh=bool(
            get_capability(caps, "workspace.inlay_hint.refresh_support", False)
        ),
        work_done_progress=bool(get_capability(caps, "window.work_done_progress", False)),
        code_action_literals=get_capability(
            caps, "text_document.code_action.code_action_literal_support", None
        )
        is not None,
        code_action_resolve="edit"
        in (
            get_capability(caps, "text_document.code_action.resolve_support.properties", None) or []
        ),
        document_changes=bool(
            get_capability(caps, "workspace.workspace_edit.document_changes", False)
        ),
        change_annotations=get_capability(
            caps, "workspace.workspace_edit.change_annotation_support", None
        )
        is not None,
        hover_markdown=types.MarkupKind.Markdown in hover_formats,
        configuration=bool(get_capability(caps, "workspace.configuration", False)),
        code_lens_refresh=bool(get_capability(caps, "workspace.code_lens.refresh_support", False)),
        show_document=bool(get_capability(caps, "window.show_document.support", False)),
        creates_files=bool(get_capability(caps, "workspace.workspace_edit.document_changes", False))
        and types.ResourceOperationKind.Create
        in (get_capability(caps, "workspace.workspace_edit.resource_operations", None) or []),
        opens_diff=_experimental(caps, "diff"),
        opens_report=_experimental(caps, "openReport"),
    )


def _experimental(caps: types.ClientCapabilities, key: str) -> bool:
    experimental = caps.experimental
    optiml = experimental.get("optiml") if isinstance(experimental, dict) else None
    return isinstance(optiml, dict) and optiml.get(key) is True
