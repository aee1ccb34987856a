/** Names shared by the extension and the OptiML language server. No `vscode` import here. */

/** The settings section, and the language client's id (so `optiml.trace.server` traces it). */
export const SECTION = 'optiml';
export const CLIENT_ID = 'optiml';
export const CLIENT_NAME = 'OptiML';

/** Commands the extension registers itself (the command palette's). None of them may be a
 * server command: the language client registers every command the server lists in
 * `executeCommandProvider`, and VS Code refuses a second registration of one id. */
export const ClientCommand = {
  restartServer: 'optiml.restartServer',
  showServerLog: 'optiml.showServerLog',
  cancelJobs: 'optiml.cancelJobs',
  setApiKey: 'optiml.setApiKey',
  clearApiKey: 'optiml.clearApiKey',
} as const;

/** Commands the server executes (`workspace/executeCommand`). The language client registers
 * those the server lists; code actions and code lenses carry them with their arguments. */
export const ServerCommand = {
  /** `[uri, version, kernel]`: the spec edit, for clients that take only Commands. */
  addSpec: 'optiml.addSpec',
  /** `[{uri, version, kernel}]`: start an optimize job on the kernel. */
  optimize: 'optiml.optimize',
  /** `[{uri, version, kernel}]`: start a profile job on the kernel. */
  profile: 'optiml.profile',
  /** `[{uri, version, line}]`: start a generate job on the formula in the comment at `line`. */
  generate: 'optiml.generate',
  /** `[{proposal}]`: the server answers with `workspace/applyEdit`. */
  acceptProposal: 'optiml.acceptProposal',
  /** `[{proposal}]`. */
  rejectProposal: 'optiml.rejectProposal',
  /** `[{proposal}]` → `{original, variant, title}`. */
  compareProposal: 'optiml.compareProposal',
  /** `[{proposal}]` → `{report}`. */
  openReport: 'optiml.openReport',
  /** No arguments: cancel every optimize, profile and generate job of this client. */
  cancelJob: 'optiml.cancelJob',
} as const;

export type ServerCommandId = (typeof ServerCommand)[keyof typeof ServerCommand];

/** The documents the server gets: VS Code's CUDA language, and `.cu`/`.cuh` files whatever
 * language another extension gave them. */
export const DOCUMENT_SELECTOR = [
  { scheme: 'file', language: 'cuda-cpp' },
  { scheme: 'untitled', language: 'cuda-cpp' },
  { scheme: 'file', pattern: '**/*.{cu,cuh}' },
  { scheme: 'untitled', pattern: '**/*.{cu,cuh}' },
];
