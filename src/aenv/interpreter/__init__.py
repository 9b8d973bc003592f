"""The code-interpreter server: E2B's `code-interpreter-v1` protocol over Jupyter kernels.

It runs inside a sandbox of the `code-interpreter-v1` template on port 49999 and answers the
official `e2b-code-interpreter` SDKs (`POST /execute`, `/contexts`, `GET /health`). It ships
inside the sandbox and runs under the template's own python3 with only the standard library,
starlette, uvicorn and jupyter_client installed, so it imports nothing else of aenv (an
import-linter contract keeps it so). docs/interpreter.md describes it.

Modules, one job each:
    app.py          the HTTP routes and their status codes
    streaming.py    the NDJSON response that notices a client going away
    contexts.py     the registry of contexts (id → kernel, language, cwd)
    kernel.py       one Jupyter kernel: start, execute, interrupt, restart, stop
    execution.py    one cell's lines, in order, and abandoning it
    envvars.py      per-call environment variables as code in each kernel's language
    results.py      Jupyter messages → the SDK's output lines
    languages.py    language names → kernelspecs
    charts.py       a matplotlib Figure → the SDK's chart dict (runs inside Python kernels)
    ipython_startup.py  the startup file Python kernels run: registers the chart formatter
"""

DEFAULT_PORT = 49999
