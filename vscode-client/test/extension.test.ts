/** The wiring in extension.ts, with `vscode` (test/vscode.ts) and the language client mocked. */

import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { afterAll, afterEach, beforeEach, describe, expect, it, vi } from 'vitest';

import * as vscode from './vscode';

const lsp = vi.hoisted(() => {
  const State = { Stopped: 1, Starting: 3, Running: 2 } as const;

  class FakeClient {
    static instances: FakeClient[] = [];
    static failStart = false;
    static commands: string[] = ['optiml.addSpec', 'optiml.cancelJob', 'optiml.compareProposal'];
    state: number = State.Stopped;
    features: { fillClientCapabilities(c: Record<string, unknown>): void }[] = [];
    private listeners: ((e: { oldState: number; newState: number }) => void)[] = [];
    sendRequest = vi.fn(async (..._args: unknown[]): Promise<unknown> => null);
    sendNotification = vi.fn(async (..._args: unknown[]) => {});
    disposed = false;
    initializeResult:
      | { serverInfo?: { name: string; version?: string }; capabilities: Record<string, unknown> }
      | undefined;

    constructor(
      readonly id: string,
      readonly name: string,
      readonly serverOptions: {
        command: string;
        args: string[];
        options: { env: Record<string, string> };
      },
      readonly clientOptions: Record<string, any>,
    ) {
      FakeClient.instances.push(this);
    }
    registerFeature(feature: FakeClient['features'][number]) {
      this.features.push(feature);
    }
    onDidChangeState(listener: (e: { oldState: number; newState: number }) => void) {
      this.listeners.push(listener);
      return { dispose() {} };
    }
    setState(newState: number) {
      const oldState = this.state;
      this.state = newState;
      for (const l of this.listeners) l({ oldState, newState });
    }
    async start() {
      this.setState(State.Starting);
      if (FakeClient.failStart) {
        this.setState(State.Stopped);
        throw new Error('spawn failed');
      }
      this.initializeResult = {
        serverInfo: { name: 'optiml', version: '0.1.0' },
        capabilities: { executeCommandProvider: { commands: FakeClient.commands } },
      };
      this.setState(State.Running);
    }
    async dispose() {
      this.disposed = true;
      this.setState(State.Stopped);
    }
    isRunning() {
      return this.state === State.Running;
    }
    /** The capabilities the client would send in `initialize`. */
    capabilities() {
      const caps: Record<string, unknown> = {};
      for (const f of this.features) f.fillClientCapabilities(caps);
      return caps;
    }
  }
  return { State, FakeClient };
});

vi.mock('vscode-languageclient/node', () => ({
  LanguageClient: lsp.FakeClient,
  State: lsp.State,
  RevealOutputChannelOn: { Info: 1, Warn: 2, Error: 3, Never: 4 },
  ExecuteCommandRequest: { type: { method: 'workspace/executeCommand' } },
  WorkDoneProgressCancelNotification: { type: { method: 'window/workDoneProgress/cancel' } },
}));

import { activate, deactivate } from '../src/extension';

type Controller = ReturnType<typeof activate>;

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'optiml-ext-'));
const server = path.join(dir, 'optiml');
fs.writeFileSync(server, '#!/bin/sh\n', { mode: 0o755 });
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));

function fakeContext() {
  const secrets = new Map<string, string>();
  return {
    subscriptions: [] as { dispose(): void }[],
    secrets: {
      get: vi.fn(async (key: string) => secrets.get(key)),
      store: vi.fn(async (key: string, value: string) => void secrets.set(key, value)),
      delete: vi.fn(async (key: string) => void secrets.delete(key)),
      onDidChange: vi.fn(),
    },
    stored: secrets,
  };
}

let context: ReturnType<typeof fakeContext>;
let controller: Controller;

async function start(settings: Record<string, unknown> = {}): Promise<Controller> {
  vscode.state.settings = { 'optiml.server.path': server, ...settings };
  controller = activate(context as any);
  await controller.settled(); // the start that activate queued
  return controller;
}

function client(index = -1) {
  const all = lsp.FakeClient.instances;
  return all[index < 0 ? all.length + index : index];
}

function status() {
  return vscode.state.statusItems[0];
}

