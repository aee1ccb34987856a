import * as fs from 'fs';
import * as path from 'path';
import { describe, expect, it } from 'vitest';

import pkg from '../package.json';
import { ClientCommand, DOCUMENT_SELECTOR, ServerCommand } from '../src/constants';

describe('package.json', () => {
  it('contributes exactly the commands the extension registers', () => {
    const contributed = pkg.contributes.commands.map((c) => c.command).sort();
    expect(contributed).toEqual(Object.values(ClientCommand).sort());
    for (const c of pkg.contributes.commands) {
      expect(c.category).toBe('OptiML');
    }
    const titles = pkg.contributes.commands.map((c) => `${c.category}: ${c.title}`).sort();
    expect(titles).toEqual([
      'OptiML: Cancel Job',
      'OptiML: Clear API Key',
      'OptiML: Restart Server',
      'OptiML: Set API Key',
      'OptiML: Show Server Log',
    ]);
  });

  it('registers no command the server owns (the language client registers those)', () => {
    const server = new Set<string>(Object.values(ServerCommand));
    for (const command of Object.values(ClientCommand)) {
      expect(server.has(command), command).toBe(false);
    }
  });

  it('activates on CUDA', () => {
    expect(pkg.activationEvents).toEqual(
      expect.arrayContaining(['onLanguage:cuda-cpp', 'workspaceContains:**/*.cu']),
    );
    expect(pkg.main).toBe('./dist/extension.js');
    expect(pkg.engines.vscode).toBe('^1.85.0');
    expect(pkg.devDependencies['@types/vscode']).toMatch(/1\.85/);
  });

  it('selects CUDA documents of the file and untitled schemes', () => {
    for (const scheme of ['file', 'untitled']) {
      expect(DOCUMENT_SELECTOR).toContainEqual({ scheme, language: 'cuda-cpp' });
      expect(DOCUMENT_SELECTOR).toContainEqual({ scheme, pattern: '**/*.{cu,cuh}' });
    }
  });

  it('keeps the server command line out of untrusted workspaces', () => {
    expect(pkg.capabilities.untrustedWorkspaces.restrictedConfigurations.sort()).toEqual([
      'optiml.server.args',
      'optiml.server.path',
    ]);
  });

  it('packs only the bundle and the docs', () => {
    const ignore = fs.readFileSync(path.join(__dirname, '..', '.vscodeignore'), 'utf8');
    for (const pattern of ['src/**', 'test/**', 'node_modules/**']) {
      expect(ignore).toContain(pattern);
    }
  });

  it('has a README without relative links (vsce refuses them without a repository)', () => {
    const readme = fs.readFileSync(path.join(__dirname, '..', 'README.md'), 'utf8');
    const links = [...readme.matchAll(/\]\(([^)]+)\)/g)].map((m) => m[1]);
    expect(links.filter((link) => !/^(https?:|#)/.test(link))).toEqual([]);
  });
});
