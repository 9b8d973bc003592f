// The official E2B JS SDK against a running aenv node server (control plane + proxy + gVisor).
//
// Run by tests/server/test_js_server.py with E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY set
// to the server under test. Creates a sandbox, runs a command, writes and reads a file, lists,
// pauses and resumes it (a process keeps counting), snapshots it and creates from the snapshot,
// forks it, and kills it; prints one JSON summary and exits 1 on the first failure.

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

    // Memory survives pause/connect: a shell variable only the process remembers.
    await sbx.commands.run('n=41; while :; do n=$((n+1)); echo $n > /tmp/n.t; mv /tmp/n.t /tmp/n; sleep 0.1; done', {
      background: true,
    })
    await new Promise((r) => setTimeout(r, 400))
    if ((await sbx.pause()) !== true) throw new Error('pause did not return true')
    if (await sbx.isRunning()) throw new Error('running after pause')
    if ((await Sandbox.getInfo(sbx.sandboxId)).state !== 'paused') throw new Error('not paused')
    if ((await sbx.pause()) !== false) throw new Error('second pause was not false (409)')
    const resumed = await Sandbox.connect(sbx.sandboxId)
    const counted = Number((await resumed.commands.run('cat /tmp/n')).stdout)
    if (!(counted > 42)) throw new Error(`counter restarted after resume: ${counted}`)
    if ((await resumed.files.read('/home/user/js.txt')) !== 'written by js') throw new Error('file lost')
    summary.pauseResume = true

    const snap = await sbx.createSnapshot({ name: 'js-snap' })
    const fromSnap = await Sandbox.create(snap.snapshotId, { timeoutMs: 60_000 })
    try {
      if ((await fromSnap.files.read('/home/user/js.txt')) !== 'written by js') throw new Error('snapshot lost the file')
    } finally {
      await fromSnap.kill()
    }
    if ((await Sandbox.deleteSnapshot(snap.snapshotId)) !== true) throw new Error('delete snapshot')
    summary.snapshot = true

    const forks = await sbx.fork({ count: 2 })
    try {
      if (forks.length !== 2 || forks.some((f) => f instanceof Error)) throw new Error(`fork: ${forks}`)
      await forks[0].files.write('/home/user/only0.txt', 'x')
      if (await forks[1].files.exists('/home/user/only0.txt')) throw new Error('siblings share files')
      if ((await forks[1].files.read('/home/user/js.txt')) !== 'written by js') throw new Error('fork lost the file')
    } finally {
      for (const f of forks) if (!(f instanceof Error)) await f.kill()
    }
    summary.fork = true
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
