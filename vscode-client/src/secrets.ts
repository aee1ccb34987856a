/** API keys: where they are stored and how they reach the server. Keys live only in VS Code's
 * SecretStorage and in the server process's environment; nothing here logs or returns a key
 * except `keyEnvironment`, whose result goes straight into that environment. No `vscode` import. */

/** The providers that take a key (`offline` takes none). */
export const KEY_PROVIDERS = ['openai', 'anthropic', 'openai-compatible'] as const;
export type KeyProvider = (typeof KEY_PROVIDERS)[number];

/** Each provider's own variable, read by the server's LLM layer after the generic one. An
 * OpenAI-compatible endpoint is a third party: it gets only the generic variable, and only while
 * it is the configured provider, so that its key never reaches OpenAI or Anthropic and theirs
 * never reach it. */
export const PROVIDER_KEY_VARIABLE: Record<KeyProvider, string | undefined> = {
  openai: 'OPENAI_API_KEY',
  anthropic: 'ANTHROPIC_API_KEY',
  'openai-compatible': undefined,
};

/** Read first by the server for every provider: the configured provider's stored key. */
export const GENERIC_KEY_VARIABLE = 'OPTIML_LLM_API_KEY';

export type StoredKeys = Partial<Record<KeyProvider, string>>;

export function isKeyProvider(value: unknown): value is KeyProvider {
  return typeof value === 'string' && (KEY_PROVIDERS as readonly string[]).includes(value);
}

/** The SecretStorage entry of a provider's key. */
export function secretName(provider: KeyProvider): string {
  return `optiml.apiKey.${provider}`;
}

/** The variables that carry the stored keys into the server process, for the configured
 * `provider` (the value of `optiml.provider`). A variable is set only where a key is stored; one
 * not set here keeps whatever the editor's own environment has. */
export function keyEnvironment(stored: StoredKeys, provider: unknown): Record<string, string> {
  const env: Record<string, string> = {};
  for (const p of KEY_PROVIDERS) {
    const variable = PROVIDER_KEY_VARIABLE[p];
    const key = stored[p];
    if (variable !== undefined && key) {
      env[variable] = key;
    }
  }
  if (isKeyProvider(provider) && stored[provider]) {
    env[GENERIC_KEY_VARIABLE] = stored[provider] as string;
  }
  return env;
}

/** The server process's environment: the editor's, with the keys over it. */
export function serverEnvironment(
  base: Readonly<Record<string, string | undefined>>,
  keys: Readonly<Record<string, string>>,
): Record<string, string> {
  const env: Record<string, string> = {};
  for (const [name, value] of Object.entries(base)) {
    if (value !== undefined) {
      env[name] = value;
    }
  }
  return { ...env, ...keys };
}

/** Whether two key environments differ (a change needs a server restart). */
export function sameKeyEnvironment(
  a: Readonly<Record<string, string>>,
  b: Readonly<Record<string, string>>,
): boolean {
  const names = new Set([...Object.keys(a), ...Object.keys(b)]);
  return [...names].every((name) => a[name] === b[name]);
}

/** What the log may say about the keys: the variables' names, never their values. */
export function describeKeyEnvironment(keys: Readonly<Record<string, string>>): string {
  const names = Object.keys(keys).sort();
  return names.length === 0
    ? 'no API key from secret storage'
    : `API keys from secret storage in ${names.join(', ')}`;
}

/** A key as typed into the input box: trimmed; undefined if it cannot be a key. */
export function cleanKey(input: string | undefined): string | undefined {
  const key = input?.trim();
  return key && !/\s/.test(key) ? key : undefined;
}

export function validateKeyInput(input: string): string | undefined {
  if (input.trim() === '') {
    return 'Enter the API key';
  }
  return /\s/.test(input.trim()) ? 'An API key has no spaces' : undefined;
}

/** The providers in the order to offer them: the configured one first. */
export function keyPickOrder(configured: unknown): KeyProvider[] {
  return isKeyProvider(configured)
    ? [configured, ...KEY_PROVIDERS.filter((p) => p !== configured)]
    : [...KEY_PROVIDERS];
}

/** How a provider's key reaches the server, for the quick pick. */
export function keyRoute(provider: KeyProvider): string {
  const own = PROVIDER_KEY_VARIABLE[provider];
  const generic = `${GENERIC_KEY_VARIABLE} while \`optiml.provider\` is ${provider}`;
  return own === undefined ? `passed as ${generic}` : `passed as ${own}, and as ${generic}`;
}
