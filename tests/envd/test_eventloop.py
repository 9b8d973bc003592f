"""envd's event loop survives an epoll instance that reports descriptors it no longer has.

gVisor's restore can leave such interests behind (see aenv/envd/eventloop.py). Linux makes the
same state on purpose: an interest lives as long as its file description, so registering fd A
straight on the epoll object, dup()ing A and closing it leaves an interest in "A" that
``epoll_wait`` reports while EPOLL_CTL_DEL on A fails with EBADF.
"""

from __future__ import annotations

import asyncio
import os
import select
import selectors
import socket
from collections.abc import Iterator

import pytest

from aenv.envd.eventloop import RestoreSafeEpollSelector, after_restore, new_event_loop


@pytest.fixture
def stale_interest() -> Iterator[tuple[RestoreSafeEpollSelector, int]]:
    """A selector whose epoll reports a closed fd (readable forever), and that fd's number."""
    selector = RestoreSafeEpollSelector()
    read_end, write_end = os.pipe()
    selector._selector.register(read_end, select.EPOLLIN)  # behind the selector's back
    keeper = os.dup(read_end)
    os.close(read_end)
    os.write(write_end, b"x")
    with pytest.raises(OSError):
        selector._selector.unregister(read_end)  # EBADF: what libuv's loop runs into
    yield selector, read_end
    selector.close()
    os.close(keeper)
    os.close(write_end)


def test_stale_interest_spins_a_plain_selector() -> None:
    """The control: the stdlib selector returns at once, every time, with nothing to do."""
    plain = selectors.EpollSelector()
    read_end, write_end = os.pipe()
    plain._selector.register(read_end, select.EPOLLIN)  # type: ignore[attr-defined]
    keeper = os.dup(read_end)
    os.close(read_end)
    os.write(write_end, b"x")
    try:
        assert plain._selector.poll(1.0) == [(read_end, select.EPOLLIN)]  # type: ignore[attr-defined]
        assert plain.select(timeout=1.0) == []  # returned at once, not after 1 s
    finally:
        plain.close()
        os.close(keeper)
        os.close(write_end)


def test_unknown_descriptor_moves_registrations_to_a_fresh_epoll(
    stale_interest: tuple[RestoreSafeEpollSelector, int],
) -> None:
    selector, stale_fd = stale_interest
    placeholder = os.open(os.devnull, os.O_RDONLY)  # keeps the stale number out of reuse
    live_read, live_write = os.pipe()
    try:
        assert stale_fd not in (live_read, live_write)
        selector.register(live_read, selectors.EVENT_READ, data="live")
        poisoned = selector._selector
        assert selector.select(timeout=0) == []
        assert selector.rebuilds == 1
        assert poisoned.closed and selector._selector is not poisoned
        assert selector._selector.poll(0) == []  # the stale interest is gone
        os.write(live_write, b"y")
        ready = selector.select(timeout=1.0)
        assert [(key.data, events) for key, events in ready] == [("live", selectors.EVENT_READ)]
        assert selector.rebuilds == 1
    finally:
        selector.unregister(live_read)
        for fd in (live_read, live_write, placeholder):
            os.close(fd)


def test_a_stale_interest_under_a_reused_number_needs_the_restore_hint(
    stale_interest: tuple[RestoreSafeEpollSelector, int],
) -> None:
    """The selector cannot tell this one from a real event; ``POST /restored`` clears it."""
    selector, stale_fd = stale_interest
    null = os.open(os.devnull, os.O_RDONLY)
    if null != stale_fd:  # hold the number while the socket pair takes two others
        os.dup2(null, stale_fd)
        os.close(null)
    sock_a, sock_b = socket.socketpair()
    try:
        os.dup2(sock_a.fileno(), stale_fd)  # the stale number now names a live, idle socket
        selector.register(stale_fd, selectors.EVENT_READ, data="live")
        assert [key.data for key, _ in selector.select(timeout=0)] == ["live"]  # spurious
        assert selector.rebuilds == 0
        selector.replace_epoll("restored")
        assert selector.select(timeout=0) == []
        sock_b.send(b"z")
        assert [key.data for key, _ in selector.select(timeout=1.0)] == ["live"]
    finally:
        selector.unregister(stale_fd)
        os.close(stale_fd)
        sock_a.close()
        sock_b.close()


def test_select_waits_for_its_timeout_after_the_rebuild(
    stale_interest: tuple[RestoreSafeEpollSelector, int],
) -> None:
    selector, _ = stale_interest
    selector.select(timeout=0)
    loop = asyncio.new_event_loop()
    try:
        started = loop.time()
        assert selector.select(timeout=0.05) == []
        assert loop.time() - started >= 0.045
    finally:
        loop.close()


def test_envd_loop_renews_its_epoll_after_a_restore() -> None:
    loop = new_event_loop()
    try:
        selector = loop._selector  # type: ignore[attr-defined]
        assert isinstance(selector, RestoreSafeEpollSelector)
        first = selector._selector

        async def restored() -> bool:
            return after_restore()

        assert loop.run_until_complete(restored()) is True
        assert selector._selector is not first and first.closed
        assert loop.run_until_complete(asyncio.sleep(0.01, result=7)) == 7
    finally:
        loop.close()
