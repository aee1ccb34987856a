/** The experimental client capabilities by which this extension tells the server what it does
 * itself. No runtime `vscode` import (the language client's types only). */

import type { ClientCapabilities, FeatureState, StaticFeature } from 'vscode-languageclient';

export interface OptimlExperimental {
  /** The client opens `optiml.compareProposal`'s result in a diff editor itself. */
  diff: boolean;
  /** The client opens `optiml.openReport`'s result in the browser itself. */
  openReport: boolean;
}

/** What this extension declares, under `capabilities.experimental.optiml`. */
export const OPTIML_EXPERIMENTAL: OptimlExperimental = { diff: true, openReport: true };

/** `experimental` with `optiml` merged in; other keys kept. */
export function withOptimlExperimental(
  experimental: unknown,
  declared: OptimlExperimental = OPTIML_EXPERIMENTAL,
): Record<string, unknown> {
  const base = isObject(experimental) ? experimental : {};
  const optiml = isObject(base.optiml) ? base.optiml : {};
  return { ...base, optiml: { ...optiml, ...declared } };
}

/** Adds the capabilities at `initialize`. */
export class OptimlCapabilitiesFeature implements StaticFeature {
  constructor(private readonly declared: OptimlExperimental = OPTIML_EXPERIMENTAL) {}

  fillClientCapabilities(capabilities: ClientCapabilities): void {
    capabilities.experimental = withOptimlExperimental(capabilities.experimental, this.declared);
  }

  initialize(): void {}

  getState(): FeatureState {
    return { kind: 'static' };
  }

  clear(): void {}
}

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}
