/** What the extension does with a server command's result, by the capabilities it declared.
 * Decided here, done by `extension.ts`. No `vscode` import. */

import type { OptimlExperimental } from './capabilities';
import { ServerCommand } from './constants';

export type FollowUp =
  | { kind: 'diff'; original: string; variant: string; title: string }
  | { kind: 'openExternal'; target: string }
  | { kind: 'error'; message: string };

/** `{original, variant, title}` from `optiml.compareProposal` → a diff editor;
 * `{report}` from `optiml.openReport` → the browser; each only where its capability was declared
 * (else the server shows the document itself). A result of another shape is an error to show;
 * an empty result (the server showed an error itself) is nothing to do. */
export function followUp(
  command: string,
  result: unknown,
  declared: OptimlExperimental,
): FollowUp | undefined {
  if (result === undefined || result === null) {
    return undefined;
  }
  if (command === ServerCommand.compareProposal && declared.diff) {
    const r = asObject(result);
    const original = r?.original;
    const variant = r?.variant;
    if (!isUri(original) || !isUri(variant)) {
      return {
        kind: 'error',
        message: `OptiML: the server's comparison has no documents to compare`,
      };
    }
    const title =
      typeof r?.title === 'string' && r.title.trim() !== ''
        ? r.title
        : 'OptiML: original ↔ proposal';
    return { kind: 'diff', original, variant, title };
  }
  if (command === ServerCommand.openReport && declared.openReport) {
    const report = asObject(result)?.report;
    if (!isUri(report)) {
      return { kind: 'error', message: `OptiML: the server's answer names no report to open` };
    }
    return { kind: 'openExternal', target: report };
  }
  return undefined;
}

function asObject(value: unknown): Record<string, unknown> | undefined {
  return typeof value === 'object' && value !== null && !Array.isArray(value)
    ? (value as Record<string, unknown>)
    : undefined;
}

/** A URI with a scheme (`file:///…`, `untitled:…`), not a bare path. */
function isUri(value: unknown): value is string {
  return typeof value === 'string' && /^[a-zA-Z][a-zA-Z0-9+.-]+:/.test(value);
}
