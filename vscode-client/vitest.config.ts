import * as path from 'path';
import { defineConfig } from 'vitest/config';

export default defineConfig({
  resolve: {
    // VS Code provides `vscode` only inside the editor; the tests of modules that import it get
    // this stand-in.
    alias: { vscode: path.resolve(__dirname, 'test/vscode.ts') },
  },
  test: {
    include: ['test/**/*.test.ts'],
    environment: 'node',
  },
});
