import { describe, expect, it } from 'vitest';

import {
  GENERIC_KEY_VARIABLE,
  KEY_PROVIDERS,
  cleanKey,
  describeKeyEnvironment,
  keyEnvironment,
  keyPickOrder,
  keyRoute,
  sameKeyEnvironment,
  secretName,
  serverEnvironment,
  validateKeyInput,
} from '../src/secrets';

const stored = { openai: 'sk-openai', anthropic: 'sk-ant', 'openai-compatible': 'local-key' };

describe('keyEnvironment', () => {
  it('passes each stored key in its provider variable', () => {
    const env = keyEnvironment({ openai: 'sk-openai', anthropic: 'sk-ant' }, null);
    expect(env).toEqual({ OPENAI_API_KEY: 'sk-openai', ANTHROPIC_API_KEY: 'sk-ant' });
  });

  it("passes the configured provider's key in the generic variable", () => {
    expect(keyEnvironment(stored, 'anthropic')[GENERIC_KEY_VARIABLE]).toBe('sk-ant');
    expect(keyEnvironment(stored, 'openai')[GENERIC_KEY_VARIABLE]).toBe('sk-openai');
  });

  it('passes an OpenAI-compatible key only while that provider is configured', () => {
    for (const provider of [null, 'openai', 'anthropic', 'offline']) {
      expect(Object.values(keyEnvironment(stored, provider))).not.toContain('local-key');
    }
    const env = keyEnvironment(stored, 'openai-compatible');
    expect(env[GENERIC_KEY_VARIABLE]).toBe('local-key');
    expect(env.OPENAI_API_KEY).toBe('sk-openai');
  });

  it('sets nothing where no key is stored', () => {
    expect(keyEnvironment({}, 'openai')).toEqual({});
    expect(keyEnvironment({ openai: '' }, 'openai')).toEqual({});
  });
});

describe('serverEnvironment', () => {
  it("puts the keys over the editor's environment and drops unset variables", () => {
    const env = serverEnvironment(
      { PATH: '/usr/bin', OPENAI_API_KEY: 'old', HOME: undefined },
      { OPENAI_API_KEY: 'new' },
    );
    expect(env).toEqual({ PATH: '/usr/bin', OPENAI_API_KEY: 'new' });
  });
});

describe('the rest', () => {
  it('compares key environments', () => {
    expect(sameKeyEnvironment({ A: '1' }, { A: '1' })).toBe(true);
    expect(sameKeyEnvironment({ A: '1' }, { A: '2' })).toBe(false);
    expect(sameKeyEnvironment({ A: '1' }, {})).toBe(false);
    expect(sameKeyEnvironment({}, {})).toBe(true);
  });

  it('describes keys by their variable names only', () => {
    const text = describeKeyEnvironment(keyEnvironment(stored, 'openai-compatible'));
    expect(text).toContain('OPENAI_API_KEY');
    expect(text).toContain(GENERIC_KEY_VARIABLE);
    for (const key of Object.values(stored)) {
      expect(text).not.toContain(key);
    }
    expect(describeKeyEnvironment({})).toBe('no API key from secret storage');
  });

  it('names one secret per provider', () => {
    const names = KEY_PROVIDERS.map(secretName);
    expect(new Set(names).size).toBe(KEY_PROVIDERS.length);
    expect(secretName('openai')).toBe('optiml.apiKey.openai');
  });

  it('cleans and validates typed keys', () => {
    expect(cleanKey('  sk-1 \n')).toBe('sk-1');
    expect(cleanKey('   ')).toBeUndefined();
    expect(cleanKey('a b')).toBeUndefined();
    expect(cleanKey(undefined)).toBeUndefined();
    expect(validateKeyInput('')).toBeTruthy();
    expect(validateKeyInput('sk 1')).toBeTruthy();
    expect(validateKeyInput(' sk-1 ')).toBeUndefined();
  });

  it('offers the configured provider first', () => {
    expect(keyPickOrder('anthropic')).toEqual(['anthropic', 'openai', 'openai-compatible']);
    expect(keyPickOrder('offline')).toEqual([...KEY_PROVIDERS]);
    expect(keyPickOrder(undefined)).toEqual([...KEY_PROVIDERS]);
  });

  it('tells where each key goes', () => {
    expect(keyRoute('openai')).toContain('OPENAI_API_KEY');
    expect(keyRoute('openai-compatible')).not.toContain('OPENAI_API_KEY');
    expect(keyRoute('openai-compatible')).toContain(GENERIC_KEY_VARIABLE);
  });
});