beforeEach(() => {
  vscode.resetVscode();
  lsp.FakeClient.instances = [];
  lsp.FakeClient.failStart = false;
  context = fakeContext();
});

afterEach(async () => {
  await deactivate();
  for (const d of context.subscriptions) d.dispose();
});

describe('starting the server', () => {
  it('runs `optiml serve` for CUDA documents with the settings as initializationOptions', async () => {
    await start({
      'optiml.arch': 'sm_80',
      'optiml.server.args': ['--tcp', '2087'],
      'optiml.evaluations': 48,
    });
    expect(lsp.FakeClient.instances).toHaveLength(1);
    const c = client(0);
    expect(c.id).toBe('optiml');
    expect(c.serverOptions.command).toBe(server);
    expect(c.serverOptions.args).toEqual(['serve', '--tcp', '2087']);
    expect(c.serverOptions.options.env.PATH).toBe(process.env.PATH);
    expect(c.clientOptions.initializationOptions).toEqual({
      arch: 'sm_80',
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
    expect(c.clientOptions.synchronize).toEqual({ configurationSection: 'optiml' });
    expect(c.clientOptions.documentSelector).toContainEqual({
      scheme: 'file',
      language: 'cuda-cpp',
    });
    expect(c.capabilities()).toEqual({
      experimental: { optiml: { diff: true, openReport: true } },
    });
  });

  it("shows the server's version in the status bar", async () => {
    await start();
    expect(status().visible).toBe(true);
    expect(status().text).toBe('$(check) OptiML 0.1.0');
    expect(status().command).toBe('optiml.showServerLog');
  });

  it('says once, with a button to the setting, that optiml is missing', async () => {
    vscode.window.showErrorMessage.mockResolvedValueOnce('Open Settings');
    vscode.state.settings = { 'optiml.server.path': path.join(dir, 'nowhere', 'optiml') };
    controller = activate(context as any);
    await controller.settled();
    expect(lsp.FakeClient.instances).toEqual([]);
    expect(vscode.window.showErrorMessage).toHaveBeenCalledTimes(1);
    const [message, button] = vscode.window.showErrorMessage.mock.calls[0];
    expect(message).toContain('optiml.server.path');
    expect(button).toBe('Open Settings');
    await vi.waitFor(() =>
      expect(vscode.state.executed).toContainEqual({
        command: 'workbench.action.openSettings',
        args: ['optiml.server.path'],
      }),
    );
    expect(status().text).toBe('$(error) OptiML');
    expect(status().backgroundColor).toEqual(
      new vscode.ThemeColor('statusBarItem.errorBackground'),
    );
  });

  it('shows a failed start in the status bar', async () => {
    lsp.FakeClient.failStart = true;
    await start();
    expect(controller.serverState.kind).toBe('failed');
    expect(status().text).toBe('$(error) OptiML');
  });

  it('shows a server that stopped by itself as failed', async () => {
    await start();
    client().setState(lsp.State.Stopped);
    expect(status().text).toBe('$(error) OptiML');
  });

  it('registers the palette commands', async () => {
    await start();
    expect([...vscode.state.commands.keys()].sort()).toEqual([
      'optiml.cancelJobs',
      'optiml.clearApiKey',
      'optiml.restartServer',
      'optiml.setApiKey',
      'optiml.showServerLog',
    ]);
  });
});

describe('restarts', () => {
  it('restarts on Restart Server with a fresh client', async () => {
    await start();
    const before = lsp.FakeClient.instances.length;
    await vscode.state.commands.get('optiml.restartServer')!();
    expect(lsp.FakeClient.instances.length).toBe(before + 1);
    expect(client(before - 1).disposed).toBe(true);
    expect(status().text).toBe('$(check) OptiML 0.1.0');
  });

  it('restarts when the server path changes, not when arch does', async () => {
    await start();
    const count = lsp.FakeClient.instances.length;
    await vscode.changeSettings({ 'optiml.arch': 'sm_90' });
    expect(lsp.FakeClient.instances.length).toBe(count);
    await vscode.changeSettings({ 'optiml.server.args': ['--stdio'] });
    expect(lsp.FakeClient.instances.length).toBe(count + 1);
    expect(client().serverOptions.args).toEqual(['serve', '--stdio']);
  });

  it('restarts on a provider change only when the key to pass changes', async () => {
    context.stored.set('optiml.apiKey.openai-compatible', 'local-secret');
    await start({ 'optiml.provider': 'openai' });
    const count = lsp.FakeClient.instances.length;
    await vscode.changeSettings({ 'optiml.provider': 'anthropic' });
    expect(lsp.FakeClient.instances.length).toBe(count);
    await vscode.changeSettings({ 'optiml.provider': 'openai-compatible' });
    expect(lsp.FakeClient.instances.length).toBe(count + 1);
    expect(client().serverOptions.options.env.OPTIML_LLM_API_KEY).toBe('local-secret');
  });
});

describe('API keys', () => {
  it('stores a key from a password box, restarts with it, and never logs it', async () => {
    await start({ 'optiml.provider': 'anthropic' });
    vscode.window.showQuickPick.mockImplementationOnce(async (items: any[]) => {
      expect(items.map((i) => i.label)).toEqual(['anthropic', 'openai', 'openai-compatible']);
      return items.find((i) => i.label === 'anthropic');
    });
    vscode.window.showInputBox.mockImplementationOnce(async (options: any) => {
      expect(options.password).toBe(true);
      return ' sk-ant-secret ';
    });
    const count = lsp.FakeClient.instances.length;
    await vscode.state.commands.get('optiml.setApiKey')!();
    expect(context.stored.get('optiml.apiKey.anthropic')).toBe('sk-ant-secret');
    expect(lsp.FakeClient.instances.length).toBe(count + 1);
    const env = client().serverOptions.options.env;
    expect(env.ANTHROPIC_API_KEY).toBe('sk-ant-secret');
    expect(env.OPTIML_LLM_API_KEY).toBe('sk-ant-secret');
    const said = [
      ...vscode.state.output,
      ...vscode.window.showInformationMessage.mock.calls.flat().map(String),
    ].join('\n');
    expect(said).toContain('ANTHROPIC_API_KEY');
    expect(said).not.toContain('sk-ant-secret');
  });

  it('stores nothing when the input is cancelled', async () => {
    await start();
    vscode.window.showQuickPick.mockImplementationOnce(async (items: any[]) => items[0]);
    vscode.window.showInputBox.mockResolvedValueOnce(undefined);
    const count = lsp.FakeClient.instances.length;
    await vscode.state.commands.get('optiml.setApiKey')!();
    expect(context.secrets.store).not.toHaveBeenCalled();
    expect(lsp.FakeClient.instances.length).toBe(count);
  });

  it('clears a stored key and restarts without it', async () => {
    context.stored.set('optiml.apiKey.openai', 'sk-1');
    await start();
    expect(client().serverOptions.options.env.OPENAI_API_KEY).toBe('sk-1');
    vscode.window.showQuickPick.mockImplementationOnce(async (items: any[]) => {
      expect(items.map((i) => i.label)).toEqual(['openai']);
      return items[0];
    });
    await vscode.state.commands.get('optiml.clearApiKey')!();
    expect(context.stored.has('optiml.apiKey.openai')).toBe(false);
    expect(client().serverOptions.options.env.OPENAI_API_KEY).toBe(process.env.OPENAI_API_KEY);
  });

  it('says so when there is no key to clear', async () => {
    await start();
    await vscode.state.commands.get('optiml.clearApiKey')!();
    expect(vscode.window.showQuickPick).not.toHaveBeenCalled();
    expect(vscode.window.showInformationMessage).toHaveBeenCalledWith(
      'OptiML: no API key is stored',
    );
  });
});

describe('middleware', () => {
  it("opens compareProposal's result in VS Code's diff", async () => {
    await start();
    const result = {
      original: 'file:///w/k.cu',
      variant: 'file:///tmp/p/k.cu',
      title: 'k ↔ proposal',
    };
    const next = vi.fn(async () => result);
    const args = [{ proposal: 'p1' }];
    const answer = await client().clientOptions.middleware.executeCommand(
      'optiml.compareProposal',
      args,
      next,
    );
    expect(next).toHaveBeenCalledWith('optiml.compareProposal', args);
    expect(answer).toBe(result);
    const diff = vscode.state.executed.find((e) => e.command === 'vscode.diff');
    expect(diff?.args.map(String)).toEqual([
      'file:///w/k.cu',
      'file:///tmp/p/k.cu',
      'k ↔ proposal',
    ]);
  });

  it("opens openReport's result outside the editor", async () => {
    await start();
    const next = vi.fn(async () => ({ report: 'file:///tmp/p/report.html' }));
    await client().clientOptions.middleware.executeCommand(
      'optiml.openReport',
      [{ proposal: 'p1' }],
      next,
    );
    expect(vscode.env.openExternal).toHaveBeenCalledTimes(1);
    expect(String(vscode.env.openExternal.mock.calls[0][0])).toBe('file:///tmp/p/report.html');
  });

  it('passes the other commands through untouched', async () => {
    await start();
    const next = vi.fn(async () => ({ report: 'file:///x' }));
    await client().clientOptions.middleware.executeCommand(
      'optiml.optimize',
      [{ kernel: 'k' }],
      next,
    );
    expect(vscode.env.openExternal).not.toHaveBeenCalled();
    expect(vscode.state.executed).toEqual([]);
  });

  it('shows a malformed comparison as an error', async () => {
    await start();
    const next = vi.fn(async () => ({ original: 'file:///a' }));
    await client().clientOptions.middleware.executeCommand('optiml.compareProposal', [], next);
    expect(vscode.window.showErrorMessage).toHaveBeenCalledTimes(1);
  });

  it('answers workspace/configuration with the server keys only', async () => {
    await start({ 'optiml.model': 'gpt-4.1', 'optiml.trace.server': 'verbose' });
    const next = vi.fn(async () => [
      { model: 'gpt-4.1', server: { path: server }, trace: { server: 'verbose' } },
    ]);
    const answer = await client().clientOptions.middleware.workspace.configuration(
      { items: [{ section: 'optiml' }] },
      {},
      next,
    );
    expect(answer[0]).toMatchObject({ model: 'gpt-4.1', arch: null });
    expect(Object.keys(answer[0])).not.toContain('server');
    expect(Object.keys(answer[0])).not.toContain('trace');
  });

  it('shows a cancellable job as a notification whose Cancel cancels its token', async () => {
    await start();
    const handle = client().clientOptions.middleware.handleWorkDoneProgress;
    const next = vi.fn();
    handle('job-1', { kind: 'begin', title: 'OptiML: optimize saxpy', cancellable: true }, next);
    expect(next).not.toHaveBeenCalled();
    expect(vscode.state.progress).toHaveLength(1);
    expect(vscode.state.progress[0].options).toMatchObject({
      location: vscode.ProgressLocation.Notification,
      cancellable: true,
    });
    expect(status().text).toBe('$(check) OptiML 0.1.0 · 1 job');
    vscode.state.progress[0].cancel();
    await vi.waitFor(() =>
      expect(client().sendNotification).toHaveBeenCalledWith(
        { method: 'window/workDoneProgress/cancel' },
        { token: 'job-1' },
      ),
    );
    handle('job-1', { kind: 'end' }, next);
    await vi.waitFor(() => expect(vscode.state.progress[0].finished).toBe(true));
    expect(status().text).toBe('$(check) OptiML 0.1.0');

    handle('compile-1', { kind: 'begin', title: 'OptiML: compiling k.cu' }, next);
    expect(next).toHaveBeenCalledTimes(2);
    expect(vscode.state.progress).toHaveLength(1);
  });
});

describe('Cancel Job', () => {
  it('sends optiml.cancelJob with no arguments', async () => {
    await start();
    await vscode.state.commands.get('optiml.cancelJobs')!();
    expect(client().sendRequest).toHaveBeenCalledWith(
      { method: 'workspace/executeCommand' },
      { command: 'optiml.cancelJob', arguments: [] },
    );
  });

  it('says so when the server runs no jobs', async () => {
    lsp.FakeClient.commands = ['optiml.addSpec'];
    try {
      await start();
      await vscode.state.commands.get('optiml.cancelJobs')!();
      expect(client().sendRequest).not.toHaveBeenCalled();
      expect(vscode.window.showInformationMessage).toHaveBeenCalledTimes(1);
    } finally {
      lsp.FakeClient.commands = ['optiml.addSpec', 'optiml.cancelJob', 'optiml.compareProposal'];
    }
  });
});
