import { describe, expect, it } from 'vitest';

import { statusView } from '../src/status';

describe('statusView', () => {
  it('shows each state', () => {
    expect(statusView({ kind: 'starting' })).toMatchObject({ visible: true, error: false });
    expect(statusView({ kind: 'running', version: '0.1.0' }).text).toBe('$(check) OptiML 0.1.0');
    expect(statusView({ kind: 'running' }).text).toBe('$(check) OptiML');
    const failed = statusView({ kind: 'failed', reason: '`optiml` was not found' });
    expect(failed).toMatchObject({ error: true, visible: true });
    expect(failed.tooltip).toContain('`optiml` was not found');
    expect(statusView({ kind: 'stopped' }).visible).toBe(false);
  });

  it('counts running jobs', () => {
    expect(statusView({ kind: 'running', version: '1' }, ['Optimize k']).text).toBe(
      '$(check) OptiML 1 · 1 job',
    );
    const two = statusView({ kind: 'running' }, ['A', 'B']);
    expect(two.text).toBe('$(check) OptiML · 2 jobs');
    expect(two.tooltip).toContain('A; B');
  });
});
