// E2B's own JS SDK tests of networking, workload identity (iam), sandbox hosts and secrets,
// ported case by case to run with the official `e2b` package against an aenv node:
//
//   network/          packages/js-sdk/tests/sandbox/network.test.ts
//   networkTransform/ packages/js-sdk/tests/sandbox/networkTransform.test.ts
//   iam/              packages/js-sdk/tests/sandbox/iam.test.ts
//   host/             packages/js-sdk/tests/sandbox/host.test.ts
//   secret/           packages/js-sdk/tests/secret/secret.test.ts
//
// Run by tests/server/test_e2b_js_network_suite.py, which stands up the node, a local stand-in
// for the internet (tests/network/egress_world.py) and the node's HTTPS listener, and passes
// them in the environment:
//
//   E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY, E2B_DOMAIN   the node (harness.client_env)
//   AENV_JS_PUBLIC         JSON {address: status}: the public addresses stood up locally
//                          (1.1.1.1 → 301, 8.8.8.8 → 302); without it the cases that reach
//                          them are skipped (never the real internet)
//   AENV_JS_WORLD_CA       the stand-ins' CA (PEM path), put in each such sandbox's trust
//   AENV_JS_AUTHORIZATIONS the file the world's servers log Authorization headers to
//   AENV_JS_TLS_PORT, AENV_JS_TLS_CA   the node's HTTPS listener for https://<getHost> (the
//                          test resolves *.<domain>:443 to it) and the CA of its certificate
//
// Where theirs mock the API (msw) and inspect the request body, here a recorder in front of
// the node keeps the body on its way to the real node, which then has to accept it. Cases
// that only exercise the SDK's own validation send nothing (checked).
//
// `node network_suite.mjs [prefix...]` runs the cases whose names start with a prefix.
// The last stdout line is {"ok": bool, "cases": {name: "pass" | "fail: …" | "skip: …" |
// "xfail: …"}}.

import assert from 'node:assert/strict'
import crypto from 'node:crypto'
import fs from 'node:fs'
import http from 'node:http'
import https from 'node:https'

import {
  CommandExitError,
  InvalidArgumentError,
  Sandbox,
  Secret,
  SecretNotFoundError,
} from 'e2b'

const env = process.env
const PUBLIC = env.AENV_JS_PUBLIC ? JSON.parse(env.AENV_JS_PUBLIC) : null
const WORLD_CA = env.AENV_JS_WORLD_CA ? fs.readFileSync(env.AENV_JS_WORLD_CA, 'utf8') : null
const AUTHORIZATIONS = env.AENV_JS_AUTHORIZATIONS
const TLS_PORT = env.AENV_JS_TLS_PORT ? Number(env.AENV_JS_TLS_PORT) : null
const TLS_CA = env.AENV_JS_TLS_CA ? fs.readFileSync(env.AENV_JS_TLS_CA) : null
const API_URL = env.E2B_API_URL
const CASE_TIMEOUT_MS = 120_000

/** Cases known to fail against aenv for a server-side reason: name → reason. */
const XFAIL = {}

// -- the harness --------------------------------------------------------------------------

class Skip extends Error {}

const cases = []
function test(name, fn) {
  cases.push([name, fn])
}

/** What the SDK sent: the last create and network-update bodies (parsed JSON). On Node the
 * SDK talks to the API with its own undici fetch, so the spy is a transparent recorder in front
 * of the node (E2B_API_URL points the SDK at it; everything is forwarded as is). */
const wire = { create: undefined, update: undefined }

async function startRecorder(target) {
  const upstream = new URL(target)
  const server = http.createServer((req, res) => {
    const chunks = []
    req.on('data', (c) => chunks.push(c))
    req.on('end', () => {
      const body = Buffer.concat(chunks)
      const path = new URL(req.url, 'http://x').pathname
      // 2.51.0 creates with POST /v2/sandboxes; the mocks of theirs answer /sandboxes
      if (req.method === 'POST' && /^(\/v2)?\/sandboxes$/.test(path)) wire.create = JSON.parse(body.toString())
      if (req.method === 'PUT' && /^\/sandboxes\/[^/]+\/network$/.test(path)) {
        wire.update = JSON.parse(body.toString())
      }
      const headers = { ...req.headers, host: upstream.host }
      const forward = http.request({ hostname: upstream.hostname, port: upstream.port,
        method: req.method, path: req.url, headers }, (answer) => {
        res.writeHead(answer.statusCode, answer.headers)
        answer.pipe(res)
      })
      forward.on('error', (err) => res.destroy(err))
      forward.end(body)
    })
  })
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve))
  server.unref()
  return `http://127.0.0.1:${server.address().port}`
}

