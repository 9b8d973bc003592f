"""The nft ruleset as text: policies, the static table, idempotent per-slot scripts."""

from __future__ import annotations

import subprocess

import pytest

from aenv.core.errors import InvalidArgument
from aenv.core.net import EgressPolicy
from aenv.network import nft


def test_default_policy_denies_internal_ranges_then_allows() -> None:
    assert nft.policy_rules(EgressPolicy()) == ["ip daddr @internal drop", "accept"]


def test_no_internet_drops_all_but_allow_out() -> None:
    rules = nft.policy_rules(
        EgressPolicy(allow_internet=False, allow_out=("10.1.2.3", "10.1.0.0/16"))
    )
    assert rules == ["ip daddr { 10.1.0.0/16 } accept", "drop"]


def test_deny_out_comes_after_allow_out_and_ipv6_is_ignored() -> None:
    rules = nft.policy_rules(
        EgressPolicy(allow_out=("1.2.3.4",), deny_out=("0.0.0.0/0", "2001:db8::/32"))
    )
    assert rules[:2] == ["ip daddr { 1.2.3.4/32 } accept", "ip daddr { 0.0.0.0/0 } drop"]


@pytest.mark.parametrize("bad", ["example.com", "1.2.3.4/33", "", "1.2.3.4; flush ruleset"])
def test_policy_entries_are_addresses_only(bad: str) -> None:
    with pytest.raises(InvalidArgument):
        nft.policy_rules(EgressPolicy(deny_out=(bad,)))


def test_never_reachable_ranges_include_metadata_and_return_range() -> None:
    table = nft.render_table(return_net="198.18.0.0/15")
    never = next(line for line in table.splitlines() if "set never" in line)
    for cidr in ("127.0.0.0/8", "169.254.0.0/16", "198.18.0.0/15", "0.0.0.0/8"):
        assert cidr in never


def test_digest_follows_the_content() -> None:
    a = nft.render_table()
    assert nft.digest_of(a) == nft.digest_of(nft.render_table())
    assert nft.digest_of(a) != nft.digest_of(nft.render_table(internal=("10.0.0.0/8",)))


def test_removal_script_first_adds_what_it_deletes() -> None:
    entry = nft.SlotEntry(index=7, ifname="aenv-h7", return_ip="198.18.0.7")
    script = nft.remove_slot_script(entry).splitlines()
    assert script[0] == "add chain inet aenv slot_7"
    assert script[-1] == "delete chain inet aenv slot_7"
    assert any(line.startswith("delete element inet aenv zone_of_if") for line in script)


def test_the_table_is_valid_nft() -> None:
    """``nft -c`` parses and type-checks without changing anything (needs root)."""
    table = nft.render_table().replace("table inet aenv ", "table inet aenvcheck ", 1)
    entry = nft.SlotEntry(index=7, ifname="aenv-h7", return_ip="198.18.0.7")
    slot = nft.add_slot_script(entry, EgressPolicy(allow_out=("10.0.0.0/8",)))
    script = table + slot.replace("inet aenv ", "inet aenvcheck ")
    done = subprocess.run(["nft", "-c", "-f", "-"], input=script, text=True, capture_output=True)
    assert done.returncode == 0, done.stderr
