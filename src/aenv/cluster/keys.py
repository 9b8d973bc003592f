"""Every Redis key cluster mode uses, in one place (``prefix`` separates clusters on one
Redis, and tests from each other)."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_PREFIX = "aenv"


@dataclass(frozen=True)
class Keys:
    prefix: str = DEFAULT_PREFIX

    @property
    def nodes(self) -> str:
        """Set of the ids of every node that ever sent a heartbeat (until it is removed)."""
        return f"{self.prefix}:nodes"

    def node(self, node_id: str) -> str:
        """Hash: the node's last heartbeat (``model.NodeInfo`` fields)."""
        return f"{self.prefix}:node:{node_id}"

    def roster(self, node_id: str) -> str:
        """Set: the sandbox ids the node ran at its last heartbeat."""
        return f"{self.prefix}:node:{node_id}:roster"

    def team_usage(self, node_id: str) -> str:
        """Hash: team id → what the team holds on the node, ``<stamp>:<sandboxes up>:<MB of
        memory>:<MB of disk>`` (``team_usage.py``; stamp: when it was measured, in ms)."""
        return f"{self.prefix}:node:{node_id}:teams"

    def pending(self, node_id: str) -> str:
        """Sorted set: open reservations on the node (member = reservation slot, score =
        expiry in ms on Redis's clock)."""
        return f"{self.prefix}:node:{node_id}:pending"

    def committed(self, node_id: str) -> str:
        """Sorted set: reservations whose create succeeded but which the node's heartbeat
        does not count yet (score = commit time in ms)."""
        return f"{self.prefix}:node:{node_id}:committed"

    def reservation(self, reservation_id: str) -> str:
        """Hash: which node a reservation is on and how many slots it holds."""
        return f"{self.prefix}:reservation:{reservation_id}"

    def binding(self, sandbox_id: str) -> str:
        """Hash: the node a sandbox is on and the binding's fencing token."""
        return f"{self.prefix}:binding:{sandbox_id}"

    def key_pending(self, key_id: str) -> str:
        """Sorted set: an API key's open reservations (member = reservation slot, score =
        expiry in ms), counted against its quota."""
        return f"{self.prefix}:key:{key_id}:pending"

    def key_sandboxes(self, key_id: str) -> str:
        """Sorted set: an API key's sandboxes (member = sandbox id, score = when its create
        was committed, in ms), counted against its quota until gone from every roster."""
        return f"{self.prefix}:key:{key_id}:sandboxes"

    @property
    def teams(self) -> str:
        """Hash: team id → the team (``TeamRow`` as JSON) (``team_directory.py``)."""
        return f"{self.prefix}:teams"

    @property
    def team_names(self) -> str:
        """Hash: team name → team id (names are unique)."""
        return f"{self.prefix}:team-names"

    @property
    def default_team(self) -> str:
        """String: the default team's id (set once, by the first node)."""
        return f"{self.prefix}:team-default"

    @property
    def credentials(self) -> str:
        """Hash: SHA-256 of a key or token → the credential (``CredentialRow`` as JSON)."""
        return f"{self.prefix}:credentials"

    @property
    def credentials_used(self) -> str:
        """Hash: credential id → its last use (Unix seconds)."""
        return f"{self.prefix}:credentials-used"

    @property
    def secrets(self) -> str:
        """Hash: secret id → the secret (``SecretRow`` as JSON, its value sealed)
        (``secret_store.py``)."""
        return f"{self.prefix}:secrets"

    def secret_names(self, team_id: str) -> str:
        """Hash: a team's secret names → secret ids (names are unique per team)."""
        return f"{self.prefix}:team:{team_id}:secret-names"

    def secret_order(self, team_id: str) -> str:
        """Sorted set, every score 0: a team's secret names, for listing them in order."""
        return f"{self.prefix}:team:{team_id}:secret-order"

    @property
    def webhooks(self) -> str:
        """Hash: webhook id → the webhook (``WebhookRow`` as JSON, its secret sealed)
        (``webhook_store.py``)."""
        return f"{self.prefix}:webhooks"

    def team_webhooks(self, team_id: str) -> str:
        """Sorted set: a team's webhook ids, scored by when each was made."""
        return f"{self.prefix}:team:{team_id}:webhooks"

    @property
    def audit(self) -> str:
        """Stream: the cluster's audit log, entry ``<seq>-0`` (``audit_store.py``)."""
        return f"{self.prefix}:audit"

    @property
    def audit_seq(self) -> str:
        """String: the last ``seq`` given to an audit entry."""
        return f"{self.prefix}:audit-seq"

    def team_held(self, team_id: str) -> str:
        """Sorted set: a team's starts in flight on any node (member = ``<hold>:<sandboxes>:
        <MB of memory>:<MB of disk>``, score = expiry in ms) (``team_usage.py``)."""
        return f"{self.prefix}:team:{team_id}:held"

    def team_starts(self, team_id: str) -> str:
        """String with a 2 s expiry: a team's starts in the current second, cluster-wide
        (``team_rate.py``), keyed by that second's number."""
        return f"{self.prefix}:team:{team_id}:starts"
