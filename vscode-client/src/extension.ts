/** The extension's wiring to VS Code: starts `optiml serve` through the language client, keeps
 * the status bar item, the commands and the API keys. The decisions live in the modules without
 * `vscode` (settings, secrets, followUp, capabilities, executable, jobProgress, status). */

import * as os from 'os';
import * as vscode from 'vscode';
import {
  type CancellationToken,
  type ConfigurationParams,
  ConfigurationRequest,
  ExecuteCommandRequest,
  type ExecuteCommandSignature,
  type ResponseError,
  LanguageClient,
  type LanguageClientOptions,
  RevealOutputChannelOn,
  type ServerOptions,
  State,
  WorkDoneProgressCancelNotification,
} from 'vscode-languageclient/node';

import { OPTIML_EXPERIMENTAL, OptimlCapabilitiesFeature } from './capabilities';
import {
  CLIENT_ID,
  CLIENT_NAME,
  ClientCommand,
  DOCUMENT_SELECTOR,
  SECTION,
  ServerCommand,
} from './constants';
import { isExecutableFile, notFoundMessage, resolveExecutable } from './executable';
import { type FollowUp, followUp } from './followUp';
import { JobProgress, type ProgressToken, type ProgressView } from './jobProgress';
import {
  KEY_PROVIDERS,
  type KeyProvider,
  type StoredKeys,
  cleanKey,
  describeKeyEnvironment,
  keyEnvironment,
  keyPickOrder,
  keyRoute,
  sameKeyEnvironment,
  secretName,
  serverEnvironment,
  validateKeyInput,
} from './secrets';
import {
  RESTART_SECTIONS,
  type ServerSettings,
  answerConfiguration,
  serverLaunch,
  serverSettings,
} from './settings';
import { type ServerState, statusView } from './status';

const OPEN_SETTINGS = 'Open Settings';

let controller: Controller | undefined;

export function activate(context: vscode.ExtensionContext): Controller {
  controller = new Controller(context);
  context.subscriptions.push(controller);
  void controller.start();
  return controller;
}

export async function deactivate(): Promise<void> {
  const current = controller;
  controller = undefined;
  await current?.stop();
}

/** One language client at a time; start, stop and restart run one after another. */
export class Controller implements vscode.Disposable {
  readonly output: vscode.OutputChannel;
  readonly jobs: JobProgress;
  private readonly status: vscode.StatusBarItem;
  private readonly disposables: vscode.Disposable[] = [];
  private client: LanguageClient | undefined;
  private state: ServerState = { kind: 'stopped' };
  private keyEnv: Record<string, string> = {};
  private queue: Promise<void> = Promise.resolve();

  constructor(private readonly context: vscode.ExtensionContext) {
    this.output = vscode.window.createOutputChannel('OptiML Language Server');
    this.status = vscode.window.createStatusBarItem(
      'optiml.server',
      vscode.StatusBarAlignment.Right,
      100,
    );
    this.status.name = 'OptiML';
    this.status.command = ClientCommand.showServerLog;
    this.jobs = new JobProgress(
      showJobProgress,
      (token) => this.cancelProgress(token),
      () => this.render(),
    );
    const command = (id: string, run: () => unknown) => vscode.commands.registerCommand(id, run);
    this.disposables.push(
      this.output,
      this.status,
      vscode.workspace.onDidChangeConfiguration((e) =>
        this.configurationChanged(e).catch((error) =>
          this.log(`Applying settings: ${describe(error)}`),
        ),
      ),
      command(ClientCommand.restartServer, () => this.restart()),
      command(ClientCommand.showServerLog, () => this.output.show(true)),
      command(ClientCommand.cancelJobs, () => this.cancelJobs()),
      command(ClientCommand.setApiKey, () => this.setApiKey()),
      command(ClientCommand.clearApiKey, () => this.clearApiKey()),
    );
  }

  /** The running client, if any (for tests and other extensions). */
  get languageClient(): LanguageClient | undefined {
    return this.client;
  }

  get serverState(): ServerState {
    return this.state;
  }

  start(): Promise<void> {
    return this.enqueue(() => this.doStart());
  }

