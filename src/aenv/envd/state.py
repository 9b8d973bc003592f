"""Mutable, sandbox-wide envd state: set by ``POST /init``, read by every request."""

from __future__ import annotations

import hmac
import time
from dataclasses import dataclass, field

from aenv.envd.volume_binds import Binds


@dataclass
class EnvdState:
    #: Once set, every request but ``/health`` and ``/files`` (which may be signed) needs it.
    access_token: str | None = None
    #: Sandbox-wide environment, applied to every process under the per-process envs.
    env_vars: dict[str, str] = field(default_factory=dict)
    default_user: str = "user"
    #: The template's WORKDIR: default cwd of processes and what relative paths (and ``""``)
    #: resolve against. ``None``: none set, each user's home.
    default_workdir: str | None = None
    #: The file bind-mounted over /proc/sys/kernel/random/boot_id (``bootid.py``); None when
    #: envd does not own the boot id (not asked to, or the mount was refused).
    boot_id_file: str | None = None
    #: Volume slots bound where the sandbox's volumes belong (``volume_binds.py``).
    volume_binds: Binds = field(default_factory=Binds)
    started_monotonic: float = field(default_factory=time.monotonic)

    def token_matches(self, presented: str | None) -> bool:
        if self.access_token is None:
            return True
        if presented is None:
            return False
        return hmac.compare_digest(presented.encode(), self.access_token.encode())
