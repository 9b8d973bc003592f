"""envd's event loop: asyncio's own, on an epoll selector that survives a gVisor restore.

Why not uvloop: runsc 20240729 can restore an epoll instance with interests in files the
process had already closed (seen after a few hundred concurrent commands, then a fork). Such an
interest reports EPOLLIN|EPOLLHUP forever and cannot be deleted (the fd number is gone:
EPOLL_CTL_DEL gives EBADF), so a loop on that epoll instance spins a core. libuv's epoll fd is
out of reach; asyncio's selector is ours. Moving every live registration to a fresh epoll
instance and closing the poisoned one drops the stale interests with it. That happens:

- when the node says the sandbox was restored (``POST /restored``, its readiness probe after
  every restore): the only way to catch a stale interest whose fd number is in use again;
- when ``epoll_wait`` reports a descriptor the selector does not know (any other restore).

Until then a stale interest is a spurious wake-up, which every reader in envd tolerates.
"""

from __future__ import annotations

import asyncio
import logging
import math
import select
import selectors

log = logging.getLogger("aenv.envd")


class RestoreSafeEpollSelector(selectors.EpollSelector):
    """An ``EpollSelector`` that replaces its epoll instance when it reports unknown fds."""

    # The stdlib's own attributes, typed for us.
    _selector: select.epoll
    _fd_to_key: dict[int, selectors.SelectorKey]
    rebuilds: int = 0

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        # The stdlib's select() silently skips unknown descriptors; this one notices them.
        if timeout is None:
            wait = -1.0
        elif timeout <= 0:
            wait = 0.0
        else:
            wait = math.ceil(timeout * 1e3) * 1e-3  # epoll has ms resolution: never round down
        max_events = max(len(self._fd_to_key), 1)
        try:
            polled = self._selector.poll(wait, max_events)
        except InterruptedError:
            return []
        ready: list[tuple[selectors.SelectorKey, int]] = []
        unknown = False
        for fd, event in polled:
            key = self._fd_to_key.get(fd)
            if key is None:
                unknown = True
                continue
            events = 0
            if event & ~select.EPOLLIN:
                events |= selectors.EVENT_WRITE
            if event & ~select.EPOLLOUT:
                events |= selectors.EVENT_READ
            ready.append((key, events & key.events))
        if unknown:
            self.replace_epoll("epoll reported descriptors that are closed")
        return ready

    def replace_epoll(self, reason: str) -> None:
        fresh = select.epoll()
        for key in self._fd_to_key.values():
            mask = 0
            if key.events & selectors.EVENT_READ:
                mask |= select.EPOLLIN
            if key.events & selectors.EVENT_WRITE:
                mask |= select.EPOLLOUT
            fresh.register(key.fd, mask)
        stale, self._selector = self._selector, fresh
        stale.close()
        self.rebuilds += 1
        log.info("%s: moved %d registrations to a fresh epoll instance", reason,
                 len(self._fd_to_key))


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvicorn's ``loop="aenv.envd.eventloop:new_event_loop"`` calls this for its loop."""
    return asyncio.SelectorEventLoop(RestoreSafeEpollSelector())


def after_restore() -> bool:
    """Drop whatever interests the restore left in the running loop's epoll instance."""
    selector = getattr(asyncio.get_running_loop(), "_selector", None)
    if not isinstance(selector, RestoreSafeEpollSelector):
        return False  # a loop envd did not build (tests under another loop)
    selector.replace_epoll("restored")
    return True
