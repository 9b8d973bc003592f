"""Run-scoped cleanup: every sandbox a client creates carries ``run=<id>``; on exit they die.

A trainer that crashes must not leave its sandboxes running (and billing memory) on the node.
So each :class:`~aenv.client.AsyncClient` labels every create with metadata ``run=<run id>``
and, besides its own ``async with`` exit, registers here; this module kills each registered
run's sandboxes

* at interpreter exit (``atexit``): a script that forgot to close its client;
* on SIGTERM and SIGINT: the handler kills the runs, then hands the signal on to the handler
  that was there before (SIGINT's ``KeyboardInterrupt``, asyncio's, a framework's), or, if
  that was the default, restores it and re-sends the signal so the process still dies of it.

A SIGKILLed process runs no code at all: that is what the label is for. Whoever notices (the
supervisor, the next run, ``aenv kill --metadata run=<id>``) calls
``kill_by_metadata(run=<id>)`` for the run.

The cleanup here is synchronous (``httpx.Client``), with short timeouts and one overall
deadline: it runs in a signal handler or at exit, where no event loop may be running any more
and a hung node must not keep a dying process alive. A create the node is still starting when
the signal arrives is not listed yet and can escape; its label still names the run.
Handlers are installed once per process, from the main thread only (Python's rule); a client
made on another thread relies on ``atexit`` and its own exit.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from types import FrameType
from typing import Any
from urllib.parse import urlencode

import httpx

from aenv.client.config import ClientConfig

log = logging.getLogger("aenv.client")

#: The metadata key of a run's label.
RUN_LABEL = "run"
#: All of a run's cleanup at exit or on a signal: a dying process must not hang on a dead node.
CLEANUP_DEADLINE_S = 15.0
#: One request of that cleanup.
CLEANUP_REQUEST_S = 5.0
_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@dataclass
class _Run:
    config: ClientConfig
    run_id: str
    #: Ids the client created or forked (live view of the client's set): killed even if the
    #: node lost their label.
    owned: AbstractSet[str]


_lock = threading.Lock()
_runs: dict[int, _Run] = {}
_installed = False
_previous: dict[int, Any] = {}
_reaping = threading.local()


def register(token: int, config: ClientConfig, run_id: str, owned: AbstractSet[str]) -> None:
    """Kill ``run_id``'s sandboxes when this process exits or is signalled, until
    :func:`unregister` (the client closed and did the killing itself)."""
    global _installed
    with _lock:
        _runs[token] = _Run(config, run_id, owned)
        first = not _installed
        _installed = True
    if first:
        atexit.register(reap_all)
    install_signal_handlers()


def unregister(token: int) -> None:
    with _lock:
        _runs.pop(token, None)


def install_signal_handlers() -> None:
    """SIGTERM/SIGINT handlers that reap every registered run; a no-op off the main thread or
    once installed."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in _SIGNALS:
        current = signal.getsignal(signum)
        if current is _on_signal:
            continue
        _previous[signum] = current
        signal.signal(signum, _on_signal)


def _on_signal(signum: int, frame: FrameType | None) -> None:
    if not getattr(_reaping, "active", False):
        reap_all()
    previous = _previous.get(signum, signal.SIG_DFL)
    if callable(previous):
        previous(signum, frame)
    elif previous == signal.SIG_IGN:
        return
    else:  # the default action: die of the signal, as if we had never been here
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def reap_all() -> None:
    """Kill the sandboxes of every registered run (at exit, on a signal)."""
    with _lock:
        runs = list(_runs.values())
    if not runs:
        return
    _reaping.active = True
    try:
        deadline = time.monotonic() + CLEANUP_DEADLINE_S
        for run in runs:
            try:
                killed = kill_run_sync(run.config, run.run_id, set(run.owned), deadline=deadline)
                log.info("run %s: killed %d sandboxes at exit", run.run_id, len(killed))
            except Exception as exc:  # a dying process: report, never raise
                log.warning("run %s: cleanup failed (kill its sandboxes with "
                            "kill_by_metadata(run=%r)): %s", run.run_id, run.run_id, exc)
    finally:
        _reaping.active = False


def kill_run_sync(config: ClientConfig, run_id: str, extra: AbstractSet[str] = frozenset(), *,
                  deadline: float | None = None) -> list[str]:
    """Kill every sandbox labelled ``run=<run_id>`` and the ``extra`` ids; returns the killed."""
    deadline = deadline or time.monotonic() + CLEANUP_DEADLINE_S
    headers = {"X-API-KEY": config.api_key} if config.api_key else {}
    with httpx.Client(base_url=config.api_url + "/", headers=headers,
                      timeout=CLEANUP_REQUEST_S) as http:
        ids = set(extra) | set(_labelled(http, {RUN_LABEL: run_id}, deadline))

        def kill(sandbox_id: str) -> str | None:
            if time.monotonic() > deadline:
                return None
            with contextlib.suppress(httpx.HTTPError):
                response = http.delete(f"sandboxes/{sandbox_id}")
                if response.status_code == 204:
                    return sandbox_id
            return None

        return [i for i in _parallel(kill, sorted(ids)) if i is not None]


def _parallel(fn: Callable[[str], str | None], items: list[str], workers: int = 8
              ) -> list[str | None]:
    """``fn`` over ``items`` on a few plain threads: a kill waits ~1 s for the node to reap the
    sandbox's processes. Not ``ThreadPoolExecutor``: it refuses work once the interpreter is
    shutting down, which is exactly when ``atexit`` runs this."""
    results: list[str | None] = [None] * len(items)
    pending = iter(enumerate(items))
    lock = threading.Lock()

    def work() -> None:
        while True:
            with lock:
                nxt = next(pending, None)
            if nxt is None:
                return
            results[nxt[0]] = fn(nxt[1])

    threads = [threading.Thread(target=work, daemon=True)
               for _ in range(min(workers, len(items)))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def _labelled(http: httpx.Client, labels: dict[str, str], deadline: float) -> list[str]:
    ids: list[str] = []
    params: dict[str, str] = {"metadata": urlencode(labels), "limit": "100"}
    while time.monotonic() < deadline:
        response = http.get("v2/sandboxes", params=params)
        response.raise_for_status()
        ids.extend(str(s["sandboxID"]) for s in response.json())
        token = response.headers.get("x-next-token")
        if not token:
            break
        params["nextToken"] = token
    return ids
