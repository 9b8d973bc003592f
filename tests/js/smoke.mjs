// Smoke test: the official E2B JS SDK (npm `e2b`, pinned in package.json) against aenv's envd.
//
// Run by tests/envd/test_js_sdk.py; by hand:
//   E2B_DEBUG=true E2B_SANDBOX_URL=http://127.0.0.1:<port> node smoke.mjs
//
// Debug mode makes `Sandbox.create()` a local no-op (sandboxId "debug_sandbox_id", envd version
// 99.99.99, no control-plane call). The JS SDK's ConnectionConfig reads `E2B_SANDBOX_URL` and,
// when it is set, uses it verbatim as the envd base URL for both the Connect transport
// (connect-web over undici) and the /files HTTP client, ahead of the debug default
// `http://localhost:49983`; so one env var points it at any port.
//
// The JS SDK differs from the Python one where it matters for a server: connect-web needs the
// EndStreamResponse frame and exact content types, sends stream requests as one envelope with a
// Content-Length, and watches directories with the streaming WatchDir RPC. Each check below
// exercises one of those paths. Prints one JSON summary on stdout; exits 1 if any check failed.

import { createRequire } from 'node:module'

import { CommandExitError, FileType, NotFoundError, Sandbox } from 'e2b'

const SDK_VERSION = createRequire(import.meta.url)('e2b/package.json').version

/** How long one check may take before it counts as hung (ms). */
const CHECK_TIMEOUT_MS = Number(process.env.SMOKE_CHECK_TIMEOUT_MS ?? 30_000)
/** Where the file checks work; the harness's sandbox has a writable /home/user. */
const DIR = `/home/user/js-smoke-${process.pid}`

const results = []

