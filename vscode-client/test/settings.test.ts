import { describe, expect, it } from 'vitest';

import pkg from '../package.json';
import {
  RESTART_SECTIONS,
  SERVER_SETTING_DEFAULTS,
  SERVER_SETTING_KEYS,
  answerConfiguration,
  serverLaunch,
  serverSettings,
} from '../src/settings';

const properties = pkg.contributes.configuration.properties as Record<
  string,
  { default?: unknown }
>;

function lookup(values: Record<string, unknown>) {
  return (key: string) => values[key];
}

describe('serverSettings', () => {
  it('sends every server key, an unset one as null', () => {
    const out = serverSettings(lookup({ arch: 'sm_80', evaluations: 64 }));
    expect(Object.keys(out).sort()).toEqual([...SERVER_SETTING_KEYS].sort());
    expect(out.arch).toBe('sm_80');
    expect(out.evaluations).toBe(64);
    expect(out.model).toBeNull();
    expect(out.budget).toBeNull();
  });

  it('trims strings and takes an empty one as unset', () => {
    const out = serverSettings(lookup({ model: '  gpt-4.1 ', baseUrl: '   ', gpus: '' }));
    expect(out.model).toBe('gpt-4.1');
    expect(out.baseUrl).toBeNull();
    expect(out.gpus).toBe('all');
  });

  it('gives an unset key its default, never null where there is one', () => {
    const out = serverSettings(lookup({ executor: null, policy: undefined, evaluations: null }));
    expect(out).toMatchObject({ executor: 'local', policy: 'offline', evaluations: 48 });
  });

  it("keeps the defaults equal to package.json's", () => {
    for (const key of SERVER_SETTING_KEYS) {
      expect(SERVER_SETTING_DEFAULTS[key], key).toEqual(properties[`optiml.${key}`].default);
    }
  });

  it('keeps numbers and booleans as they are', () => {
    const out = serverSettings(lookup({ budget: 0.5, evaluations: 0 }));
    expect(out.budget).toBe(0.5);
    expect(out.evaluations).toBe(0);
  });

  it('never carries server.* or trace.*', () => {
    const out = serverSettings(
      lookup({ 'server.path': '/x', 'trace.server': 'verbose', server: { path: '/x' } }),
    ) as Record<string, unknown>;
    expect(out.server).toBeUndefined();
    expect(out.trace).toBeUndefined();
  });

  it('with the manifest defaults, sends the manifest defaults', () => {
    const defaults = Object.fromEntries(
      Object.entries(properties).map(([k, v]) => [k.replace(/^optiml\./, ''), v.default]),
    );
    const out = serverSettings(lookup(defaults));
    expect(out).toEqual({
      arch: null,
      provider: null,
      model: null,
      baseUrl: null,
      budget: null,
      evaluations: 48,
      seconds: 90,
      policy: 'offline',
      executor: 'local',
      gpus: 'all',
      include: [],
      define: [],
      std: null,
      nvccFlags: [],
      compileCommands: 'auto',
    });
  });
});

describe('the manifest', () => {
  it('contributes exactly the server keys, plus server.* and trace.*', () => {
    const contributed = Object.keys(properties).map((k) => k.replace(/^optiml\./, ''));
    const own = contributed.filter((k) => k.startsWith('server.') || k.startsWith('trace.'));
    expect(own.sort()).toEqual(['server.args', 'server.path', 'trace.server']);
    expect(contributed.filter((k) => !own.includes(k)).sort()).toEqual(
      [...SERVER_SETTING_KEYS].sort(),
    );
  });

  it('describes every setting', () => {
    for (const [key, schema] of Object.entries(properties)) {
      const s = schema as { description?: string; markdownDescription?: string; type?: unknown };
      expect(s.description ?? s.markdownDescription, key).toBeTruthy();
      expect(s.type, key).toBeTruthy();
      expect('default' in s, key).toBe(true);
    }
  });

  it('restarts on the settings of the server command line', () => {
    expect([...RESTART_SECTIONS].sort()).toEqual(['optiml.server.args', 'optiml.server.path']);
    for (const section of RESTART_SECTIONS) {
      expect(properties[section]).toBeDefined();
    }
  });
});

describe('serverLaunch', () => {
  it('defaults to `optiml serve`', () => {
    expect(serverLaunch(lookup({}))).toEqual({ command: 'optiml', args: ['serve'] });
    expect(serverLaunch(lookup({ 'server.path': '  ' }))).toEqual({
      command: 'optiml',
      args: ['serve'],
    });
  });

  it('puts the extra arguments after serve and drops non-strings', () => {
    const launch = serverLaunch(
      lookup({
        'server.path': ' /opt/optiml/bin/optiml ',
        'server.args': ['--tcp', 3, '', '2087'],
      }),
    );
    expect(launch).toEqual({ command: '/opt/optiml/bin/optiml', args: ['serve', '--tcp', '2087'] });
  });
});

describe('answerConfiguration', () => {
  it('answers the optiml section with the server settings and leaves the rest', () => {
    const scopes: (string | undefined)[] = [];
    const answer = answerConfiguration(
      [{ section: 'optiml' }, { section: 'editor' }, { section: 'optiml', scopeUri: 'file:///w' }],
      [{ arch: 'sm_80', server: { path: 'x' }, trace: { server: 'off' } }, { tabSize: 4 }, {}],
      (scope) => {
        scopes.push(scope);
        return serverSettings(lookup({ arch: 'sm_80' }));
      },
    );
    expect(scopes).toEqual([undefined, 'file:///w']);
    expect(answer[1]).toEqual({ tabSize: 4 });
    expect(answer[0]).toMatchObject({ arch: 'sm_80', model: null });
    expect(answer[0]).not.toHaveProperty('server');
    expect(answer[0]).not.toHaveProperty('trace');
  });

  it('answers null where VS Code gave nothing', () => {
    expect(
      answerConfiguration([{ section: 'other' }], [], () => serverSettings(lookup({}))),
    ).toEqual([null]);
  });
});
