/** A stand-in for the `vscode` module, for the unit tests of modules that import it. It records
 * what the extension asked of the editor; tests set the answers (settings, quick picks, input). */

import { vi } from 'vitest';

export class Disposable {
  constructor(private readonly fn: () => void = () => {}) {}
  dispose(): void {
    this.fn();
  }
}

export class Uri {
  private constructor(
    readonly scheme: string,
    readonly raw: string,
  ) {}
  static parse(value: string): Uri {
    const scheme = /^([a-zA-Z][a-zA-Z0-9+.-]*):/.exec(value)?.[1] ?? 'file';
    return new Uri(scheme, value);
  }
  static file(path: string): Uri {
    return new Uri('file', `file://${path}`);
  }
  get fsPath(): string {
    return this.raw.replace(/^file:\/\//, '');
  }
  toString(): string {
    return this.raw;
  }
}

export class ThemeColor {
  constructor(readonly id: string) {}
}

export enum StatusBarAlignment {
  Left = 1,
  Right = 2,
}

export enum ProgressLocation {
  SourceControl = 1,
  Window = 10,
  Notification = 15,
}

type Listener<T> = (value: T) => unknown;

class Emitter<T> {
  private listeners: Listener<T>[] = [];
  event = (listener: Listener<T>): Disposable => {
    this.listeners.push(listener);
    return new Disposable(() => {
      this.listeners = this.listeners.filter((l) => l !== listener);
    });
  };
  async fire(value: T): Promise<void> {
    for (const l of this.listeners) {
      await l(value);
    }
  }
}

export interface StatusItem {
  text: string;
  tooltip: string | undefined;
  backgroundColor: ThemeColor | undefined;
  command: string | undefined;
  name: string | undefined;
  visible: boolean;
  show(): void;
  hide(): void;
  dispose(): void;
}

/** Everything the tests read back or set, reset by `resetVscode()`. */
export const state = {
  settings: {} as Record<string, unknown>,
  workspaceFolders: undefined as { uri: Uri; name: string; index: number }[] | undefined,
  commands: new Map<string, (...args: unknown[]) => unknown>(),
  executed: [] as { command: string; args: unknown[] }[],
  output: [] as string[],
  statusItems: [] as StatusItem[],
  configurationChanged: new Emitter<{ affectsConfiguration(section: string): boolean }>(),
  progress: [] as {
    options: { location: ProgressLocation; title?: string; cancellable?: boolean };
    reports: { message?: string; increment?: number }[];
    cancel: () => void;
    finished: boolean;
  }[],
};

export function resetVscode(): void {
  state.settings = {};
  state.workspaceFolders = undefined;
  state.commands.clear();
  state.executed = [];
  state.output = [];
  state.statusItems = [];
  state.configurationChanged = new Emitter();
  state.progress = [];
  vi.clearAllMocks();
  window.showErrorMessage.mockResolvedValue(undefined);
  window.showInformationMessage.mockResolvedValue(undefined);
  window.showQuickPick.mockResolvedValue(undefined);
  window.showInputBox.mockResolvedValue(undefined);
  env.openExternal.mockResolvedValue(true);
}

/** Fires `onDidChangeConfiguration` for the given changed keys (`optiml.server.path`, …). */
export function changeSettings(changes: Record<string, unknown>): Promise<void> {
  Object.assign(state.settings, changes);
  const keys = Object.keys(changes);
  return state.configurationChanged.fire({
    affectsConfiguration: (section: string) =>
      keys.some((k) => k === section || k.startsWith(`${section}.`) || section.startsWith(`${k}.`)),
  });
}

export const window = {
  createOutputChannel: vi.fn((name: string) => ({
    name,
    appendLine: (line: string) => state.output.push(line),
    append: (text: string) => state.output.push(text),
    show: vi.fn(),
    dispose: vi.fn(),
  })),
  createStatusBarItem: vi.fn(() => {
    const item: StatusItem = {
      text: '',
      tooltip: undefined,
      backgroundColor: undefined,
      command: undefined,
      name: undefined,
      visible: false,
      show() {
        item.visible = true;
      },
      hide() {
        item.visible = false;
      },
      dispose() {
        item.visible = false;
      },
    };
    state.statusItems.push(item);
    return item;
  }),
  showErrorMessage: vi.fn(),
  showInformationMessage: vi.fn(),
  showWarningMessage: vi.fn(),
  showQuickPick: vi.fn(),
  showInputBox: vi.fn(),
  withProgress: vi.fn(
    (
      options: { location: ProgressLocation; title?: string; cancellable?: boolean },
      task: (
        progress: { report(value: { message?: string; increment?: number }): void },
        token: { onCancellationRequested(listener: () => void): Disposable },
      ) => Promise<unknown>,
    ) => {
      const cancelled = new Emitter<void>();
      const entry = {
        options,
        reports: [] as { message?: string; increment?: number }[],
        cancel: () => void cancelled.fire(),
        finished: false,
      };
      state.progress.push(entry);
      const done = task(
        { report: (value) => entry.reports.push(value) },
        { onCancellationRequested: (listener) => cancelled.event(listener) },
      );
      return Promise.resolve(done).then(() => {
        entry.finished = true;
      });
    },
  ),
};

export const workspace = {
  getConfiguration: vi.fn((section?: string) => ({
    get: (key: string) => state.settings[section ? `${section}.${key}` : key],
  })),
  onDidChangeConfiguration: (listener: Listener<{ affectsConfiguration(s: string): boolean }>) =>
    state.configurationChanged.event(listener),
  get workspaceFolders() {
    return state.workspaceFolders;
  },
};

export const commands = {
  registerCommand: vi.fn((command: string, handler: (...args: unknown[]) => unknown) => {
    if (state.commands.has(command)) {
      throw new Error(`command '${command}' already exists`);
    }
    state.commands.set(command, handler);
    return new Disposable(() => state.commands.delete(command));
  }),
  executeCommand: vi.fn(async (command: string, ...args: unknown[]) => {
    state.executed.push({ command, args });
    return undefined;
  }),
};

export const env = {
  openExternal: vi.fn(),
};

resetVscode();
