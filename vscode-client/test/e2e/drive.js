// Runs the bundled extension (dist/extension.js) with the real vscode-languageclient against a
// server, in plain Node with vscode-stub.js for the editor, and prints what happened as JSON.
//   node test/e2e/drive.js dist/extension.js SERVER_COMMAND (protocol|start)
// `protocol` drives the job and proposal protocol (fake_server.py speaks it); `start` only
// starts, restarts and stops the server.
'use strict';

const Module = require('module');
const path = require('path');

const [bundle, serverCommand, mode] = process.argv.slice(2);
const stub = require('./vscode-stub.js');
const recorded = stub.__recorded;
const SECRET = 'sk-e2e-not-a-real-key';
stub.__configure({
  'optiml.server.path': serverCommand,
  'optiml.arch': 'sm_80',
  'optiml.evaluations': 64,
  'optiml.policy': 'offline',
  'optiml.executor': 'local',
  'optiml.gpus': 'all',
  'optiml.trace.server': 'verbose',
});
const load = Module._load;
Module._load = function (request, ...rest) {
  return request === 'vscode' ? stub : load.call(this, request, ...rest);
};

const extension = require(path.resolve(bundle));
const context = {
  subscriptions: [],
  secrets: {
    get: async (name) => (name === 'optiml.apiKey.openai' ? SECRET : undefined),
    store: async () => {},
    delete: async () => {},
    onDidChange: () => ({ dispose() {} }),
  },
};
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
async function until(condition, what) {
  for (let i = 0; i < 100; i++) {
    if (condition()) return;
    await sleep(50);
  }
  throw new Error(`timed out waiting for ${what}`);
}
const run = (command, ...args) => recorded.commands.get(command)(...args);

async function main() {
  const out = {};
  const controller = extension.activate(context);
  await controller.settled();
  const client = controller.languageClient;
  out.state = controller.serverState;
  out.status = recorded.status.text;
  out.serverCommands = client.initializeResult.capabilities.executeCommandProvider?.commands ?? [];
  out.registered = [...recorded.commands.keys()].sort();
  if (mode === 'protocol') {
    out.compareResult = await run('optiml.compareProposal', { proposal: 'p1' });
    await run('optiml.openReport', { proposal: 'p1' });
    await run('optiml.optimize', { uri: 'file:///w/k.cu', version: 1, kernel: 'saxpy' });
    await until(() => recorded.progress.some((p) => p.options.cancellable), 'the job progress');
    const job = recorded.progress.find((p) => p.options.cancellable);
    out.jobProgress = { options: job.options, reports: job.reports };
    out.statusDuringJob = recorded.status.text;
    job.cancel();
    await until(() => job.finished, 'the job to end');
    out.statusAfterJob = recorded.status.text;
    await run('optiml.cancelJobs');
    out.serverSaw = await client.sendRequest('workspace/executeCommand', {
      command: 'fake.seen',
      arguments: [],
    });
  } else {
    await sleep(500); // the configuration round trips after `initialized`
    await run('optiml.restartServer');
    out.stateAfterRestart = controller.serverState;
  }
  await extension.deactivate();
  out.stateAfterStop = controller.serverState;
  const log = recorded.output.join('');
  out.keyInLog = log.includes(SECRET);
  out.keyVariablesLogged = /OPENAI_API_KEY/.test(log);
  out.configurationAnswers = [
    ...log.matchAll(/Sending response 'workspace\/configuration[^\n]*\nResult: (\[[\s\S]*?\n\])/g),
  ].map((m) => JSON.parse(m[1]));
  out.executed = recorded.executed;
  out.external = recorded.external;
  out.messages = recorded.messages;
  process.stdout.write(`${JSON.stringify(out)}\n`);
}

main().then(
  () => process.exit(0),
  (error) => {
    process.stderr.write(`${error && error.stack ? error.stack : error}\n`);
    process.stderr.write(recorded.output.join('').slice(-4000));
    process.exit(1);
  },
);
