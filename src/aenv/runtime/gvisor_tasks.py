"""Ending a gVisor sandbox's runaway guest: every process but its init SIGKILLed, through the
sandbox's control socket, the guest frozen meanwhile.

Why from outside: on the ptrace platform a guest's churn of processes grows the runtime's
host tasks (a traced stub thread per address space and sentry thread, kept for reuse once the
guest process is gone: ~13 per process a bomb holds) until the sandbox's host pids limit,
where the sentry dies. Inside the guest a fork bomb starves whatever would stop it (envd's
own killer, ``envd/pidlimit.py``, ran too late about half the time); the control socket is
served by the sentry itself and answers in milliseconds during a bomb.

Frozen first (``containerManager.Pause``, the truth kept in the pause marker as for any
freeze, ``gvisor_pause.py``): no process forks between the listing and the signals, so one
round gets them all. The kills take effect when the guest is thawed; the dying processes
still add host tasks (~3 per process, measured), which the caller's threshold leaves room
for. envd, the sandbox's init, survives, reaps the orphans (``envd/orphans.py``) and reports
each killed command's exit as a SIGKILL.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from pathlib import Path

from aenv.runtime import gvisor_pause, urpc
from aenv.runtime.runsc import Runsc

#: The guest's init (envd): never signalled.
INIT_PID = 1
#: ``control.DeliverToProcess``: the signal goes to the one process named.
DELIVER_TO_PROCESS = 0
#: Signals in flight at once (each is one control-socket call of ~2 ms).
SIGNALS_AT_ONCE = 8


def _pids(listed: object) -> list[int]:
    """Guest PIDs but init's, from ``containerManager.Processes``' answer."""
    if not isinstance(listed, list):
        return []
    pids = (p.get("pid") for p in listed if isinstance(p, dict))
    return [p for p in pids if isinstance(p, int) and p != INIT_PID]


async def kill_all_but_init(runsc: Runsc, runtime_id: str, sandbox_id: str,
                            marker: Path) -> int:
    """SIGKILL every guest process of the sandbox but its init; how many were signalled.
    Raises as ``gvisor_pause.freeze`` does when the sandbox is frozen or in doubt; the guest
    is thawed whatever happens after it was frozen."""
    await gvisor_pause.freeze(runsc, runtime_id, sandbox_id, marker)
    try:
        sock = runsc.control_socket(runtime_id)
        pids = _pids(await urpc.call(sock, "containerManager.Processes", runtime_id))
        gate = asyncio.Semaphore(SIGNALS_AT_ONCE)

        async def kill(pid: int) -> bool:
            async with gate:
                with contextlib.suppress(urpc.CallFailed):  # exited meanwhile
                    await urpc.call(sock, "containerManager.Signal", {
                        "CID": runtime_id, "Signo": int(signal.SIGKILL), "PID": pid,
                        "Mode": DELIVER_TO_PROCESS})
                    return True
                return False

        return sum(await asyncio.gather(*(kill(pid) for pid in pids)))
    finally:
        await gvisor_pause.thaw(runsc, runtime_id, sandbox_id, marker)
