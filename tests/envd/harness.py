"""Run an envd under test inside a throwaway bubblewrap root.

The sandbox sees the host's ``/usr`` and ``/etc`` read-only (so bash, coreutils and python3 are
there), a fresh writable ``/home``, ``/tmp`` and ``/root`` on a scratch directory, its own PID,
IPC and UTS namespaces, and only the capabilities envd needs to switch users and own files. It
shares the host's network namespace because the E2B SDK's debug mode talks to
``localhost:49983``. Nothing it runs can write to the host outside the scratch directory.

``python -m tests.envd.harness serve`` is what ``make run`` starts until the node server lands.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from aenv.envd.bundle import launcher_cflags

REPO = Path(__file__).resolve().parents[2]
DEFAULT_BUNDLE = REPO / "build" / "envd-bundle"
USER_UID = 1000

#: What envd needs inside: switch users, chown/chmod files it writes, signal its children.
CAPS = [
    "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_FSETID",
    "CAP_KILL", "CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP",
]


def _write_identity(etc: Path) -> None:
    etc.mkdir(parents=True, exist_ok=True)
    (etc / "passwd").write_text(
        "root:x:0:0:root:/root:/bin/bash\n"
        "daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n"
        f"user:x:{USER_UID}:{USER_UID}::/home/user:/bin/bash\n"
        "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
    )
    (etc / "group").write_text(
        f"root:x:0:\ndaemon:x:1:\nsudo:x:27:user\nuser:x:{USER_UID}:\nnogroup:x:65534:\n"
    )


def prepare_root(scratch: Path) -> None:
    """Writable parts of the sandbox: homes, /tmp, identity files."""
    home = scratch / "home" / "user"
    home.mkdir(parents=True, exist_ok=True)
    os.chown(home, USER_UID, USER_UID)
    home.chmod(0o755)
    (scratch / "root").mkdir(exist_ok=True)
    (scratch / "root").chmod(0o700)
    (scratch / "tmp").mkdir(exist_ok=True)
    (scratch / "tmp").chmod(0o1777)
    _write_identity(scratch / "etc")


def bwrap_argv(scratch: Path, inner: list[str], *, extra_ro: list[Path]) -> list[str]:
    argv = [
        "bwrap", "--die-with-parent", "--new-session",
        "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
        "--hostname", "sandbox",
        "--ro-bind", "/usr", "/usr",
        "--symlink", "usr/bin", "/bin", "--symlink", "usr/sbin", "/sbin",
        "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
        "--ro-bind", "/etc", "/etc",
        "--ro-bind", str(scratch / "etc" / "passwd"), "/etc/passwd",
        "--ro-bind", str(scratch / "etc" / "group"), "/etc/group",
        "--ro-bind", "/dev/null", "/etc/shadow",
        "--proc", "/proc", "--dev", "/dev",
        "--bind", str(scratch / "home"), "/home",
        "--bind", str(scratch / "root"), "/root",
        "--bind", str(scratch / "tmp"), "/tmp",
        "--dir", "/var/tmp", "--dir", "/run",
        "--cap-drop", "ALL",
    ]
    if (scratch / "sudo").exists():
        argv += _local_bin_with_sudo(scratch / "sudo")
    for cap in CAPS:
        argv += ["--cap-add", cap]
    for path in extra_ro:
        argv += ["--ro-bind", str(path), str(path)]
    argv += ["--chdir", "/", "--clearenv",
             "--setenv", "PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
             "--setenv", "HOME", "/root", "--setenv", "LANG", "C.UTF-8", "--", *inner]
    return argv


def dev_exec_helper() -> Path:
    """Compile envd's exec-as helper for source-tree runs (the bundle ships its own)."""
    return dev_static("exec_as.c", "exec-as")


def dev_static(source_name: str, out_name: str) -> Path:
    """A static helper of the bundle (launcher/*.c), compiled for source-tree runs."""
    source = REPO / "src" / "aenv" / "envd" / "launcher" / source_name
    out = REPO / "build" / "dev" / out_name
    if not out.exists() or out.stat().st_mtime < source.stat().st_mtime:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out_name}.{os.getpid()}.tmp")  # shards build at once
        subprocess.run(["gcc", *launcher_cflags(source_name), "-o", str(tmp), str(source)],
                       check=True)
        tmp.replace(out)
    return out


_compiled = False


