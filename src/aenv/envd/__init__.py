"""envd: the daemon that runs inside every sandbox on port 49983.

It speaks E2B's envd protocol (Connect-RPC ``process.Process`` and ``filesystem.Filesystem``,
plus plain HTTP ``/files``, ``/health``, ``/init``, ``/envs``, ``/metrics``) so the official
E2B SDKs work unchanged. It must not import anything host-side (settings, CLI, pydantic): it is
shipped as a self-contained bundle into images that may have no Python at all.
"""

ENVD_VERSION = "0.6.13"
DEFAULT_PORT = 49983
