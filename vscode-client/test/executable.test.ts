import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { afterAll, describe, expect, it } from 'vitest';

import {
  type ResolveContext,
  expandCommand,
  isExecutableFile,
  notFoundMessage,
  resolveExecutable,
} from '../src/executable';

function context(files: string[], extra: Partial<ResolveContext> = {}): ResolveContext {
  const present = new Set(files);
  return {
    env: { PATH: '/usr/bin:/opt/venv/bin' },
    platform: 'linux',
    home: '/home/u',
    workspaceFolder: '/w',
    isExecutable: (file) => present.has(file),
    ...extra,
  };
}

describe('resolveExecutable', () => {
  it('finds a bare name on PATH, first match first', () => {
    expect(resolveExecutable('optiml', context(['/opt/venv/bin/optiml']))).toBe(
      '/opt/venv/bin/optiml',
    );
    expect(resolveExecutable('optiml', context(['/usr/bin/optiml', '/opt/venv/bin/optiml']))).toBe(
      '/usr/bin/optiml',
    );
    expect(resolveExecutable('optiml', context([]))).toBeUndefined();
    expect(resolveExecutable('optiml', context(['/x/optiml'], { env: {} }))).toBeUndefined();
  });

  it('takes a path as it is, relative ones from the workspace folder', () => {
    expect(resolveExecutable('/opt/o/optiml', context(['/opt/o/optiml']))).toBe('/opt/o/optiml');
    expect(resolveExecutable('.venv/bin/optiml', context(['/w/.venv/bin/optiml']))).toBe(
      '/w/.venv/bin/optiml',
    );
    expect(
      resolveExecutable(
        '.venv/bin/optiml',
        context(['/w/.venv/bin/optiml'], { workspaceFolder: undefined }),
      ),
    ).toBeUndefined();
    expect(resolveExecutable('/opt/o/optiml', context(['/usr/bin/optiml']))).toBeUndefined();
  });

  it('expands ~, ${userHome} and ${workspaceFolder}', () => {
    const ctx = context(['/home/u/venv/bin/optiml', '/w/.venv/bin/optiml']);
    expect(resolveExecutable('~/venv/bin/optiml', ctx)).toBe('/home/u/venv/bin/optiml');
    expect(resolveExecutable('${userHome}/venv/bin/optiml', ctx)).toBe('/home/u/venv/bin/optiml');
    expect(resolveExecutable('${workspaceFolder}/.venv/bin/optiml', ctx)).toBe(
      '/w/.venv/bin/optiml',
    );
    expect(
      resolveExecutable('${workspaceFolder}/.venv/bin/optiml', {
        ...ctx,
        workspaceFolder: undefined,
      }),
    ).toBeUndefined();
    expect(expandCommand(' ~ ', ctx)).toBe('/home/u');
  });

  it('tries PATHEXT on Windows', () => {
    const ctx = context(['C:\\venv\\Scripts\\optiml.exe'], {
      platform: 'win32',
      env: { Path: 'C:\\Windows;C:\\venv\\Scripts', PATHEXT: '.COM;.EXE' },
      workspaceFolder: 'C:\\w',
    });
    expect(resolveExecutable('optiml', ctx)).toBe('C:\\venv\\Scripts\\optiml.exe');
    expect(resolveExecutable('C:\\venv\\Scripts\\optiml', ctx)).toBe(
      'C:\\venv\\Scripts\\optiml.exe',
    );
  });
});

describe('isExecutableFile', () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'optiml-exe-'));
  afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));

  it('accepts an executable file only', () => {
    const exe = path.join(dir, 'optiml');
    const plain = path.join(dir, 'plain');
    fs.writeFileSync(exe, '#!/bin/sh\n', { mode: 0o755 });
    fs.writeFileSync(plain, '', { mode: 0o644 });
    expect(isExecutableFile(exe)).toBe(true);
    expect(isExecutableFile(dir)).toBe(false);
    expect(isExecutableFile(path.join(dir, 'missing'))).toBe(false);
    if (process.platform !== 'win32' && process.getuid?.() !== 0) {
      expect(isExecutableFile(plain)).toBe(false);
    }
  });
});

describe('notFoundMessage', () => {
  it('names the command and the setting', () => {
    const bare = notFoundMessage('optiml');
    expect(bare).toContain('`optiml`');
    expect(bare).toContain('on PATH');
    expect(bare).toContain('optiml.server.path');
    expect(notFoundMessage('/x/optiml')).toContain('at that path');
  });
});
