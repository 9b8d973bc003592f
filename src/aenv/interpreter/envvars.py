"""Per-call environment variables (`env_vars` of `POST /execute`) as code in each language.

Owns the two snippets a kernel runs silently around one execution: `set_code` saves the
current values of the named variables inside the kernel and sets the new ones; `restore_code`
puts the saved values back (or unsets what was unset), so a call's variables never leak into
the next call, while what user code set earlier is kept. Values are embedded as literals of
the kernel's language (Python repr, JSON for JavaScript, shell quoting for bash); names must
be identifiers, which every language here accepts unquoted.
"""

from __future__ import annotations

import json
import re
import shlex

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class EnvVarError(ValueError):
    """An env_vars name no shell could set (HTTP 400)."""


def validate(env: dict[str, str]) -> dict[str, str]:
    for name in env:
        if not _NAME.match(name):
            raise EnvVarError(f"invalid environment variable name {name!r}")
    return {name: str(value) for name, value in env.items()}


def _python_set(env: dict[str, str]) -> str:
    # Kept on the sys module: invisible to the user's namespace, and the function that does
    # the work is deleted again.
    return (
        "def __aenv_env(new):\n"
        "    import os, sys\n"
        "    sys._aenv_saved_env = {k: os.environ.get(k) for k in new}\n"
        "    os.environ.update(new)\n"
        f"__aenv_env({env!r}); del __aenv_env\n"
    )


_PYTHON_RESTORE = (
    "def __aenv_env():\n"
    "    import os, sys\n"
    "    for k, v in getattr(sys, '_aenv_saved_env', {}).items():\n"
    "        if v is None:\n"
    "            os.environ.pop(k, None)\n"
    "        else:\n"
    "            os.environ[k] = v\n"
    "    sys._aenv_saved_env = {}\n"
    "__aenv_env(); del __aenv_env\n"
)


def _deno_set(env: dict[str, str]) -> str:
    data = json.dumps(env)
    return (
        f"{{ const e = {data}; globalThis.__aenvSavedEnv = {{}};"
        " for (const [k, v] of Object.entries(e)) {"
        " globalThis.__aenvSavedEnv[k] = Deno.env.get(k) ?? null; Deno.env.set(k, v); } }"
    )


_DENO_RESTORE = (
    "{ for (const [k, v] of Object.entries(globalThis.__aenvSavedEnv ?? {})) {"
    " if (v === null) Deno.env.delete(k); else Deno.env.set(k, v); }"
    " delete globalThis.__aenvSavedEnv; }"
)


def _bash_set(env: dict[str, str]) -> str:
    lines = []
    for name, value in env.items():
        lines.append(
            f'if [ -n "${{{name}+x}}" ]; then __aenv_had_{name}=1; __aenv_old_{name}="${name}";'
            f" else __aenv_had_{name}=0; fi; export {name}={shlex.quote(value)}"
        )
    return "\n".join(lines)


def _bash_restore(names: list[str]) -> str:
    lines = []
    for name in names:
        lines.append(
            f'if [ "$__aenv_had_{name}" = 1 ]; then export {name}="$__aenv_old_{name}";'
            f" else unset {name}; fi; unset __aenv_had_{name} __aenv_old_{name}"
        )
    return "\n".join(lines)


def _r_string(value: str) -> str:
    # JSON string escapes are valid R string escapes.
    return json.dumps(value)


def _r_set(env: dict[str, str]) -> str:
    names = ", ".join(_r_string(k) for k in env)
    sets = ", ".join(f"{k} = {_r_string(v)}" for k, v in env.items())
    # names = TRUE: by default a single variable comes back unnamed, and the restore loops
    # over the names.
    return (f".aenv_saved_env <- Sys.getenv(c({names}), unset = NA, names = TRUE)\n"
            f"Sys.setenv({sets})")


_R_RESTORE = (
    "for (.aenv_k in names(.aenv_saved_env)) {"
    " if (is.na(.aenv_saved_env[[.aenv_k]])) Sys.unsetenv(.aenv_k)"
    " else do.call(Sys.setenv, setNames(list(.aenv_saved_env[[.aenv_k]]), .aenv_k)) }\n"
    "rm(.aenv_saved_env, .aenv_k)"
)


def set_code(language: str, env: dict[str, str]) -> str:
    """Code that saves and sets ``env`` in a kernel of ``language`` ("" if nothing to do)."""
    if not env:
        return ""
    if language == "python":
        return _python_set(env)
    if language in ("javascript", "typescript"):
        return _deno_set(env)
    if language == "bash":
        return _bash_set(env)
    if language == "r":
        return _r_set(env)
    return ""


def restore_code(language: str, env: dict[str, str]) -> str:
    """Code that undoes what ``set_code(language, env)`` did."""
    if not env:
        return ""
    if language == "python":
        return _PYTHON_RESTORE
    if language in ("javascript", "typescript"):
        return _DENO_RESTORE
    if language == "bash":
        return _bash_restore(list(env))
    if language == "r":
        return _R_RESTORE
    return ""
