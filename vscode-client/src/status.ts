/** The status bar item's content for each state of the server. No `vscode` import. */

export type ServerState =
  | { kind: 'starting' }
  | { kind: 'running'; version?: string }
  | { kind: 'failed'; reason: string }
  | { kind: 'stopped' };

export interface StatusView {
  text: string;
  tooltip: string;
  /** Shown with the error background. */
  error: boolean;
  visible: boolean;
}

export function statusView(state: ServerState, jobs: readonly string[] = []): StatusView {
  switch (state.kind) {
    case 'starting':
      return {
        text: '$(loading~spin) OptiML',
        tooltip: 'OptiML: starting the language server',
        error: false,
        visible: true,
      };
    case 'running': {
      const version = state.version ? ` ${state.version}` : '';
      const count =
        jobs.length === 0 ? '' : jobs.length === 1 ? ' · 1 job' : ` · ${jobs.length} jobs`;
      const running = jobs.length === 0 ? '' : `\n\nRunning: ${jobs.join('; ')}`;
      return {
        text: `$(check) OptiML${version}${count}`,
        tooltip: `OptiML language server${version} is running${running}\n\nClick to show its log`,
        error: false,
        visible: true,
      };
    }
    case 'failed':
      return {
        text: '$(error) OptiML',
        tooltip: `OptiML: ${state.reason}\n\nClick to show the server log`,
        error: true,
        visible: true,
      };
    case 'stopped':
      return {
        text: 'OptiML',
        tooltip: 'OptiML: the language server is stopped',
        error: false,
        visible: false,
      };
  }
}