def _compile_sources() -> None:
    """Byte-compile the source tree once: the sandbox sees it read-only, so an uncompiled
    checkout would make every envd start compile ~470 modules from scratch."""
    global _compiled
    if not _compiled:
        venv_python = REPO / ".venv" / "bin" / "python"
        subprocess.run(
            [str(venv_python), "-m", "compileall", "-q", str(REPO / "src" / "aenv")],
            check=True, stdout=subprocess.DEVNULL,
        )
        _compiled = True


def envd_command(
    port: int, bundle: Path | None, *, exec_helper: bool = True
) -> tuple[list[str], list[Path]]:
    """The envd to run and the host paths it needs to see (read-only)."""
    listen = ["--port", str(port), "--host", "127.0.0.1"]
    if bundle is not None:
        return [str(bundle / "bin" / "envd"), *listen], [bundle]
    venv_python = REPO / ".venv" / "bin" / "python"
    base = Path(os.path.realpath(venv_python)).parents[1]  # the interpreter's installation
    paths = [REPO]
    if not str(base).startswith("/usr/"):
        paths.append(base)
    helper = ["--exec-helper", str(dev_exec_helper())] if exec_helper else []
    _compile_sources()
    return [str(venv_python), "-m", "aenv.envd", *listen, *helper], paths


def port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


@dataclass
class EnvdSandbox:
    port: int
    scratch: Path
    process: subprocess.Popen[bytes]
    log_path: Path
    _owns_scratch: bool = field(default=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def host_path(self, inside: str) -> Path:
        """Where a path under /home, /root or /tmp inside the sandbox lives on the host."""
        for top in ("/home", "/root", "/tmp"):
            if inside == top or inside.startswith(top + "/"):
                return self.scratch / inside.lstrip("/")
        raise ValueError(f"{inside} is not on the sandbox's writable scratch")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        if self._owns_scratch:
            shutil.rmtree(self.scratch, ignore_errors=True)


def wait_healthy(url: str, process: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    import http.client
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"envd exited with {process.returncode}")
        try:
            conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=1)
            conn.request("GET", "/health")
            if conn.getresponse().status == 204:
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"envd at {url} not healthy after {timeout}s")


def _install_sudo(scratch: Path, bundle: Path | None) -> None:
    source = bundle / "bin" / "sudo" if bundle is not None else dev_static("sudo.c", "sudo")
    shutil.copy2(source, scratch / "sudo")


def _local_bin_with_sudo(sudo: Path) -> list[str]:
    """The sudo stand-in at /usr/local/bin/sudo, as the node mounts it, beside the host's
    /usr/local/bin (a bind over a file that does not exist needs a writable directory)."""
    local = Path("/usr/local/bin")
    argv = ["--tmpfs", str(local)]
    for entry in sorted(local.iterdir()) if local.is_dir() else []:
        if entry.is_symlink():
            argv += ["--symlink", os.readlink(entry), str(entry)]
        elif entry.name != "sudo":
            argv += ["--ro-bind", str(entry), str(entry)]
    return [*argv, "--ro-bind", str(sudo), str(local / "sudo")]


def start_envd(
    port: int, *, bundle: Path | None = None, scratch: Path | None = None,
    exec_helper: bool = True,
) -> EnvdSandbox:
    if not port_free(port):
        raise RuntimeError(f"port {port} is taken; stop whatever listens there first")
    owns = scratch is None
    scratch = scratch or Path(tempfile.mkdtemp(prefix="aenv-envd-"))
    prepare_root(scratch)
    _install_sudo(scratch, bundle)
    inner, paths = envd_command(port, bundle, exec_helper=exec_helper)
    log_path = scratch / "envd.log"
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            bwrap_argv(scratch, inner, extra_ro=paths),
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
        )
    sandbox = EnvdSandbox(port, scratch, process, log_path, owns)
    try:
        wait_healthy(sandbox.url, process)
    except BaseException:
        sandbox.stop()
        raise
    return sandbox


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    serve = sub.add_parser("serve", help="run envd in a throwaway root until interrupted")
    serve.add_argument("--port", type=int, default=49983)
    serve.add_argument("--bundle", type=Path, default=None)
    args = parser.parse_args()
    bundle = args.bundle or (DEFAULT_BUNDLE if (DEFAULT_BUNDLE / "bin" / "envd").exists() else None)
    sandbox = start_envd(args.port, bundle=bundle)
    print(f"envd listening on {sandbox.url} (scratch root {sandbox.scratch}); Ctrl-C stops it")
    try:
        sandbox.process.wait()
    except KeyboardInterrupt:
        pass
    finally:
        sandbox.stop()
    sys.exit(0)


if __name__ == "__main__":
    main()
