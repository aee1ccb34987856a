import { describe, expect, it } from 'vitest';

import { ServerCommand } from '../src/constants';
import { followUp } from '../src/followUp';

const both = { diff: true, openReport: true };
const neither = { diff: false, openReport: false };

describe('followUp', () => {
  const compared = {
    original: 'file:///w/saxpy.cu',
    variant: 'file:///tmp/optiml/p1/saxpy.cu',
    title: 'saxpy: original ↔ 2.3× faster',
  };

  it("opens compareProposal's documents in a diff", () => {
    expect(followUp(ServerCommand.compareProposal, compared, both)).toEqual({
      kind: 'diff',
      ...compared,
    });
  });

  it('gives the diff a title when the server gives none', () => {
    const action = followUp(
      ServerCommand.compareProposal,
      { original: compared.original, variant: compared.variant },
      both,
    );
    expect(action).toMatchObject({ kind: 'diff', title: expect.stringContaining('OptiML') });
  });

  it('opens the report outside the editor', () => {
    expect(followUp(ServerCommand.openReport, { report: 'file:///tmp/r.html' }, both)).toEqual({
      kind: 'openExternal',
      target: 'file:///tmp/r.html',
    });
  });

  it('leaves both to the server without the capability', () => {
    expect(followUp(ServerCommand.compareProposal, compared, neither)).toBeUndefined();
    expect(
      followUp(ServerCommand.openReport, { report: 'file:///r.html' }, neither),
    ).toBeUndefined();
  });

  it('does nothing for the other commands or an empty result', () => {
    expect(followUp(ServerCommand.optimize, compared, both)).toBeUndefined();
    expect(followUp(ServerCommand.acceptProposal, { report: 'file:///r' }, both)).toBeUndefined();
    expect(followUp(ServerCommand.compareProposal, null, both)).toBeUndefined();
    expect(followUp(ServerCommand.openReport, undefined, both)).toBeUndefined();
  });

  it('reports a result of the wrong shape', () => {
    for (const bad of [
      {},
      { original: 'file:///a' },
      { original: '/a', variant: '/b' },
      'x',
      [1],
    ]) {
      expect(followUp(ServerCommand.compareProposal, bad, both)?.kind).toBe('error');
    }
    for (const bad of [{}, { report: 3 }, { report: 'C:\\r.html' }]) {
      expect(followUp(ServerCommand.openReport, bad, both)?.kind).toBe('error');
    }
  });
});