  stop(): Promise<void> {
    return this.enqueue(() => this.doStop());
  }

  restart(): Promise<void> {
    return this.enqueue(async () => {
      await this.doStop();
      await this.doStart();
    });
  }

  dispose(): void {
    void this.stop();
    for (const d of this.disposables) {
      d.dispose();
    }
  }

  private enqueue(step: () => Promise<void>): Promise<void> {
    const run = this.queue.then(step);
    this.queue = run.catch((error) => this.log(`Unexpected error: ${describe(error)}`));
    return run;
  }

  /** Resolves when the starts and stops asked for so far are done. */
  settled(): Promise<void> {
    return this.queue;
  }

  private async doStart(): Promise<void> {
    if (this.client !== undefined) {
      return; // started already; `restart` stops it first
    }
    const config = vscode.workspace.getConfiguration(SECTION);
    const launch = serverLaunch((key) => config.get(key));
    const folder = firstFolder();
    const command = resolveExecutable(launch.command, {
      env: process.env,
      platform: process.platform,
      home: os.homedir(),
      workspaceFolder: folder,
      isExecutable: isExecutableFile,
    });
    if (command === undefined) {
      const message = notFoundMessage(launch.command);
      this.log(message);
      this.setState({ kind: 'failed', reason: `\`${launch.command}\` was not found` });
      void vscode.window.showErrorMessage(message, OPEN_SETTINGS).then((choice) => {
        if (choice === OPEN_SETTINGS) {
          void vscode.commands.executeCommand(
            'workbench.action.openSettings',
            `${SECTION}.server.path`,
          );
        }
      });
      return;
    }
    const keyEnv = keyEnvironment(await this.readKeys(), config.get('provider'));
    const serverOptions: ServerOptions = {
      command,
      args: launch.args,
      options: { env: serverEnvironment(process.env, keyEnv), cwd: folder },
    };
    const client = new LanguageClient(CLIENT_ID, CLIENT_NAME, serverOptions, this.clientOptions());
    client.registerFeature(new OptimlCapabilitiesFeature(OPTIML_EXPERIMENTAL));
    client.onDidChangeState((event) => this.clientState(client, event.newState));
    this.client = client;
    this.keyEnv = keyEnv;
    this.log(`Starting ${[command, ...launch.args].join(' ')} (${describeKeyEnvironment(keyEnv)})`);
    this.setState({ kind: 'starting' });
    try {
      await client.start();
    } catch (error) {
      this.log(`The language server did not start: ${describe(error)}`);
      if (this.client === client) {
        this.setState({ kind: 'failed', reason: 'the language server did not start; see its log' });
      }
    }
  }

  private async doStop(): Promise<void> {
    const client = this.client;
    this.client = undefined; // its state changes are no longer ours to show
    this.jobs.clear();
    this.setState({ kind: 'stopped' });
    if (client === undefined) {
      return;
    }
    try {
      await client.dispose();
    } catch (error) {
      this.log(`Stopping the language server: ${describe(error)}`);
    }
  }

  private clientOptions(): LanguageClientOptions {
    const config = vscode.workspace.getConfiguration(SECTION);
    return {
      documentSelector: DOCUMENT_SELECTOR,
      initializationOptions: serverSettings((key) => config.get(key)),
      synchronize: { configurationSection: SECTION },
      outputChannel: this.output,
      revealOutputChannelOn: RevealOutputChannelOn.Never,
      middleware: {
        executeCommand: (command, args, next) => this.executeCommand(command, args, next),
        workspace: {
          configuration: (params, token, next) => this.configuration(params, token, next),
        },
        handleWorkDoneProgress: (token, params, next) =>
          this.jobs.handle(token, params, () => next(token, params)),
      },
    };
  }

  /** Every server command passes here: the result of `optiml.compareProposal` and
   * `optiml.openReport` is opened by the extension (it declared `experimental.optiml`). */
  private async executeCommand(
    command: string,
    args: unknown[],
    next: ExecuteCommandSignature,
  ): Promise<unknown> {
    const result: unknown = await next(command, args);
    const action = followUp(command, result, OPTIML_EXPERIMENTAL);
    if (action !== undefined) {
      await this.perform(action);
    }
    return result;
  }

