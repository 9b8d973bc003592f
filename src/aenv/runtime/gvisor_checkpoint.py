"""A gVisor save that leaves the sandbox running, over its control socket.

``containerManager.Checkpoint`` with ``Resume`` is what ``runsc checkpoint --leave-running``
sends, without starting the CLI (and its network namespace wrapper) first: ~40-50 ms less.
The CLI stays for a save that ends the sandbox: it also tears the container down.
"""

from __future__ import annotations

import os
from pathlib import Path

from aenv.core.errors import RuntimeFailure
from aenv.runtime import urpc
from aenv.runtime.base import IMAGE_FILES, Instance
from aenv.runtime.runsc import Runsc

#: ``containerManager.Checkpoint``'s argument for a save that leaves the sandbox running, as
#: runsc 20240729's CLI sends it with ``--compression=none --leave-running`` (RUNTIME-NOTES);
#: the image files follow as descriptors: state, pages metadata, pages.
CHECKPOINT_ARG = {
    "metadata": {"compression": "none"},
    "MemoryFileSaveOpts": {"ExcludeCommittedZeroPages": False},
    "have_pages_file": True,
    "Resume": True,
}
#: A save writes the sandbox's memory: seconds for a large one.
CHECKPOINT_TIMEOUT_S = 300.0


async def checkpoint_over_socket(runsc: Runsc, instance: Instance, dest: Path) -> None:
    """Save ``instance`` into the image files it creates in ``dest``; the sandbox runs on.
    An unanswered call is a failure too: the save may have stopped half way (the caller
    removes the image either way)."""
    fds = [os.open(dest / name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
           for name in IMAGE_FILES]
    try:
        await urpc.call(runsc.control_socket(instance.runtime_id),
                        "containerManager.Checkpoint", CHECKPOINT_ARG, files=fds,
                        timeout=CHECKPOINT_TIMEOUT_S)
    except urpc.CallInDoubt as exc:
        raise RuntimeFailure(f"checkpoint of sandbox {instance.sandbox_id}: {exc}") from exc
    finally:
        for fd in fds:
            os.close(fd)
