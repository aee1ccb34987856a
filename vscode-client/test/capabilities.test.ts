import type { ClientCapabilities } from 'vscode-languageclient';
import { describe, expect, it } from 'vitest';

import {
  OPTIML_EXPERIMENTAL,
  OptimlCapabilitiesFeature,
  withOptimlExperimental,
} from '../src/capabilities';

describe('experimental.optiml', () => {
  it('declares the diff and the report', () => {
    expect(OPTIML_EXPERIMENTAL).toEqual({ diff: true, openReport: true });
  });

  it('merges into what is there', () => {
    expect(withOptimlExperimental(undefined)).toEqual({ optiml: { diff: true, openReport: true } });
    expect(withOptimlExperimental({ other: 1, optiml: { more: 2 } })).toEqual({
      other: 1,
      optiml: { more: 2, diff: true, openReport: true },
    });
    expect(withOptimlExperimental([1])).toEqual({ optiml: { diff: true, openReport: true } });
  });

  it('is filled in by the static feature', () => {
    const feature = new OptimlCapabilitiesFeature();
    const capabilities: ClientCapabilities = { workspace: {} };
    feature.fillClientCapabilities(capabilities);
    expect(capabilities.experimental).toEqual({ optiml: { diff: true, openReport: true } });
    expect(capabilities.workspace).toEqual({});
    expect(feature.getState()).toEqual({ kind: 'static' });
    feature.initialize();
    feature.clear();
  });

  it('declares only what it is given', () => {
    const feature = new OptimlCapabilitiesFeature({ diff: false, openReport: true });
    const capabilities: ClientCapabilities = {};
    feature.fillClientCapabilities(capabilities);
    expect(capabilities.experimental).toEqual({ optiml: { diff: false, openReport: true } });
  });
});