/** Sandboxes a case made, killed when it ends. */
let made = []

async function create(template, opts = {}) {
  if (typeof template !== 'string') {
    opts = template ?? {}
    template = 'base'
  }
  const sbx = await Sandbox.create(template, { timeoutMs: 120_000, ...opts })
  made.push(sbx)
  return sbx
}

/** A sandbox that trusts the world's CA, as a public CA is trusted in an image. */
async function createTrusting(opts = {}) {
  if (!PUBLIC || !WORLD_CA) throw new Skip('no local stand-ins for the public addresses (AENV_JS_PUBLIC)')
  const sbx = await create(opts)
  await sbx.files.write('/tmp/world-ca.pem', WORLD_CA)
  await sbx.commands.run('cat /tmp/world-ca.pem >> /etc/ssl/certs/ca-certificates.crt', { user: 'root' })
  return sbx
}

function status(address) {
  assert.ok(PUBLIC && address in PUBLIC, `${address} is not stood up locally`)
  return String(PUBLIC[address])
}

async function httpCode(sbx, address) {
  const result = await sbx.commands.run(`curl -s -o /dev/null -w '%{http_code}' https://${address}`)
  assert.equal(result.exitCode, 0)
  return result.stdout.trim()
}

async function refused(sbx, address) {
  await assert.rejects(
    sbx.commands.run(`curl --connect-timeout 3 --max-time 5 -Is https://${address}`),
    CommandExitError,
    `${address} was reachable`
  )
}

/** Rejected by the SDK itself: the error matches and nothing reached the API. */
async function rejectedLocally(promise, matcher) {
  wire.create = wire.update = undefined
  await assert.rejects(promise, matcher)
  assert.equal(wire.create, undefined, 'a create request was sent')
  assert.equal(wire.update, undefined, 'an update request was sent')
}

function needTls() {
  if (!TLS_PORT || !TLS_CA) throw new Skip('no HTTPS listener for https://<getHost> (AENV_JS_TLS_PORT)')
}

/** GET https://<host>/ as a client that resolves *.<domain>:443 to the node's HTTPS listener
 * (the deployment's DNS record) and checks its certificate against the test CA. */
function httpsGet(host, headers = {}, timeoutMs = 5000) {
  needTls()
  return new Promise((resolve, reject) => {
    const req = https.request(
      { hostname: '127.0.0.1', port: TLS_PORT, servername: host, ca: TLS_CA, path: '/',
        method: 'GET', headers: { host, ...headers }, timeout: timeoutMs },
      (res) => {
        const chunks = []
        res.on('data', (c) => chunks.push(c))
        res.on('end', () => resolve({ status: res.statusCode, text: Buffer.concat(chunks).toString() }))
        res.on('error', reject)
      }
    )
    req.on('timeout', () => req.destroy(new Error(`GET https://${host} timed out`)))
    req.on('error', reject)
    req.end()
  })
}