/** Rejects after `ms` so one hung stream cannot hang the whole run. */
function withTimeout(promise, ms, what) {
  let timer
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: timed out after ${ms} ms`)), ms)
  })
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer))
}

function assert(cond, message) {
  if (!cond) throw new Error(message)
}

/** `Name: message`, plus the underlying cause (undici puts ECONNREFUSED & co. there). */
function describe(err) {
  const text = `${err?.name ?? 'Error'}: ${err?.message ?? String(err)}`
  const cause = err?.cause
  return cause ? `${text} (cause: ${cause?.code ?? ''} ${cause?.message ?? String(cause)})` : text
}

/** Runs one check, records {name, ok, ms, detail | error}; never throws. */
async function check(name, fn) {
  const t0 = performance.now()
  try {
    const detail = await withTimeout(Promise.resolve().then(fn), CHECK_TIMEOUT_MS, name)
    results.push({ name, ok: true, ms: Math.round(performance.now() - t0), detail: detail ?? null })
  } catch (err) {
    results.push({
      name,
      ok: false,
      ms: Math.round(performance.now() - t0),
      error: describe(err),
    })
  }
}

/** Awaits `promise` expecting a rejection; returns the error (or throws if it resolved). */
async function rejection(promise, what) {
  try {
    const value = await promise
    throw new Error(`${what}: expected a rejection, got ${JSON.stringify(value)}`)
  } catch (err) {
    return err
  }
}

async function main() {
  const url = process.env.E2B_SANDBOX_URL
  if (!url || (process.env.E2B_DEBUG ?? '').toLowerCase() !== 'true') {
    console.error('set E2B_DEBUG=true and E2B_SANDBOX_URL=http://127.0.0.1:<envd port>')
    process.exit(2)
  }

  let sbx
  await check('create', async () => {
    sbx = await Sandbox.create()
    assert(sbx.sandboxId === 'debug_sandbox_id', `not in debug mode: sandboxId=${sbx.sandboxId}`)
    // Guards against silently testing whatever listens on localhost:49983 instead.
    assert(sbx.envdApiUrl === url, `SDK targets ${sbx.envdApiUrl}, expected ${url}`)
    return { sandboxId: sbx.sandboxId, envdApiUrl: sbx.envdApiUrl }
  })
  if (!sbx) return

  await check('run echo', async () => {
    const r = await sbx.commands.run('echo hello')
    assert(r.exitCode === 0, `exitCode ${r.exitCode}`)
    assert(r.stdout === 'hello\n', `stdout ${JSON.stringify(r.stdout)}`)
    assert(r.stderr === '', `stderr ${JSON.stringify(r.stderr)}`)
    return { stdout: r.stdout }
  })

  await check('non-zero exit -> CommandExitError', async () => {
    const err = await rejection(sbx.commands.run('echo oops >&2; exit 3'), 'exit 3')
    assert(err instanceof CommandExitError, `got ${err?.name}: ${err?.message}`)
    assert(err.exitCode === 3, `exitCode ${err.exitCode}`)
    assert(err.stderr === 'oops\n', `stderr ${JSON.stringify(err.stderr)}`)
    return { exitCode: err.exitCode, error: err.error ?? null }
  })

  await check('background command + kill', async () => {
    const handle = await sbx.commands.run('sleep 120', { background: true })
    assert(Number.isInteger(handle.pid) && handle.pid > 0, `pid ${handle.pid}`)
    const before = await sbx.commands.list()
    assert(before.some((p) => p.pid === handle.pid), `pid ${handle.pid} missing from list()`)
    assert((await handle.kill()) === true, 'kill() returned false for a running process')
    // SIGKILL ends the Start stream with an end event; wait() must settle (as an exit error).
    const err = await rejection(handle.wait(), 'wait after kill')
    assert(err instanceof CommandExitError, `wait after kill: ${err?.name}: ${err?.message}`)
    const after = await sbx.commands.list()
    assert(!after.some((p) => p.pid === handle.pid), `pid ${handle.pid} still listed after kill`)
    // Unary error path: SendSignal on a gone pid is not_found, which kill() maps to false.
    assert((await sbx.commands.kill(handle.pid)) === false, 'kill() of a dead pid returned true')
    return { pid: handle.pid, exitCode: err.exitCode, error: err.error ?? null }
  })

  await check('stream error: connect(999999) -> NotFoundError', async () => {
    // A server-stream error lives in the EndStreamResponse frame of an HTTP 200 response;
    // connect-web reports "missing EndStreamResponse" (code unknown) if it is absent, and
    // maps a non-200 stream status to `unimplemented`: only a proper frame yields NotFound.
    const err = await rejection(sbx.commands.connect(999999), 'connect(999999)')
    assert(err instanceof NotFoundError, `got ${err?.name}: ${err?.message}`)
    assert(!/EndStreamResponse/i.test(err.message), `frame not parsed: ${err.message}`)
    return { error: `${err.name}: ${err.message}` }
  })

  await check('files write/read/list', async () => {
    const text = 'hello from the JS SDK\n'
    const info = await sbx.files.write(`${DIR}/hello.txt`, text)
    assert(info.path === `${DIR}/hello.txt`, `write returned ${JSON.stringify(info)}`)
    assert((await sbx.files.read(`${DIR}/hello.txt`)) === text, 'read back a different text')
    // Binary round trip through the octet-stream upload (envd >= 0.5.7) and a bytes read.
    const bytes = new Uint8Array(256).map((_, i) => i)
    await sbx.files.write(`${DIR}/bytes.bin`, bytes.buffer, { useOctetStream: true })
    const back = await sbx.files.read(`${DIR}/bytes.bin`, { format: 'bytes' })
    assert(back.length === 256 && back.every((b, i) => b === i), 'bytes differ after round trip')
    const entries = await sbx.files.list(DIR)
    const names = entries.map((e) => e.name).sort()
    assert(JSON.stringify(names) === '["bytes.bin","hello.txt"]', `list: ${names}`)
    const hello = entries.find((e) => e.name === 'hello.txt')
    assert(hello.type === FileType.FILE, `type ${hello.type}`)
    assert(hello.size === text.length, `size ${hello.size}`)
    return { entries: names }
  })

  await check('watchDir receives an event', async () => {
    const watched = `${DIR}/watched`
    await sbx.files.makeDir(watched)
    let gotEvent
    const received = new Promise((resolve) => {
      gotEvent = resolve
    })
    const handle = await sbx.files.watchDir(watched, (event) => {
      if (event.name === 'new.txt') gotEvent(event)
    })
    try {
      await sbx.files.write(`${watched}/new.txt`, 'x')
      const event = await withTimeout(received, 10_000, 'no watch event for new.txt')
      return { name: event.name, type: event.type }
    } finally {
      await handle.stop()
    }
  })

  await check('cleanup', async () => {
    await sbx.files.remove(DIR)
  })
}

const started = performance.now()
try {
  await main()
} catch (err) {
  results.push({ name: 'main', ok: false, error: describe(err) })
}
const failed = results.filter((r) => !r.ok)
console.log(
  JSON.stringify(
    {
      ok: failed.length === 0 && results.length > 0,
      sdk: `e2b@${SDK_VERSION} (JS)`,
      node: process.version,
      envd: process.env.E2B_SANDBOX_URL ?? null,
      ms: Math.round(performance.now() - started),
      checks: results,
    },
    null,
    2,
  ),
)
for (const f of failed) console.error(`FAILED ${f.name}: ${f.error}`)
// Exit explicitly: a leaked keep-alive socket or stream must not keep node alive.
process.exit(failed.length === 0 && results.length > 0 ? 0 : 1)
