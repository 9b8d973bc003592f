"""The registry of contexts: id → (kernel, language, cwd), and each language's default one.

Owns every kernel the server starts and stops them all at shutdown. A context is what the SDK
names by id; the *default* context of a language is the one `POST /execute` uses when the
request names a language but no context (E2B's behaviour: one per language, created at first
use; the Python one at server start, so `/health` answers only once Python does). Deleting a
default context is allowed; the next request for that language makes a new one.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from dataclasses import dataclass

from aenv.interpreter import languages
from aenv.interpreter.kernel import Kernel

DEFAULT_CWD = "/home/user"


class ContextNotFound(LookupError):
    """No context has this id (HTTP 404)."""


class BadRequest(ValueError):
    """A request the server cannot honour as asked (HTTP 400)."""


@dataclass
class Context:
    id: str
    language: str
    cwd: str
    kernel: Kernel

    def describe(self) -> dict[str, str]:
        """The context as the SDK's `Context.from_json` reads it."""
        return {"id": self.id, "language": self.language, "cwd": self.cwd}


class Contexts:
    """Every context of this server. ``default_cwd`` is where contexts start unless asked."""

    def __init__(self, default_cwd: str = DEFAULT_CWD) -> None:
        self.default_cwd = default_cwd
        self._contexts: dict[str, Context] = {}
        self._defaults: dict[str, str] = {}  # language → context id
        # One lock for making default contexts: two first requests for JavaScript at once
        # must make one context, not two.
        self._defaults_lock = asyncio.Lock()

    async def start(self) -> None:
        """Start the default Python context (the server is not ready until it answers)."""
        await self.default(languages.PYTHON.name)

    async def stop(self) -> None:
        contexts, self._contexts = list(self._contexts.values()), {}
        self._defaults.clear()
        await asyncio.gather(*(c.kernel.stop() for c in contexts), return_exceptions=True)

    async def create(self, language: str | None, cwd: str | None,
                     env: dict[str, str] | None = None) -> Context:
        """A new context with a kernel of its own, started and answering."""
        lang, kernelspec = self._resolve(language)
        cwd = cwd or self.default_cwd
        if not os.path.isdir(cwd):
            raise BadRequest(f"cwd {cwd!r} is not a directory")
        kernel = Kernel(kernelspec, lang.name, cwd, dict(env or {}))
        await kernel.start()
        context = Context(id=str(uuid.uuid4()), language=lang.name, cwd=cwd, kernel=kernel)
        self._contexts[context.id] = context
        return context

    def _resolve(self, language: str | None) -> tuple[languages.Language, str]:
        try:
            return languages.resolve(language)
        except languages.LanguageError as exc:
            raise BadRequest(str(exc)) from exc

    async def default(self, language: str | None) -> Context:
        """The default context of ``language``, made now if there is none."""
        name = languages.normalize(language)
        async with self._defaults_lock:
            context_id = self._defaults.get(name)
            if context_id is not None and context_id in self._contexts:
                return self._contexts[context_id]
            context = await self.create(name, None)
            self._defaults[name] = context.id
            return context

    def get(self, context_id: str) -> Context:
        try:
            return self._contexts[context_id]
        except KeyError:
            raise ContextNotFound(f"context {context_id} not found") from None

    def list(self) -> list[Context]:
        return list(self._contexts.values())

    async def restart(self, context_id: str) -> None:
        await self.get(context_id).kernel.restart()

    async def remove(self, context_id: str) -> None:
        context = self.get(context_id)
        del self._contexts[context_id]
        await context.kernel.stop()

    async def ready(self) -> bool:
        """Whether the default Python context's kernel is alive (the health check)."""
        context_id = self._defaults.get(languages.PYTHON.name)
        context = self._contexts.get(context_id) if context_id else None
        return context is not None and await context.kernel.is_alive()
