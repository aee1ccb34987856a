/** The `optiml.*` settings as the server sees them: `initializationOptions` at start, and the
 * answer to `workspace/configuration` for the `optiml` section afterwards. No `vscode` import. */

import { SECTION } from './constants';

/** Every setting the server reads, by its key without the `optiml.` prefix. `server.*` and
 * `trace.*` are the extension's own and never reach the server. */
export const SERVER_SETTING_KEYS = [
  'arch',
  'provider',
  'model',
  'baseUrl',
  'budget',
  'evaluations',
  'seconds',
  'policy',
  'executor',
  'gpus',
  'include',
  'define',
  'std',
  'nvccFlags',
  'compileCommands',
] as const;

export type ServerSettingKey = (typeof SERVER_SETTING_KEYS)[number];
export type ServerSettings = Record<ServerSettingKey, unknown>;

/** The defaults of package.json's `contributes.configuration` (a test keeps them equal). A
 * setting written as `null` gets its default, so a key with a default never goes out as null. */
export const SERVER_SETTING_DEFAULTS: ServerSettings = {
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
};

/** The settings that change how the server process is started: a change restarts it. */
export const RESTART_SECTIONS = [`${SECTION}.server.path`, `${SECTION}.server.args`] as const;

/** Reads `key` (without the prefix) from the `optiml` section. */
export type Lookup = (key: string) => unknown;

/** All server keys, always: an unset setting goes out as its default (`null` for those
 * without one), so that clearing a setting clears it on the server too (each source overrides
 * only the keys it names). Strings are trimmed and an empty string counts as unset. */
export function serverSettings(get: Lookup): ServerSettings {
  const out = {} as ServerSettings;
  for (const key of SERVER_SETTING_KEYS) {
    out[key] = normalize(get(key)) ?? SERVER_SETTING_DEFAULTS[key];
  }
  return out;
}

function normalize(value: unknown): unknown {
  if (value === undefined || value === null) {
    return null;
  }
  if (typeof value === 'string') {
    const trimmed = value.trim();
    return trimmed === '' ? null : trimmed;
  }
  return value;
}

export interface ServerLaunch {
  command: string;
  args: string[];
}

/** `optiml.server.path` and `optiml.server.args` → the command line, `serve` first. */
export function serverLaunch(get: Lookup): ServerLaunch {
  const path = get('server.path');
  const command = typeof path === 'string' && path.trim() !== '' ? path.trim() : 'optiml';
  const extra = get('server.args');
  const args = Array.isArray(extra)
    ? extra.filter((a): a is string => typeof a === 'string' && a !== '')
    : [];
  return { command, args: ['serve', ...args] };
}

export interface ConfigurationItem {
  scopeUri?: string | null;
  section?: string | null;
}

/** The answer to `workspace/configuration`: the `optiml` section as `serverSettings` gives it
 * (VS Code's own answer would carry `server` and `trace` too), every other item as VS Code
 * answered it. */
export function answerConfiguration(
  items: readonly ConfigurationItem[],
  answered: readonly unknown[],
  settingsFor: (scopeUri: string | undefined) => ServerSettings,
): unknown[] {
  return items.map((item, i) =>
    item.section === SECTION ? settingsFor(item.scopeUri ?? undefined) : (answered[i] ?? null),
  );
}
