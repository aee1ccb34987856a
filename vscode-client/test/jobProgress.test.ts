import { describe, expect, it, vi } from 'vitest';

import { JobProgress, type ProgressView } from '../src/jobProgress';

function setUp() {
  const shown: { title: string; cancel: () => void; reports: unknown[]; done: boolean }[] = [];
  const cancelled: (string | number)[] = [];
  const changed = vi.fn();
  const jobs = new JobProgress(
    (title, onCancel): ProgressView => {
      const entry = { title, cancel: onCancel, reports: [] as unknown[], done: false };
      shown.push(entry);
      return {
        report: (message, increment) => entry.reports.push({ message, increment }),
        done: () => {
          entry.done = true;
        },
      };
    },
    (token) => cancelled.push(token),
    changed,
  );
  return { jobs, shown, cancelled, changed };
}

describe('JobProgress', () => {
  it("leaves progress that cannot be cancelled to the client's status bar", () => {
    const { jobs, shown } = setUp();
    const next = vi.fn();
    jobs.handle('c1', { kind: 'begin', title: 'OptiML: compiling a.cu' }, next);
    jobs.handle('c1', { kind: 'end' }, next);
    expect(next).toHaveBeenCalledTimes(2);
    expect(shown).toEqual([]);
  });

  it('shows a cancellable job as its own progress, and cancels by its token', () => {
    const { jobs, shown, cancelled, changed } = setUp();
    const next = vi.fn();
    jobs.handle(
      'j1',
      { kind: 'begin', title: 'Optimize saxpy', cancellable: true, percentage: 0 },
      next,
    );
    expect(next).not.toHaveBeenCalled(); // the client must not show it in the status bar too
    expect(shown.map((s) => s.title)).toEqual(['Optimize saxpy']);
    expect(jobs.running).toEqual(['Optimize saxpy']);
    expect(changed).toHaveBeenCalledTimes(1);

    shown[0].cancel();
    expect(cancelled).toEqual(['j1']);

    jobs.handle('j1', { kind: 'report', message: '10/64 evaluations', percentage: 15 }, next);
    jobs.handle('j1', { kind: 'report', percentage: 40 }, next);
    jobs.handle('j1', { kind: 'report', percentage: 30 }, next); // never backwards
    expect(shown[0].reports).toEqual([
      { message: '10/64 evaluations', increment: 15 },
      { message: undefined, increment: 25 },
    ]);
    jobs.handle('j1', { kind: 'end', message: 'done' }, next);
    expect(shown[0].done).toBe(true);
    expect(jobs.running).toEqual([]);
    expect(next).toHaveBeenCalledTimes(4); // the client still forgets the token at the end
    expect(changed).toHaveBeenCalledTimes(2);
  });

  it('reports messages of a progress without percentages', () => {
    const { jobs, shown } = setUp();
    jobs.handle(
      7,
      { kind: 'begin', title: 'Profile k', cancellable: true, message: 'queued' },
      () => {},
    );
    jobs.handle(7, { kind: 'report', message: 'running ncu' }, () => {});
    expect(shown[0].reports).toEqual([
      { message: 'queued', increment: undefined },
      { message: 'running ncu', increment: undefined },
    ]);
  });

  it('ends every job when the server stops', () => {
    const { jobs, shown } = setUp();
    jobs.handle('a', { kind: 'begin', title: 'A', cancellable: true }, () => {});
    jobs.handle('b', { kind: 'begin', title: 'B', cancellable: true }, () => {});
    jobs.clear();
    expect(shown.every((s) => s.done)).toBe(true);
    expect(jobs.running).toEqual([]);
  });
});
