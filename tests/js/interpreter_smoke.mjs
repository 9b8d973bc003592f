// The official JS code-interpreter SDK (npm @e2b/code-interpreter) against a node that built
// the code-interpreter-v1 template. Run by tests/server/test_code_interpreter.py with
// E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY set to the node. Python state across cells, a
// pandas DataFrame's HTML, a matplotlib PNG, an error with its traceback, a JavaScript context,
// bash; prints one JSON summary and exits 1 on the first failure.

import { Sandbox } from '@e2b/code-interpreter'

const summary = {}

function expect(condition, what) {
  if (!condition) throw new Error(what)
}

async function main() {
  const sbx = await Sandbox.create({ timeoutMs: 300_000 })
  summary.sandboxId = sbx.sandboxId
  try {
    await sbx.runCode('x = 41')
    const next = await sbx.runCode('x + 1')
    expect(next.text === '42', `x + 1 was ${JSON.stringify(next.text)}`)
    summary.state = true

    const frame = await sbx.runCode("import pandas as pd\npd.DataFrame({'a': [1, 2]})")
    expect((frame.results[0]?.html ?? '').includes('<table'), 'no DataFrame HTML')
    summary.html = true

    const chart = await sbx.runCode(
      'import matplotlib.pyplot as plt\nplt.bar(["a", "b"], [1, 2]); plt.title("bars"); plt.show()')
    expect(chart.results.some((r) => r.png), 'no PNG')
    summary.png = true

    const failed = await sbx.runCode('raise ValueError("nope")')
    expect(failed.error?.name === 'ValueError' && failed.error.value === 'nope', 'bad error')
    expect(failed.error.traceback.includes('ValueError'), 'no traceback')
    summary.error = true

    const js = await sbx.createCodeContext({ language: 'js' })
    const sum = await sbx.runCode('[1, 2, 3].reduce((a, b) => a + b, 0)', { context: js })
    expect(sum.text === '6', `js sum was ${JSON.stringify(sum.text)}`)
    summary.javascript = true

    const out = []
    await sbx.runCode('echo from-bash', { language: 'bash', onStdout: (m) => out.push(m.line) })
    expect(out.join('').includes('from-bash'), `bash stdout ${JSON.stringify(out)}`)
    summary.bash = true
  } finally {
    await sbx.kill()
  }
  summary.ok = true
}

main()
  .catch((err) => {
    summary.ok = false
    summary.error = String(err && err.stack ? err.stack : err)
    process.exitCode = 1
  })
  .finally(() => console.log(JSON.stringify(summary)))
