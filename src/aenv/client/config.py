"""Where the client finds its node: explicit arguments, else the E2B variables, else a file.

Each value is looked up on its own, first found wins:

1. the argument given to ``AsyncClient(...)`` / :func:`resolve`;
2. the environment: ``E2B_API_URL``, ``E2B_API_KEY``, ``E2B_SANDBOX_URL``, ``E2B_DOMAIN`` (the
   names the E2B SDKs and CLI read, so a shell set up for them works unchanged);
3. the credentials file ``<config dir>/auth.json``, written by ``aenv auth`` through
   :func:`save_credentials`; its key is used only with its own URL. The config dir is
   ``$AENV_CONFIG_DIR``, else ``$XDG_CONFIG_HOME/aenv``, else ``~/.config/aenv``.

With no URL anywhere the client talks to a node on this machine (the node's default listen
address). The sandbox URL (envd, through the node's proxy) defaults to the API URL: an aenv
node serves both on one port.

This is the one module of ``aenv.client`` that reads ``os.environ``. Owns the credentials file
and nothing else: it holds an API key, so it is written 0600 in a 0700 directory, atomically
(a temporary file in the same directory, fsync, rename): a crash leaves the old file or the new
one, never half of one, and the key is never readable by others, not even for a moment.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from aenv.client.errors import UsageError

log = logging.getLogger("aenv.client")

#: A node's default ``listen`` (``aenv.core.settings``), for a client given no URL at all.
DEFAULT_API_URL = "http://127.0.0.1:3000"
CREDENTIALS_FILE = "auth.json"


@dataclass(frozen=True)
class Credentials:
    """What ``aenv auth`` stores: a node (or gateway) URL and its API key."""

    api_url: str | None = None
    api_key: str | None = None


@dataclass(frozen=True)
class ClientConfig:
    api_url: str
    api_key: str | None
    #: Where envd is reached; the node's proxy routes on the ``E2b-Sandbox-Id`` header.
    sandbox_url: str
    #: The sandbox domain the SDK names hosts with; irrelevant while ``sandbox_url`` is set.
    domain: str | None = None

    def __repr__(self) -> str:  # never print the key
        key = "set" if self.api_key else None
        return (f"ClientConfig(api_url={self.api_url!r}, api_key={key}, "
                f"sandbox_url={self.sandbox_url!r})")


def config_dir(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    if env.get("AENV_CONFIG_DIR"):
        return Path(env["AENV_CONFIG_DIR"])
    if env.get("XDG_CONFIG_HOME"):
        return Path(env["XDG_CONFIG_HOME"]) / "aenv"
    return Path.home() / ".config" / "aenv"


def credentials_path(environ: Mapping[str, str] | None = None) -> Path:
    return config_dir(environ) / CREDENTIALS_FILE


def load_credentials(path: Path | None = None) -> Credentials | None:
    """The stored credentials; None if there is no file. A file that is not what
    :func:`save_credentials` writes is a :class:`UsageError` naming it."""
    path = path or credentials_path()
    try:
        raw = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from exc
    with contextlib.suppress(OSError):
        if path.stat().st_mode & 0o077:
            log.warning("%s is readable by others (chmod 600 it): it holds an API key", path)
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise UsageError(f"{path} is not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise UsageError(f"{path} must hold a JSON object")
    url, key = data.get("api_url"), data.get("api_key")
    if not isinstance(url, str | None) or not isinstance(key, str | None):
        raise UsageError(f"{path}: api_url and api_key must be strings")
    return Credentials(api_url=url or None, api_key=key or None)


def save_credentials(credentials: Credentials, path: Path | None = None) -> Path:
    """Write ``credentials`` atomically with mode 0600 (the directory 0700); returns the path."""
    path = path or credentials_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    body = json.dumps({"api_url": credentials.api_url, "api_key": credentials.api_key},
                      indent=2) + "\n"
    # mkstemp creates the file 0600 before a byte of the key is in it.
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    tmp = Path(name)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(body)
            handle.flush()
            os.fsync(handle.fileno())
        tmp.chmod(0o600)
        tmp.replace(path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the rename itself survives a crash
    finally:
        os.close(dir_fd)
    return path


def resolve(api_url: str | None = None, api_key: str | None = None,
            sandbox_url: str | None = None, *, domain: str | None = None,
            environ: Mapping[str, str] | None = None,
            credentials_file: Path | None = None) -> ClientConfig:
    """The client's configuration: arguments, else environment, else the credentials file."""
    env = os.environ if environ is None else environ
    url = api_url or env.get("E2B_API_URL") or None
    key = api_key or env.get("E2B_API_KEY") or None
    if url is None or key is None:
        stored = load_credentials(credentials_file or credentials_path(env))
        # The stored key is for the stored URL: never send it to another node.
        if stored is not None and (url is None or _same(url, stored.api_url)):
            url = url or stored.api_url
            key = key or stored.api_key
    url = (url or DEFAULT_API_URL).rstrip("/")
    sandbox = (sandbox_url or env.get("E2B_SANDBOX_URL") or url).rstrip("/")
    return ClientConfig(api_url=url, api_key=key, sandbox_url=sandbox,
                        domain=domain or env.get("E2B_DOMAIN") or None)


def _same(a: str, b: str | None) -> bool:
    return b is not None and a.rstrip("/") == b.rstrip("/")
