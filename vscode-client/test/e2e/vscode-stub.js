// A small stand-in for the VS Code API: enough of it for vscode-languageclient to start a server,
// register the server's commands and show progress. What the extension asks of the editor is
// recorded in `recorded` for drive.js to report. Settings come from `configure(settings)`.
'use strict';

const recorded = {
  commands: new Map(),
  executed: [],
  messages: [],
  output: [],
  external: [],
  progress: [],
  status: undefined,
};
let settings = {};

class Disposable {
  constructor(fn) {
    this.fn = fn;
  }
  dispose() {
    if (this.fn) this.fn();
  }
  static from(...items) {
    return new Disposable(() => items.forEach((d) => d && d.dispose && d.dispose()));
  }
}

class EventEmitter {
  constructor() {
    this.listeners = [];
    this.event = (listener) => {
      this.listeners.push(listener);
      return new Disposable(() => {
        this.listeners = this.listeners.filter((l) => l !== listener);
      });
    };
  }
  fire(value) {
    this.listeners.forEach((l) => l(value));
  }
  dispose() {
    this.listeners = [];
  }
}

const noEvent = () => new Disposable();

class Uri {
  constructor(scheme, path, raw) {
    Object.assign(this, { scheme, path, raw, authority: '', query: '', fragment: '' });
  }
  static parse(value) {
    const m = /^([a-zA-Z][\w+.-]*):(\/\/)?(.*)$/.exec(value);
    return new Uri(m ? m[1] : 'file', m ? m[3] : value, value);
  }
  static file(path) {
    return new Uri('file', path, `file://${path}`);
  }
  get fsPath() {
    return this.path;
  }
  with() {
    return this;
  }
  toString() {
    return this.raw;
  }
  toJSON() {
    return this.raw;
  }
}

class CancellationTokenSource {
  constructor() {
    const cancelled = new EventEmitter();
    this.cancelled = cancelled;
    this.token = { isCancellationRequested: false, onCancellationRequested: cancelled.event };
  }
  cancel() {
    this.token.isCancellationRequested = true;
    this.cancelled.fire();
  }
  dispose() {}
}

class CancellationError extends Error {}

/** Anything not modelled: callable, constructible and extendable, returning disposables. */
function fallback() {
  const f = function () {};
  return new Proxy(f, {
    get(target, key) {
      if (key === 'prototype') return target.prototype;
      if (key === 'then' || typeof key === 'symbol') return undefined;
      return fallback();
    },
    apply: () => new Disposable(),
    construct: () => ({}),
  });
}

function configuration(section) {
  const prefix = section ? `${section}.` : '';
  return {
    get(key, otherwise) {
      const full = prefix + key;
      if (full in settings) return settings[full];
      const nested = {};
      let found = false;
      for (const [k, v] of Object.entries(settings)) {
        if (!k.startsWith(`${full}.`)) continue;
        found = true;
        const parts = k.slice(full.length + 1).split('.');
        let o = nested;
        parts.slice(0, -1).forEach((p) => (o = o[p] = o[p] || {}));
        o[parts[parts.length - 1]] = v;
      }
      return found ? nested : otherwise;
    },
    has: (key) => prefix + key in settings,
    update: async () => {},
    inspect: () => undefined,
  };
}

const configurationChanged = new EventEmitter();

const api = {
  version: '1.85.0',
  Uri,
  EventEmitter,
  Disposable,
  CancellationTokenSource,
  CancellationError,
  ProgressLocation: { SourceControl: 1, Window: 10, Notification: 15 },
  StatusBarAlignment: { Left: 1, Right: 2 },
  ThemeColor: class {
    constructor(id) {
      this.id = id;
    }
  },
  TabInputText: class {},
  TabInputTextDiff: class {},
  TabInputCustom: class {},
  TabInputNotebook: class {},
  TabInputNotebookDiff: class {},
  workspace: {
    getConfiguration: (section) => configuration(section),
    textDocuments: [],
    notebookDocuments: [],
    workspaceFolders: [{ uri: Uri.file(process.cwd()), name: 'workspace', index: 0 }],
    onDidChangeConfiguration: configurationChanged.event,
    onDidOpenTextDocument: noEvent,
    onDidCloseTextDocument: noEvent,
    onDidChangeTextDocument: noEvent,
    onDidSaveTextDocument: noEvent,
    onWillSaveTextDocument: noEvent,
    onDidChangeWorkspaceFolders: noEvent,
    onDidOpenNotebookDocument: noEvent,
    onDidCloseNotebookDocument: noEvent,
    onDidChangeNotebookDocument: noEvent,
    onDidSaveNotebookDocument: noEvent,
    onDidCreateFiles: noEvent,
    onDidRenameFiles: noEvent,
    onDidDeleteFiles: noEvent,
    onWillCreateFiles: noEvent,
    onWillRenameFiles: noEvent,
    onWillDeleteFiles: noEvent,
    createFileSystemWatcher: () => ({
      onDidCreate: noEvent,
      onDidChange: noEvent,
      onDidDelete: noEvent,
      dispose() {},
    }),
    applyEdit: async () => true,
  },
  window: {
    createOutputChannel: (name) => ({
      name,
      append: (text) => recorded.output.push(text),
      appendLine: (line) => recorded.output.push(`${line}\n`),
      show() {},
      clear() {},
      replace() {},
      dispose() {},
    }),
    createStatusBarItem: () =>
      (recorded.status = {
        text: '',
        visible: false,
        show() {
          this.visible = true;
        },
        hide() {
          this.visible = false;
        },
        dispose() {},
      }),
    showErrorMessage: async (...args) => void recorded.messages.push(['error', ...args]),
    showWarningMessage: async (...args) => void recorded.messages.push(['warning', ...args]),
    showInformationMessage: async (...args) => void recorded.messages.push(['info', ...args]),
    withProgress: async (options, task) => {
      const source = new CancellationTokenSource();
      const entry = { options, reports: [], finished: false, cancel: () => source.cancel() };
      recorded.progress.push(entry);
      await task({ report: (value) => entry.reports.push(value) }, source.token);
      entry.finished = true;
    },
    tabGroups: { all: [], onDidChangeTabs: noEvent, onDidChangeTabGroups: noEvent },
    activeTextEditor: undefined,
    visibleTextEditors: [],
    onDidChangeActiveTextEditor: noEvent,
    onDidChangeVisibleTextEditors: noEvent,
    showTextDocument: async () => undefined,
  },
  languages: new Proxy(
    {
      match: () => 0,
      createDiagnosticCollection: () => ({
        set() {},
        delete() {},
        clear() {},
        dispose() {},
        forEach() {},
        get: () => [],
        has: () => false,
      }),
    },
    { get: (target, key) => (key in target ? target[key] : () => new Disposable()) },
  ),
  commands: {
    registerCommand(id, handler) {
      if (recorded.commands.has(id)) throw new Error(`command '${id}' already exists`);
      recorded.commands.set(id, handler);
      return new Disposable(() => recorded.commands.delete(id));
    },
    executeCommand: async (id, ...args) => void recorded.executed.push([id, ...args.map(String)]),
  },
  env: {
    language: 'en',
    appName: 'vscode-stub',
    openExternal: async (uri) => {
      recorded.external.push(String(uri));
      return true;
    },
  },
};

module.exports = new Proxy(api, {
  get: (target, key) => (key in target ? target[key] : fallback()),
});
module.exports.__recorded = recorded;
module.exports.__configure = (values) => {
  settings = values;
};
