// The official E2B JS SDK against a running aenv node server (control plane + proxy + gVisor).
//
// Run by tests/server/test_js_server.py with E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY set
// to the server under test. Creates a sandbox, runs a command, writes and reads a file, lists,
// and kills it; prints one JSON summary and exits 1 on the first failure.

import { CommandExitError, Sandbox } from 'e2b'

const summary = {}

async function main() {
  const sbx = await Sandbox.create({ timeoutMs: 120_000, metadata: { from: 'js' } })
  summary.sandboxId = sbx.sandboxId
  try {
    const run = await sbx.commands.run('echo hello-from-js; id -un')
    if (run.stdout !== 'hello-from-js\nuser\n') throw new Error(`stdout was ${JSON.stringify(run.stdout)}`)
    summary.run = true

    try {
      await sbx.commands.run('exit 3')
      throw new Error('exit 3 did not throw')
    } catch (err) {
      if (!(err instanceof CommandExitError) || err.exitCode !== 3) throw err
    }
    summary.exitCode = true

    await sbx.files.write('/home/user/js.txt', 'written by js')
    const text = await sbx.files.read('/home/user/js.txt')
    if (text !== 'written by js') throw new Error(`read back ${JSON.stringify(text)}`)
    const entries = await sbx.files.list('/home/user')
    if (!entries.some((e) => e.name === 'js.txt')) throw new Error('js.txt not listed')
    summary.files = true

    const info = await Sandbox.getInfo(sbx.sandboxId)
    if (info.metadata.from !== 'js' || info.state !== 'running') throw new Error('bad info')
    summary.info = true
  } finally {
    summary.killed = await Sandbox.kill(sbx.sandboxId)
  }
  if (summary.killed !== true) throw new Error('kill returned false')
  if (await sbx.isRunning()) throw new Error('still running after kill')
  summary.notRunningAfterKill = true
  if ((await Sandbox.kill(sbx.sandboxId)) !== false) throw new Error('second kill was not false')
  summary.secondKillFalse = true
}

main().then(
  () => {
    console.log(JSON.stringify({ ok: true, ...summary }))
  },
  (err) => {
    console.log(JSON.stringify({ ok: false, error: `${err?.name}: ${err?.message}`, ...summary }))
    process.exit(1)
  },
)