async function waitForStatus(host, want, headers = {}, seconds = 15) {
  const deadline = Date.now() + seconds * 1000
  for (;;) {
    let got
    try {
      got = await httpsGet(host, headers)
    } catch (err) {
      got = { status: String(err) }
    }
    if (got.status === want || Date.now() > deadline) return got
    await sleep(500)
  }
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

/** Authorization headers the world's servers were sent since `from` (a line count). */
function authorizationsSince(from) {
  assert.ok(AUTHORIZATIONS, 'AENV_JS_AUTHORIZATIONS is not set')
  return fs.readFileSync(AUTHORIZATIONS, 'utf8').split('\n').filter(Boolean).slice(from)
}

/** Verify a JWT-SVID with the keys the node publishes, as a relying party would. */
async function verifyToken(token, audience, sandboxId) {
  const jwks = await (await fetch(`${API_URL}/.well-known/jwks.json`)).json()
  const discovery = await (await fetch(`${API_URL}/.well-known/openid-configuration`)).json()
  const [h, p, s] = token.split('.')
  const header = JSON.parse(Buffer.from(h, 'base64url'))
  assert.equal(header.alg, 'ES256')
  const jwk = jwks.keys.find((k) => k.kid === header.kid)
  assert.ok(jwk, `no published key ${header.kid}`)
  const key = crypto.createPublicKey({ key: jwk, format: 'jwk' })
  const valid = crypto.verify('sha256', Buffer.from(`${h}.${p}`), { key, dsaEncoding: 'ieee-p1363' },
    Buffer.from(s, 'base64url'))
  assert.ok(valid, 'the token signature does not verify')
  const claims = JSON.parse(Buffer.from(p, 'base64url'))
  const audiences = Array.isArray(claims.aud) ? claims.aud : [claims.aud]
  assert.ok(audiences.includes(audience), `aud ${JSON.stringify(claims.aud)}`)
  assert.equal(claims.iss, discovery.issuer)
  assert.ok(String(claims.sub).endsWith(`/sandbox/${sandboxId}`), `sub ${claims.sub}`)
  assert.ok(claims.exp * 1000 > Date.now() && claims.exp - claims.iat <= 300, JSON.stringify(claims))
  return claims
}

// -- network.test.ts ----------------------------------------------------------------------

test('network/allow specific IP with deny all traffic', async () => {
  const sbx = await createTrusting({
    network: { denyOut: ({ allTraffic }) => [allTraffic], allowOut: ['1.1.1.1'] },
  })
  assert.equal(await httpCode(sbx, '1.1.1.1'), status('1.1.1.1'))
  await refused(sbx, '8.8.8.8')
})

test('network/deny specific IP address', async () => {
  const sbx = await createTrusting({ network: { denyOut: ['8.8.8.8'] } })
  await refused(sbx, '8.8.8.8')
  assert.equal(await httpCode(sbx, '1.1.1.1'), status('1.1.1.1'))
})

test('network/deny all traffic using allTraffic selector', async () => {
  const sbx = await createTrusting({ network: { denyOut: ({ allTraffic }) => [allTraffic] } })
  await refused(sbx, '1.1.1.1')
  await refused(sbx, '8.8.8.8')
})

test('network/allow takes precedence over deny', async () => {
  const sbx = await createTrusting({
    network: { denyOut: ({ allTraffic }) => [allTraffic], allowOut: ['1.1.1.1', '8.8.8.8'] },
  })
  assert.equal(await httpCode(sbx, '1.1.1.1'), status('1.1.1.1'))
  assert.equal(await httpCode(sbx, '8.8.8.8'), status('8.8.8.8'))
})

test('network/allowPublicTraffic=false: sandbox requires traffic access token', async () => {
  needTls()
  const sbx = await create({ network: { allowPublicTraffic: false } })
  assert.ok(sbx.trafficAccessToken, 'no traffic access token')
  await sbx.commands.run('python3 -m http.server 8080', { background: true })
  const host = sbx.getHost(8080)
  const token = { 'e2b-traffic-access-token': sbx.trafficAccessToken }
  // Ready once the token gets through; then: without it 403, with it 200.
  assert.equal((await waitForStatus(host, 200, token)).status, 200)
  assert.equal((await httpsGet(host)).status, 403)
  assert.equal((await httpsGet(host, token)).status, 200)
})

test('network/allowPublicTraffic=true: sandbox works without token', async () => {
  needTls()
  const sbx = await create({ network: { allowPublicTraffic: true } })
  await sbx.commands.run('python3 -m http.server 8080', { background: true })
  assert.equal((await waitForStatus(sbx.getHost(8080), 200)).status, 200)
})

test('network/firewall transform injects headers', async () => {
  // Theirs send to a second sandbox's public HTTPS host running httpbin, which reflects the
  // header. Here the target is the world's allowed.test over HTTPS (the node ends that TLS
  // with its CA, as E2B's proxy does), which answers a digest of the X-Api-Key it got.
  const value = 'e2b-transform-value-123'
  const sbx = await createTrusting({
    network: { rules: { 'allowed.test': [{ transform: { headers: { 'X-Api-Key': value } } }] } },
  })
  const result = await sbx.commands.run(
    'curl -sS --retry 5 --retry-connrefused --max-time 10 https://allowed.test/headers')
  assert.equal(result.exitCode, 0)
  const digest = crypto.createHash('sha256').update(value).digest('hex').slice(0, 16)
  assert.equal(result.stdout, `A allowed.test key=${digest}`)
})

test('network/updateNetwork denies a previously reachable IP after update', async () => {
  const sbx = await createTrusting()
  assert.equal(await httpCode(sbx, '8.8.8.8'), status('8.8.8.8'))
  await sbx.updateNetwork({ denyOut: ['8.8.8.8'] })
  await refused(sbx, '8.8.8.8')
  assert.equal(await httpCode(sbx, '1.1.1.1'), status('1.1.1.1'))
})

test('network/updateNetwork omitting fields replaces all egress rules', async () => {
  const sbx = await createTrusting({
    network: { denyOut: ({ allTraffic }) => [allTraffic], allowOut: ['1.1.1.1'] },
  })
  await refused(sbx, '8.8.8.8')
  await sbx.updateNetwork({})
  assert.equal(await httpCode(sbx, '1.1.1.1'), status('1.1.1.1'))
  assert.equal(await httpCode(sbx, '8.8.8.8'), status('8.8.8.8'))
})

test('network/maskRequestHost modifies Host header correctly', async () => {
  needTls()
  const sbx = await create({ network: { maskRequestHost: 'custom-host.example.com:${PORT}' } })
  const output = '/tmp/headers.txt'
  await sbx.commands.run(`python3 -c "
import http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        with open('${output}', 'w') as f:
            for k, v in self.headers.items():
                f.write(k + ': ' + v + chr(10))
        self.send_response(200)
        self.end_headers()
    def log_message(self, *a): pass
http.server.HTTPServer(('', 8080), H).handle_request()
"`, { background: true })
  await waitForStatus(sbx.getHost(8080), 200)
  const seen = (await sbx.commands.run(`cat ${output}`)).stdout
  assert.ok(seen.includes('Host: custom-host.example.com:8080'), seen)
})

// -- networkTransform.test.ts -------------------------------------------------------------

const awsToken = Secret.iamToken({ audience: 'sts.amazonaws.com', tokenType: 'JWT-SVID' })
const HOST = 'api.internal.example.com'
const bearer = (name) => ({ iam }) => ({ headers: { Authorization: `Bearer ${iam.tokens[name]}` } })

test('networkTransform/transform callback resolves an iam token to its placeholder', async () => {
  // On allowed.test rather than their api.internal.example.com: the node then really mints the
  // token for the placeholder, and the world's server receives it (checked with the node's keys).
  const before = authorizationsSince(0).length
  const sbx = await createTrusting({
    iam: { tokens: { aws: awsToken } },
    network: {
      allowOut: ({ rules }) => [...rules.keys()],
      rules: { 'allowed.test': [{ transform: bearer('aws') }] },
    },
  })
  assert.deepEqual(wire.create.network, {
    allowOut: ['allowed.test'],
    rules: { 'allowed.test': [{ transform: { headers: {
      Authorization: 'Bearer ${e2b.identity.tokens.aws}' } } }] },
  })
  const got = await sbx.commands.run('curl -sS --max-time 10 https://allowed.test/')
  assert.equal(got.stdout, 'A allowed.test authorized')
  const sent = authorizationsSince(before)
  assert.equal(sent.length, 1, JSON.stringify(sent))
  assert.ok(sent[0].startsWith('Bearer ') && !sent[0].includes('${'), sent[0])
  const token = sent[0].slice('Bearer '.length)
  await verifyToken(token, 'sts.amazonaws.com', sbx.sandboxId)
  const inside = await sbx.commands.run('env; cat /proc/*/environ 2>/dev/null || true')
  assert.ok(!inside.stdout.includes(token), 'the token is visible inside the sandbox')
})

test('networkTransform/transform callback sees every registered iam token', async () => {
  await create({
    iam: { tokens: { aws: awsToken, gcp: awsToken } },
    network: { rules: { [HOST]: [{ transform: ({ iam }) => ({ headers: {
      'X-Tokens': Object.keys(iam.tokens).join(','),
      'X-Has-Aws': String('aws' in iam.tokens),
      'X-Has-Gh': String('gh' in iam.tokens),
      'X-Has-Ctor': String('constructor' in iam.tokens),
      'X-Json': JSON.stringify(iam.tokens),
    } }) }] } },
  })
  assert.deepEqual(wire.create.network.rules[HOST][0].transform.headers, {
    'X-Tokens': 'aws,gcp',
    'X-Has-Aws': 'true',
    'X-Has-Gh': 'false',
    'X-Has-Ctor': 'false',
    'X-Json': JSON.stringify({ aws: '${e2b.identity.tokens.aws}', gcp: '${e2b.identity.tokens.gcp}' }),
  })
})

test('networkTransform/a static transform is still sent unchanged', async () => {
  const rules = { 'api.openai.com': [{ transform: { headers: { Authorization: 'Bearer static' } } }] }
  await create({ network: { rules } })
  assert.deepEqual(wire.create.network.rules, rules)
})

test('networkTransform/transform callback rejects an unregistered iam token', async () => {
  await rejectedLocally(create({
    iam: { tokens: { aws: awsToken } },
    network: { rules: { [HOST]: [{ transform: bearer('awz') }] } },
  }), (err) => err instanceof InvalidArgumentError && /iam token 'awz'.*Registered tokens: 'aws'/s.test(err.message))
})

const notRegistered = (name) => (err) =>
  err instanceof InvalidArgumentError && err.message.includes(`iam token '${name}', which is not registered`)

for (const name of ['constructor', '__proto__', 'hasOwnProperty']) {
  test(`networkTransform/transform callback rejects an unregistered iam token named ${name}`, async () => {
    await rejectedLocally(create({
      iam: { tokens: { aws: awsToken } },
      network: { rules: { [HOST]: [{ transform: bearer(name) }] } },
    }), notRegistered(name))
  })
}

const PROBED = ['toJSON', 'then', 'toString', 'valueOf']

for (const name of PROBED) {
  test(`networkTransform/transform callback rejects the runtime-probed iam token name ${name}`, async () => {
    await rejectedLocally(create({
      iam: { tokens: { aws: awsToken } },
      network: { rules: { [HOST]: [{ transform: bearer(name) }] } },
    }), notRegistered(name))
  })
}

for (const name of PROBED) {
  test(`networkTransform/transform callback rejects the uncoerced runtime-probed iam token name ${name}`, async () => {
    await rejectedLocally(create({
      iam: { tokens: { aws: awsToken } },
      network: { rules: { [HOST]: [{ transform: ({ iam }) => ({ headers: { 'X-Api-Key': iam.tokens[name] } }) }] } },
    }), notRegistered(name))
  })
}

test('networkTransform/transform callback cannot reach an unguarded token map through valueOf', async () => {
  await rejectedLocally(create({
    iam: { tokens: { aws: awsToken } },
    network: { rules: { [HOST]: [{ transform: ({ iam }) => ({ headers: {
      Authorization: `Bearer ${iam.tokens.valueOf().gcp}` } }) }] } },
  }), notRegistered('gcp'))
})

test('networkTransform/transform callback rejects an iam token when no iam config is set', async () => {
  await rejectedLocally(create({
    network: { rules: { [HOST]: [{ transform: bearer('aws') }] } },
  }), InvalidArgumentError)
})

for (const [kind, transform] of [
  ['undefined', () => undefined],
  ['string', () => 'headers'],
  ['array', () => [{ headers: {} }]],
  ['Map', () => new Map([['headers', {}]])],
]) {
  test(`networkTransform/transform callback returning a ${kind} is rejected`, async () => {
    await rejectedLocally(create({ network: { rules: { [HOST]: [{ transform }] } } }),
      /must return a transform object, got (undefined|string|array|Map)/)
  })
}

test('networkTransform/async transform callback is rejected', async () => {
  await rejectedLocally(create({ network: { rules: { [HOST]: [{
    transform: async () => ({ headers: { Authorization: 'Bearer late' } }) }] } } }),
  /must be synchronous/)
})

test('networkTransform/an explicit null transform sends an empty rule', async () => {
  await create({ network: { rules: { [HOST]: [{ transform: null }] } } })
  assert.deepEqual(wire.create.network.rules, { [HOST]: [{}] })
})

for (const [name, what] of [
  ['a}b', 'closing brace'],
  ['a{b', 'opening brace'],
  ['aws}${e2b.identity.tokens.gcp', 'smuggled placeholder'],
  ['a\nb', 'control character'],
  ['', 'empty'],
]) {
  test(`networkTransform/an iam token name with a ${what} is rejected`, async () => {
    await rejectedLocally(create({ iam: { tokens: { [name]: awsToken } } }), /is not usable/)
    // The update path takes any name from the callback and checks it where it interpolates.
    await rejectedLocally(Sandbox.updateNetwork('test-sandbox-id', {
      rules: { [HOST]: [{ transform: bearer(name) }] },
    }), /is not usable/)
  })
}

test('networkTransform/an ordinary iam token name is accepted', async () => {
  await create({
    iam: { tokens: { 'aws.prod-1_x': awsToken } },
    network: { rules: { [HOST]: [{ transform: bearer('aws.prod-1_x') }] } },
  })
  assert.deepEqual(wire.create.network.rules[HOST][0].transform.headers, {
    Authorization: 'Bearer ${e2b.identity.tokens.aws.prod-1_x}',
  })
})

test('networkTransform/updateNetwork resolves transform callbacks without an iam config', async () => {
  // A real sandbox with the token registered at create; the update (which carries no iam
  // config) names it, and the node mints it for allowed.test from then on.
  const sbx = await createTrusting({ iam: { tokens: { aws: awsToken } } })
  const before = authorizationsSince(0).length
  await Sandbox.updateNetwork(sbx.sandboxId, {
    allowOut: ({ rules }) => [...rules.keys()],
    rules: { 'allowed.test': [{ transform: bearer('aws') }] },
  })
  assert.deepEqual(wire.update, {
    allowOut: ['allowed.test'],
    rules: { 'allowed.test': [{ transform: { headers: {
      Authorization: 'Bearer ${e2b.identity.tokens.aws}' } } }] },
  })
  const got = await sbx.commands.run('curl -sS --max-time 10 https://allowed.test/')
  assert.equal(got.stdout, 'A allowed.test authorized')
  const sent = authorizationsSince(before)
  assert.equal(sent.length, 1, JSON.stringify(sent))
  await verifyToken(sent[0].slice('Bearer '.length), 'sts.amazonaws.com', sbx.sandboxId)
})

// -- iam.test.ts --------------------------------------------------------------------------

const AWS_WIRE = { tokens: { aws: { audience: 'sts.amazonaws.com', tokenType: 'JWT-SVID' } } }

test('iam/Sandbox.create sends iam tokens in the request body', async () => {
  await create({ iam: { tokens: { aws: { audience: 'sts.amazonaws.com', tokenType: 'JWT-SVID' } } } })
  assert.deepEqual(wire.create.iam, AWS_WIRE)
})

test('iam/Sandbox.create sends Secret.iamToken tokens in the request body', async () => {
  await create({ iam: { tokens: { aws: awsToken } } })
  assert.deepEqual(wire.create.iam, AWS_WIRE)
})

test('iam/Sandbox.create omits iam from the request body when not provided', async () => {
  wire.create = undefined
  await create()
  assert.ok(wire.create, 'no create body')
  assert.ok(!('iam' in wire.create), JSON.stringify(wire.create))
})

test('iam/Sandbox.create omits an empty iam config from the request body', async () => {
  for (const iam of [{}, { tokens: {} }]) {
    wire.create = undefined
    await create({ iam })
    assert.ok(wire.create, 'no create body')
    assert.ok(!('iam' in wire.create), JSON.stringify(wire.create))
  }
})

test('iam/Sandbox.create treats a tokens map with only undefined values as empty', async () => {
  wire.create = undefined
  await create({ iam: { tokens: { aws: undefined } } })
  assert.ok(wire.create, 'no create body')
  assert.ok(!('iam' in wire.create), JSON.stringify(wire.create))
})

test('iam/Sandbox.create strips unknown token properties from the request body', async () => {
  await create({ iam: { tokens: { aws: {
    audience: 'sts.amazonaws.com', tokenType: 'JWT-SVID', filePath: '/run/token' } } } })
  assert.deepEqual(wire.create.iam, AWS_WIRE)
})

test('iam/Sandbox.create rejects a token missing audience or tokenType', async () => {
  await rejectedLocally(create({ iam: { tokens: { aws: { audience: 'sts.amazonaws.com' } } } }),
    InvalidArgumentError)
})

/** The token map a transform callback is handed (theirs import the SDK's internal
 * `iamTokenPlaceholders`; here it is caught in a callback, whose invalid return then stops
 * the request in the SDK). `update`: the unchecked map of the update path. */
async function tokenMap({ update = false } = {}) {
  let tokens
  const rules = { [HOST]: [{ transform: ({ iam }) => { tokens = iam.tokens; return undefined } }] }
  const call = update
    ? Sandbox.updateNetwork('test-sandbox-id', { rules })
    : Sandbox.create('base', { iam: { tokens: { aws: awsToken } }, network: { rules } })
  await rejectedLocally(call, /must return a transform object/)
  assert.ok(tokens, 'the callback was not called')
  return tokens
}

test('iam/the token map serializes, awaits and coerces like a plain object', async () => {
  const tokens = await tokenMap()
  assert.equal(JSON.stringify(tokens), '{"aws":"${e2b.identity.tokens.aws}"}')
  assert.equal(String(tokens), '[object Object]')
  assert.equal(`${tokens}`, '[object Object]')
  assert.deepEqual({ ...tokens }, { aws: '${e2b.identity.tokens.aws}' })
  assert.equal(await tokens, tokens)
})

for (const prop of PROBED) {
  test(`iam/reading the unregistered token ${prop} throws instead of resolving`, async () => {
    const tokens = await tokenMap()
    assert.throws(() => `${tokens[prop]}`, notRegistered(prop))
    assert.throws(() => String(tokens[prop]), InvalidArgumentError)
    assert.throws(() => JSON.stringify({ header: tokens[prop] }), InvalidArgumentError)
  })
}

test('iam/the runtime-probed valueOf answers with the guarded map', async () => {
  const tokens = await tokenMap()
  assert.equal(tokens.valueOf().aws, '${e2b.identity.tokens.aws}')
  assert.throws(() => `${tokens.valueOf().gcp}`, /iam token 'gcp'.*Registered tokens: 'aws'/s)
})

for (const prop of PROBED) {
  test(`iam/the unchecked token map resolves ${prop} to its placeholder`, async () => {
    const tokens = await tokenMap({ update: true })
    assert.equal(`${tokens[prop]}`, `\${e2b.identity.tokens.${prop}}`)
    assert.equal(JSON.stringify(tokens), '{}')
    assert.equal(String(tokens), '[object Object]')
  })
}

// -- host.test.ts -------------------------------------------------------------------------

test('host/ping server in running sandbox', async () => {
  needTls()
  const sbx = await create()
  const cmd = await sbx.commands.run('python -m http.server 8000', { background: true })
  cmd.wait().catch(() => {}) // killed at the end: its exit is no failure
  try {
    const host = sbx.getHost(8000)
    assert.equal((await waitForStatus(host, 200, {}, 12)).status, 200)
  } finally {
    await cmd.kill().catch(() => {})
  }
})

test('host/ping server in non-running sandbox', async () => {
  needTls()
  const sbx = await create()
  const host = sbx.getHost(3000)
  await sbx.kill()
  const res = await httpsGet(host)
  assert.equal(res.status, 502)
  const body = JSON.parse(res.text)
  assert.equal(body.message, 'The sandbox was not found')
  assert.ok(sbx.sandboxId.startsWith(body.sandboxId), JSON.stringify(body))
  assert.equal(body.code, 502)
})

// -- secret.test.ts -----------------------------------------------------------------------

/** Theirs clear an in-memory store after each case; here the node's secrets are destroyed. */
async function clearSecrets() {
  const paginator = Secret.list({ limit: 100 })
  while (paginator.hasNext) {
    for (const info of await paginator.nextItems()) await Secret.destroy(info.secretId)
  }
}

function secretTest(name, fn) {
  test(`secret/${name}`, async () => {
    await clearSecrets()
    try {
      await fn()
    } finally {
      await clearSecrets()
    }
  })
}

secretTest('should create a secret', async () => {
  const info = await Secret.create('openai-api-key', 'sk-test', { metadata: { env: 'test' } })
  assert.match(info.secretId, /^sec_/)
  assert.equal(info.name, 'openai-api-key')
  assert.equal(info.version, 1)
  assert.deepEqual(info.metadata, { env: 'test' })
  assert.ok(info.createdAt instanceof Date)
  assert.ok(info.updatedAt instanceof Date)
  assert.ok(!('value' in info), JSON.stringify(info))
})

secretTest('should update a secret', async () => {
  const created = await Secret.create('rotating-key', 'v1')
  const updated = await Secret.update(created.secretId, 'v2')
  assert.equal(updated.secretId, created.secretId)
  assert.equal(updated.version, 2)
})

secretTest('should throw when updating a non-existent secret', async () => {
  await assert.rejects(Secret.update('missing', 'value'), SecretNotFoundError)
})

secretTest('should get secret info by ID and by name', async () => {
  const created = await Secret.create('lookup-key', 'value')
  assert.equal((await Secret.getInfo(created.secretId)).name, 'lookup-key')
  assert.equal((await Secret.getInfo('lookup-key')).secretId, created.secretId)
})

secretTest('should throw when getting a non-existent secret', async () => {
  await assert.rejects(Secret.getInfo('missing'), SecretNotFoundError)
})

secretTest('should list secrets with pagination', async () => {
  for (const name of ['key-a', 'key-b', 'key-c']) await Secret.create(name, name.slice(-1))
  const paginator = Secret.list({ limit: 2 })
  assert.equal((await paginator.nextItems()).length, 2)
  assert.equal(paginator.hasNext, true)
  assert.equal((await paginator.nextItems()).length, 1)
  assert.equal(paginator.hasNext, false)
})

secretTest('should check secret existence', async () => {
  await Secret.create('present-key', 'value')
  assert.equal(await Secret.exists('present-key'), true)
  assert.equal(await Secret.exists('absent-key'), false)
})

secretTest('should destroy a secret', async () => {
  const created = await Secret.create('to-delete', 'value')
  assert.equal(await Secret.destroy(created.secretId), true)
  assert.equal(await Secret.exists(created.secretId), false)
})

secretTest('should return false when destroying a non-existent secret', async () => {
  assert.equal(await Secret.destroy('missing'), false)
})

test('secret/Secret.fill should format a placeholder', async () => {
  assert.equal(Secret.fill('openai-api-key'), '${e2b.secrets.openai-api-key}')
})

for (const name of ['', '{name', 'name}', 'name\n', 'name\x00']) {
  test(`secret/Secret.fill should throw InvalidArgumentError for invalid name ${JSON.stringify(name)}`, async () => {
    assert.throws(() => Secret.fill(name), InvalidArgumentError)
  })
}

// -- run ----------------------------------------------------------------------------------

function describe(err) {
  const text = err instanceof Error ? `${err.name}: ${err.message}` : String(err)
  return text.replace(/\s+/g, ' ').slice(0, 600)
}

async function main() {
  process.env.E2B_API_URL = await startRecorder(API_URL)
  const prefixes = process.argv.slice(2)
  const results = {}
  for (const [name, fn] of cases) {
    if (prefixes.length && !prefixes.some((p) => name.startsWith(p))) continue
    made = []
    wire.create = wire.update = undefined
    const started = Date.now()
    let outcome
    let timer
    try {
      await Promise.race([
        fn(),
        new Promise((_, reject) => {
          timer = setTimeout(() => reject(new Error(`timed out after ${CASE_TIMEOUT_MS} ms`)), CASE_TIMEOUT_MS)
        }),
      ])
      outcome = name in XFAIL ? `fail: passed, but is marked xfail (${XFAIL[name]})` : 'pass'
    } catch (err) {
      if (err instanceof Skip) outcome = `skip: ${err.message}`
      else if (name in XFAIL) outcome = `xfail: ${XFAIL[name]} (got ${describe(err)})`
      else outcome = `fail: ${describe(err)}`
    } finally {
      clearTimeout(timer)
      await Promise.allSettled(made.map((sbx) => sbx.kill()))
    }
    results[name] = outcome
    console.error(`${outcome.split(':')[0].padEnd(5)} ${((Date.now() - started) / 1000).toFixed(1)}s ${name}`)
  }
  const ok = Object.values(results).every((r) => !r.startsWith('fail'))
  console.log(JSON.stringify({ ok, cases: results }))
  process.exitCode = ok ? 0 : 1
}

main().catch((err) => {
  console.log(JSON.stringify({ ok: false, cases: {}, error: describe(err) }))
  process.exitCode = 1
})