  private async perform(action: FollowUp): Promise<void> {
    try {
      switch (action.kind) {
        case 'diff':
          await vscode.commands.executeCommand(
            'vscode.diff',
            vscode.Uri.parse(action.original),
            vscode.Uri.parse(action.variant),
            action.title,
          );
          break;
        case 'openExternal':
          if (!(await vscode.env.openExternal(vscode.Uri.parse(action.target)))) {
            void vscode.window.showErrorMessage(
              `OptiML: could not open the report ${action.target}`,
            );
          }
          break;
        case 'error':
          this.log(action.message);
          void vscode.window.showErrorMessage(action.message);
          break;
      }
    } catch (error) {
      this.log(`Opening the server's result: ${describe(error)}`);
      void vscode.window.showErrorMessage(`OptiML: ${describe(error)}`);
    }
  }

  /** `workspace/configuration`: the `optiml` section without `server.*` and `trace.*`. */
  private async configuration(
    params: ConfigurationParams,
    token: CancellationToken,
    next: ConfigurationRequest.HandlerSignature,
  ): Promise<unknown[] | ResponseError<void>> {
    const answered = await next(params, token);
    if (!Array.isArray(answered)) {
      return answered; // an error
    }
    return answerConfiguration(params.items, answered, (scope) => this.settingsFor(scope));
  }

  private settingsFor(scopeUri: string | undefined): ServerSettings {
    const scope = scopeUri === undefined ? undefined : vscode.Uri.parse(scopeUri);
    const config = vscode.workspace.getConfiguration(SECTION, scope);
    return serverSettings((key) => config.get(key));
  }

  private async configurationChanged(event: vscode.ConfigurationChangeEvent): Promise<void> {
    if (RESTART_SECTIONS.some((section) => event.affectsConfiguration(section))) {
      this.log('The server settings changed: restarting the language server');
      await this.restart();
    } else if (event.affectsConfiguration(`${SECTION}.provider`) && this.client !== undefined) {
      // The configured provider's key travels in the process's environment.
      const provider = vscode.workspace.getConfiguration(SECTION).get('provider');
      const keyEnv = keyEnvironment(await this.readKeys(), provider);
      if (!sameKeyEnvironment(keyEnv, this.keyEnv)) {
        this.log(
          'The provider changed, and with it the API key to pass: restarting the language server',
        );
        await this.restart();
      }
    }
  }

  private clientState(client: LanguageClient, state: State): void {
    if (client !== this.client) {
      return; // a client stopped on purpose
    }
    if (state === State.Starting) {
      this.setState({ kind: 'starting' });
    } else if (state === State.Running) {
      this.setState({ kind: 'running', version: client.initializeResult?.serverInfo?.version });
    } else if (state === State.Stopped) {
      this.jobs.clear();
      this.setState({ kind: 'failed', reason: 'the language server stopped; see its log' });
    }
  }

  private setState(state: ServerState): void {
    this.state = state;
    this.render();
  }

  private render(): void {
    const view = statusView(this.state, this.jobs.running);
    this.status.text = view.text;
    this.status.tooltip = view.tooltip;
    this.status.backgroundColor = view.error
      ? new vscode.ThemeColor('statusBarItem.errorBackground')
      : undefined;
    if (view.visible) {
      this.status.show();
    } else {
      this.status.hide();
    }
  }

  private cancelProgress(token: ProgressToken): void {
    const client = this.client;
    if (client?.isRunning()) {
      void client.sendNotification(WorkDoneProgressCancelNotification.type, { token });
    }
  }

  /** "OptiML: Cancel Job": `optiml.cancelJob` with no arguments cancels all of this client's
   * optimize and profile jobs. */
  private async cancelJobs(): Promise<void> {
    const client = this.client;
    if (client === undefined || !client.isRunning()) {
      void vscode.window.showInformationMessage('OptiML: the language server is not running');
      return;
    }
    const offered = client.initializeResult?.capabilities.executeCommandProvider?.commands ?? [];
    if (!offered.includes(ServerCommand.cancelJob)) {
      void vscode.window.showInformationMessage('OptiML: this version of the server runs no jobs');
      return;
    }
    try {
      await client.sendRequest(ExecuteCommandRequest.type, {
        command: ServerCommand.cancelJob,
        arguments: [],
      });
    } catch (error) {
      this.log(`Cancelling jobs: ${describe(error)}`);
      void vscode.window.showErrorMessage(`OptiML: could not cancel the jobs: ${describe(error)}`);
    }
  }

