"""``python -m bench.interpreter``: the code interpreter against the plain sandbox (issue 23).

On one node that built ``code-interpreter-v1`` itself, each row next to its plain-sandbox
equivalent in the same run, interleaved run by run:

- **first run_code after create**: ``Sandbox.create()`` of the code-interpreter SDK, then
  ``run_code("1 + 1")`` — the cell's time from create's return; beside it the plain SDK's
  create and first ``commands.run("true")``;
- **cell round trip**: ``run_code("x = 1")`` on a warm interpreter, beside
  ``commands.run("true")`` on a warm plain sandbox;
- **fork x16 of a prepared interpreter** (numpy and pandas imported, a DataFrame made), beside
  a fork x16 of a plain sandbox; every child of the interpreter is checked to see the variable.
"""
