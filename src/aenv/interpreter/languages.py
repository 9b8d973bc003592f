"""Language names → the Jupyter kernelspecs that run them.

Owns the one table of languages the server knows and how a name the SDK sends (any case, with
the aliases E2B accepts) maps onto it. Which kernels are installed is asked of jupyter_client's
KernelSpecManager once, at first use: the template installs its kernels at build time and they
do not change while the sandbox runs.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from jupyter_client.kernelspec import KernelSpecManager


class LanguageError(ValueError):
    """A language the SDK asked for that this template cannot run (HTTP 400)."""


@dataclass(frozen=True)
class Language:
    """One language: its canonical name and the kernelspec names that can run it, preferred
    first (an IR kernel is installed as `ir` by IRkernel's default, as `r` by E2B's template)."""

    name: str
    kernelspecs: tuple[str, ...]


PYTHON = Language("python", ("python3",))
LANGUAGES: dict[str, Language] = {
    lang.name: lang
    for lang in (
        PYTHON,
        Language("bash", ("bash",)),
        # Deno runs both: its kernel type-checks nothing and strips types, so one kernelspec.
        Language("javascript", ("deno",)),
        Language("typescript", ("deno",)),
        Language("r", ("ir", "r")),
    )
}
# The short names E2B's server accepts, and a few obvious ones.
ALIASES = {"js": "javascript", "ts": "typescript", "py": "python", "python3": "python",
           "sh": "bash"}


def normalize(name: str | None) -> str:
    """The canonical language name for what a request sent (None and "" mean Python)."""
    if not name:
        return PYTHON.name
    key = name.strip().lower()
    return ALIASES.get(key, key)


@functools.cache
def installed_kernelspecs() -> frozenset[str]:
    """The kernelspec names jupyter_client can find (the venv's, the system's, the user's)."""
    return frozenset(KernelSpecManager().find_kernel_specs())


def resolve(name: str | None) -> tuple[Language, str]:
    """The language for ``name`` and the installed kernelspec that runs it.

    Raises LanguageError for a language this server does not know, or one whose kernel the
    template did not install."""
    canonical = normalize(name)
    language = LANGUAGES.get(canonical)
    if language is None:
        known = ", ".join(sorted(LANGUAGES))
        raise LanguageError(f"language {name!r} is not supported (supported: {known})")
    installed = installed_kernelspecs()
    for spec in language.kernelspecs:
        if spec in installed:
            return language, spec
    raise LanguageError(f"language {language.name} is not installed in this template")
