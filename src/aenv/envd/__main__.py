"""``python -m aenv.envd --port 49983`` (also what the bundle's ``bin/envd`` runs)."""

from __future__ import annotations

import argparse
import faulthandler
import os
import signal
import sys

from aenv.envd import DEFAULT_PORT, ENVD_VERSION
from aenv.envd.state import EnvdState


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="envd", description="aenv's in-sandbox daemon")
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--user", default="user", help="default user for processes and files")
    parser.add_argument("--workdir", default=None, help="default working directory")
    parser.add_argument("--access-token", default=None, help="require this X-Access-Token")
    parser.add_argument(
        "--exec-helper", default=None,
        help="the exec-as helper (default: bin/exec-as of the bundle envd runs from, if any)",
    )
    parser.add_argument(
        "--remount-proc", action="store_true",
        help="remount /proc with a small dentry cache first (gVisor checkpoint work-around)",
    )
    parser.add_argument(
        "--pids-limit", type=int, default=None,
        help="run user processes in a cgroup of at most this many tasks (sandbox init only)",
    )
    parser.add_argument(
        "--own-boot-id", action="store_true",
        help="give the sandbox a boot id of its own, renewed by /init (sandbox init only)",
    )
    parser.add_argument("--log-level", default="warning")
    parser.add_argument("--version", action="version", version=ENVD_VERSION)
    args = parser.parse_args(argv)
    # Debuggers cannot attach across gVisor; SIGUSR1 dumps every thread's stack to stderr
    # (the sandbox's console.log) instead.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    if args.remount_proc:
        from aenv.envd.procfs import remount_proc

        remount_proc()
    if args.pids_limit:
        from aenv.envd.pidlimit import setup

        setup(args.pids_limit)
    boot_id_file = None
    if args.own_boot_id:  # after the remount, which would cover the bind mount
        from aenv.envd.bootid import install

        boot_id_file = install()
    helper = args.exec_helper
    if helper is None:
        bundled = os.path.join(sys.prefix, "bin", "exec-as")
        helper = bundled if os.access(bundled, os.X_OK) else None
    # The bundle's launcher points Python at itself; user processes must not inherit that.
    for name in ("PYTHONHOME", "PYTHONPATH", "PYTHONNOUSERSITE", "PYTHONDONTWRITEBYTECODE"):
        os.environ.pop(name, None)
    state = EnvdState(
        access_token=args.access_token, default_user=args.user, default_workdir=args.workdir,
        boot_id_file=boot_id_file,
    )
    from aenv.envd.server import serve  # after the environment is clean

    serve(args.host, args.port, state, exec_helper=helper, log_level=args.log_level)


if __name__ == "__main__":
    main()
