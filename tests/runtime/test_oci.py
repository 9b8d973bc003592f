"""config.json generation and the runsc error boundary (pure: no runsc needed)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from aenv.core.errors import CommandError, CommandTimeout, InvalidArgument, NotFound, RuntimeFailure
from aenv.network import slots
from aenv.runtime import oci
from aenv.runtime.base import SandboxSpec
from aenv.runtime.runsc import RunscConfig, map_runsc_errors

SPEC = SandboxSpec(
    sandbox_id="abcdefghij0123456789",
    rootfs=Path("/var/lib/aenv/sandboxes/abcdefghij0123456789/rootfs"),
    envd_bundle=Path("/var/lib/aenv/envd-bundle"),
    cpu_count=2,
    memory_mb=512,
    envd_args=("--user", "user"),
    env={"FOO": "bar"},
)
SLOT = slots.slot_for(5)


def config(**kwargs: Any) -> dict[str, Any]:
    return oci.sandbox_config(SPEC, SLOT, cgroups_path="/aenv/abcdefghij0123456789", **kwargs)


def test_envd_is_the_init_process_with_the_spec_arguments() -> None:
    process = config()["process"]
    assert process["args"] == [
        "/opt/aenv/envd/bin/envd", "--port", "49983", "--host", "0.0.0.0", "--remount-proc",
        "--own-boot-id", "--user", "user",
    ]
    # Restores find a container's saved host FDs by this name (see oci.CONTAINER_NAME).
    assert config()["annotations"][oci.CONTAINER_NAME_ANNOTATION] == oci.CONTAINER_NAME
    assert process["user"] == {"uid": 0, "gid": 0}
    assert "FOO=bar" in process["env"] and any(e.startswith("PATH=") for e in process["env"])


def test_resources_network_and_mounts() -> None:
    c = config(etc_mounts={"hosts": Path("/b/etc/hosts")})
    assert c["root"] == {"path": str(SPEC.rootfs), "readonly": False}
    linux = c["linux"]
    assert {"type": "network", "path": "/run/netns/aenv-5"} in linux["namespaces"]
    assert linux["cgroupsPath"] == "/aenv/abcdefghij0123456789"
    assert linux["resources"]["memory"] == {"limit": 512 * 1024 * 1024}
    assert linux["resources"]["cpu"]["quota"] == 2 * linux["resources"]["cpu"]["period"]
    assert linux["resources"]["pids"]["limit"] == oci.Limits().pids
    mounts = {m["destination"]: m for m in c["mounts"]}
    assert mounts["/opt/aenv/envd"]["source"] == str(SPEC.envd_bundle)
    assert "ro" in mounts["/opt/aenv/envd"]["options"]
    assert mounts["/etc/hosts"]["source"] == "/b/etc/hosts"
    assert "/etc/resolv.conf" not in mounts
    caps = c["process"]["capabilities"]["bounding"]
    assert "CAP_NET_RAW" not in caps and "CAP_NET_RAW" in config(net_raw=True)["process"][
        "capabilities"]["bounding"]


@pytest.mark.parametrize(
    "change",
    [{"env": {"A=B": "x"}}, {"hostname": "-bad"}, {"hostname": "a" * 64}, {"memory_mb": 1},
     {"cpu_count": 0}],
)
def test_bad_specs_are_refused(change: dict[str, Any]) -> None:
    spec = dataclasses.replace(SPEC, **change)
    with pytest.raises(InvalidArgument):
        oci.sandbox_config(spec, SLOT, cgroups_path="/x")


def test_etc_files_name_the_sandbox_and_its_dns() -> None:
    files = oci.etc_files(SPEC, SLOT, ("8.8.8.8",))
    assert files["hosts"].endswith("169.254.0.21\tsandbox\n")
    assert files["resolv.conf"] == "nameserver 8.8.8.8\n"
    assert "resolv.conf" not in oci.etc_files(SPEC, SLOT, ())


def test_runsc_flags_use_our_root_and_no_default_state() -> None:
    flags = RunscConfig(root=Path("/var/lib/aenv/runtime/runsc")).global_flags()
    assert "--root=/var/lib/aenv/runtime/runsc" in flags
    assert "--network=sandbox" in flags and "--platform=systrap" in flags


def test_unknown_containers_become_not_found() -> None:
    with pytest.raises(NotFound), map_runsc_errors("abc", "state"):
        raise CommandError(["runsc"], 128, "loading container: file does not exist")


def test_failures_carry_runsc_words_and_the_log_tail(tmp_path: Path) -> None:
    log = tmp_path / "console.log"
    log.write_text("creating container: cannot open netns: invalid argument\n")
    with pytest.raises(RuntimeFailure) as info, map_runsc_errors("abc", "run", log=log):
        raise CommandError(["runsc"], 128, "")
    assert "cannot open netns" in info.value.message
    assert isinstance(info.value.__cause__, CommandError)
    with pytest.raises(RuntimeFailure), map_runsc_errors("abc", "run"):
        raise CommandTimeout(["runsc"], None, "timed out after 60s")