  private async readKeys(): Promise<StoredKeys> {
    const stored: StoredKeys = {};
    for (const provider of KEY_PROVIDERS) {
      const key = await this.context.secrets.get(secretName(provider));
      if (key) {
        stored[provider] = key;
      }
    }
    return stored;
  }

  private async setApiKey(): Promise<void> {
    const stored = await this.readKeys();
    const configured = vscode.workspace.getConfiguration(SECTION).get('provider');
    const items = keyPickOrder(configured).map((provider) => ({
      label: provider,
      description: stored[provider] ? 'a key is stored' : undefined,
      detail: keyRoute(provider),
      provider,
    }));
    const pick = await vscode.window.showQuickPick(items, {
      title: 'OptiML: Set API Key',
      placeHolder: 'The provider whose API key to store',
    });
    if (pick === undefined) {
      return;
    }
    const input = await vscode.window.showInputBox({
      title: `OptiML: API key for ${pick.provider}`,
      prompt: "Kept in VS Code's secret storage; the OptiML server gets it in its environment",
      password: true,
      ignoreFocusOut: true,
      validateInput: validateKeyInput,
    });
    const key = cleanKey(input);
    if (key === undefined) {
      return;
    }
    await this.context.secrets.store(secretName(pick.provider), key);
    this.log(`The ${pick.provider} API key was stored: restarting the language server`);
    void vscode.window.showInformationMessage(
      `OptiML: the ${pick.provider} API key is stored; the server restarts to use it`,
    );
    await this.restart();
  }

  private async clearApiKey(): Promise<void> {
    const stored = await this.readKeys();
    const present = KEY_PROVIDERS.filter((provider) => stored[provider]);
    if (present.length === 0) {
      void vscode.window.showInformationMessage('OptiML: no API key is stored');
      return;
    }
    const items: { label: string; providers: KeyProvider[] }[] = present.map((provider) => ({
      label: provider,
      providers: [provider],
    }));
    if (present.length > 1) {
      items.push({ label: 'All providers', providers: present });
    }
    const pick = await vscode.window.showQuickPick(items, {
      title: 'OptiML: Clear API Key',
      placeHolder: 'The stored key to delete',
    });
    if (pick === undefined) {
      return;
    }
    for (const provider of pick.providers) {
      await this.context.secrets.delete(secretName(provider));
    }
    const which = pick.providers.join(', ');
    this.log(`The stored API key of ${which} was deleted: restarting the language server`);
    void vscode.window.showInformationMessage(`OptiML: the stored API key of ${which} is deleted`);
    await this.restart();
  }

  private log(line: string): void {
    this.output.appendLine(`[optiml] ${line}`);
  }
}

/** A job's cancellable notification. */
function showJobProgress(title: string, onCancel: () => void): ProgressView {
  let progress: vscode.Progress<{ message?: string; increment?: number }> | undefined;
  const pending: { message?: string; increment?: number }[] = [];
  let finish: () => void = () => {};
  const finished = new Promise<void>((resolve) => {
    finish = resolve;
  });
  void vscode.window.withProgress(
    { location: vscode.ProgressLocation.Notification, title, cancellable: true },
    (p, token) => {
      progress = p;
      pending.splice(0).forEach((value) => p.report(value));
      token.onCancellationRequested(onCancel);
      return finished;
    },
  );
  return {
    report(message, increment) {
      const value = { message, increment };
      if (progress === undefined) {
        pending.push(value);
      } else {
        progress.report(value);
      }
    },
    done() {
      finish();
    },
  };
}

function firstFolder(): string | undefined {
  const folder = vscode.workspace.workspaceFolders?.find((f) => f.uri.scheme === 'file');
  return folder?.uri.fsPath;
}

function describe(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}
