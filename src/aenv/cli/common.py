"""What every sandbox command of the CLI shares: the client, the one-line errors, the consoles.

The CLI is sync at the edge and async inside: each command builds a coroutine and hands it to
:func:`run`, which runs it with ``anyio.run`` and turns every failure into one ``error: …``
line on stderr and a non-zero exit code (no tracebacks):

* ``aenv.client``'s typed errors: exit 1 (their message names the call and the node's answer);
* a node that cannot be reached at all: exit 1, at once (:func:`reachable`), rather than after
  the client's retry budget (its retries are for trainers riding out a node restart);
* Ctrl-C: exit 130.

Where the node is: ``aenv.client``'s rules (``E2B_API_URL``/``E2B_API_KEY``, else the file
``aenv auth login`` wrote). Results go to stdout (ids, tables, JSON), everything else (progress,
warnings, errors) to stderr, so ``aenv fork ID -n 4 | xargs …`` sees only ids.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Annotated, NoReturn, TypeVar
from urllib.parse import urlsplit

import anyio
import httpx
import typer
from rich.console import Console
from rich.text import Text

from aenv.client import AsyncClient, ClientError
from aenv.client.config import ClientConfig, resolve

err = Console(stderr=True, highlight=False)  # progress, warnings, errors
# Results (tables): to a pipe or a file at their full width, never cut to 80 columns.
out = Console(highlight=False, width=None if sys.stdout.isatty() else 1000)

#: A call of a person at a terminal: long enough for a pause or a snapshot of a large sandbox
#: (seconds), short enough not to look hung when the node is busy.
DEADLINE_S = 120.0
#: Creates and forks may wait in the node's admission queue behind a burst of other creates.
CREATE_DEADLINE_S = 300.0
#: Whether anything listens at the API URL: a local or LAN node answers in milliseconds.
PROBE_TIMEOUT_S = 5.0

T = TypeVar("T")

Metadata = Annotated[list[str] | None, typer.Option(
    "--metadata", "-m", help="KEY=VALUE label (repeatable)")]
AsJson = Annotated[bool, typer.Option("--json", help="print JSON instead of a table")]


def fail(message: str, code: int = 1) -> NoReturn:
    """One ``error:`` line on stderr (never wrapped: scripts grep it) and exit ``code``."""
    err.print(Text(f"error: {message}", style="red"), soft_wrap=True)
    raise typer.Exit(code)


def run(flow: Callable[[], Awaitable[T]]) -> T:
    """Run ``flow`` in an event loop; every failure is one line and a non-zero exit."""
    try:
        return anyio.run(flow)
    except ClientError as exc:
        fail(" ".join(exc.message.split()))
    except BaseExceptionGroup as group:  # a task group's: its first error is the story
        first = _first(group)
        if isinstance(first, ClientError):
            fail(" ".join(first.message.split()))
        if isinstance(first, typer.Exit | KeyboardInterrupt):
            raise first from None
        raise
    except KeyboardInterrupt:
        err.print("interrupted")
        raise typer.Exit(130) from None


def _first(group: BaseExceptionGroup[BaseException]) -> BaseException:
    first = group.exceptions[0]
    return _first(first) if isinstance(first, BaseExceptionGroup) else first


def config() -> ClientConfig:
    """Where the node is (arguments none: the environment, else ``aenv auth``'s file)."""
    return resolve()


async def reachable(cfg: ClientConfig) -> None:
    """Fail at once when nothing answers at the API URL (any HTTP answer will do: a gateway
    need not serve ``/health``)."""
    try:
        async with httpx.AsyncClient(timeout=PROBE_TIMEOUT_S) as http:
            await http.get(cfg.api_url + "/health")
    except httpx.TransportError as exc:
        parts = urlsplit(cfg.api_url)
        origin = f"{parts.scheme}://{parts.netloc}"
        reason = (str(exc) or type(exc).__name__).splitlines()[0]
        hint = " (is the node running? set E2B_API_URL or run aenv auth login)"
        fail(f"cannot reach {origin}: {reason}{hint}")


@contextlib.asynccontextmanager
async def client(*, deadline_s: float = DEADLINE_S) -> AsyncIterator[AsyncClient]:
    """A client of the configured node that leaves its sandboxes alone when the CLI exits
    (``cleanup=False``): a sandbox ``aenv start --keep`` made must outlive the command."""
    cfg = config()
    await reachable(cfg)
    async with AsyncClient(config=cfg, cleanup=False, deadline_s=deadline_s) as c:
        yield c


def pairs(items: Iterable[str] | None, what: str) -> dict[str, str]:
    """``["K=V", …]`` as a dict; a malformed item is an error naming the option."""
    found: dict[str, str] = {}
    for item in items or ():
        key, eq, value = item.partition("=")
        if not eq or not key:
            fail(f"{what} {item!r}: expected KEY=VALUE")
        found[key] = value
    return found


def examples(*lines: str) -> str:
    """A command's ``--help`` epilog: each example on its own paragraph (click rewraps text)."""
    return "Examples:\n\n" + "\n\n".join(f"  {line}" for line in lines)
