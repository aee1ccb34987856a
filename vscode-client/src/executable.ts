/** Finding the server's executable before it is started, so that a missing one is one clear
 * message rather than a failed spawn. No `vscode` import. */

import * as fs from 'fs';
import * as path from 'path';

export interface ResolveContext {
  env: Readonly<Record<string, string | undefined>>;
  platform: NodeJS.Platform;
  /** The user's home directory, for `~` and `${userHome}`. */
  home?: string;
  /** The first workspace folder, for `${workspaceFolder}` and relative paths. */
  workspaceFolder?: string;
  /** Whether `file` is an executable file. */
  isExecutable(file: string): boolean;
}

/** `optiml.server.path` with `~`, `${userHome}` and `${workspaceFolder}` expanded. */
export function expandCommand(command: string, ctx: ResolveContext): string {
  let out = command.trim();
  if (ctx.home !== undefined) {
    out = out.replace(/\$\{userHome\}/g, ctx.home);
    if (out === '~' || out.startsWith('~/') || out.startsWith('~\\')) {
      out = ctx.home + out.slice(1);
    }
  }
  if (ctx.workspaceFolder !== undefined) {
    out = out.replace(/\$\{workspaceFolder\}/g, ctx.workspaceFolder);
  }
  return out;
}

/** The executable that `command` names: a path (absolute, or relative to the workspace folder)
 * if it has a separator, else the first match on PATH (with PATHEXT on Windows). Undefined if
 * there is none. */
export function resolveExecutable(command: string, ctx: ResolveContext): string | undefined {
  const p = ctx.platform === 'win32' ? path.win32 : path.posix;
  const expanded = expandCommand(command, ctx);
  if (expanded === '' || expanded.includes('${')) {
    return undefined;
  }
  const hasSeparator =
    expanded.includes('/') || (ctx.platform === 'win32' && expanded.includes('\\'));
  if (hasSeparator) {
    if (!p.isAbsolute(expanded) && ctx.workspaceFolder === undefined) {
      return undefined;
    }
    const file = p.isAbsolute(expanded)
      ? expanded
      : p.join(ctx.workspaceFolder as string, expanded);
    return candidates(file, ctx).find((c) => ctx.isExecutable(c));
  }
  const search = (ctx.platform === 'win32' ? (ctx.env.Path ?? ctx.env.PATH) : ctx.env.PATH) ?? '';
  for (const dir of search.split(p.delimiter)) {
    if (dir === '') {
      continue;
    }
    const found = candidates(p.join(dir, expanded), ctx).find((c) => ctx.isExecutable(c));
    if (found !== undefined) {
      return found;
    }
  }
  return undefined;
}

function candidates(file: string, ctx: ResolveContext): string[] {
  if (ctx.platform !== 'win32' || path.win32.extname(file) !== '') {
    return [file];
  }
  const exts = (ctx.env.PATHEXT ?? '.COM;.EXE;.BAT;.CMD').split(';').filter((e) => e !== '');
  return [file, ...exts.map((e) => file + e.toLowerCase())];
}

/** The message for a command that was not found, naming the setting that fixes it. */
export function notFoundMessage(command: string): string {
  const bare = !command.includes('/') && !command.includes('\\');
  const where = bare ? `on PATH` : `at that path`;
  return (
    `OptiML: the language server \`${command}\` was not found ${where}. ` +
    `Install OptiML (\`python3 -m pip install -e .\` in its repository) where the editor finds it, or set ` +
    `\`optiml.server.path\` to the \`optiml\` executable (for example \${workspaceFolder}/.venv/bin/optiml).`
  );
}

/** Whether `file` is a file this process may execute (on Windows: any file). */
export function isExecutableFile(file: string): boolean {
  try {
    if (!fs.statSync(file).isFile()) {
      return false;
    }
    if (process.platform !== 'win32') {
      fs.accessSync(file, fs.constants.X_OK);
    }
    return true;
  } catch {
    return false;
  }
}
