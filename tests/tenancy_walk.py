"""Walk every route of a node's OpenAPI with a second team's key against the first team's
objects (docs/teams.md): used on one node (tests/server/test_teams.py) and through a
cluster's gateway (tests/cluster/test_teams_cluster.py)."""

from __future__ import annotations

import re
from typing import Any

import httpx

#: Routes a key of another team may call successfully: they list or make the caller's own
#: things. Anything else naming team A's objects must answer 401, 403, 404 or 409 (a name in
#: one namespace); a listing must not show A's objects.
OWN = {
    ("GET", "/v2/sandboxes"), ("GET", "/sandboxes"), ("GET", "/snapshots"),
    ("GET", "/templates"), ("GET", "/volumes"), ("POST", "/volumes"), ("GET", "/audit"),
    ("GET", "/teams"), ("GET", "/api-keys"), ("POST", "/api-keys"),
    ("POST", "/access-tokens"), ("GET", "/secrets"), ("POST", "/secrets"),
    ("GET", "/sandboxes/metrics"), ("GET", "/events/webhooks"), ("POST", "/events/webhooks"),
}
PUBLIC = {("GET", "/health"), ("GET", "/.well-known/jwks.json"),
          ("GET", "/.well-known/openid-configuration")}
#: B's own creates from what is not A's: refused for the body they are sent (400/422).
OWN_INVALID = {("POST", "/sandboxes-cold")}


def make_objects(a: httpx.Client, sandbox_id: str, envd_token: str,
                 tag: str = "a") -> tuple[dict[str, str], set[str]]:
    """Team A's snapshot, template, volume, key and token (``a``: a client with A's key);
    their ids, and the secrets no other team may ever be shown."""
    snap = a.post(f"/sandboxes/{sandbox_id}/snapshots", json={"name": f"{tag}-snap"})
    assert snap.status_code == 201, snap.text
    template = a.post("/v3/templates", json={"name": f"{tag}-template"})
    assert template.status_code == 202, template.text
    volume = a.post("/volumes", json={"name": f"{tag}-volume"})
    assert volume.status_code == 201, volume.text
    secret = a.post("/secrets", json={"name": f"{tag}-openai", "value": f"sk-{tag}-v4lu3"})
    assert secret.status_code == 201, secret.text
    assert "v4lu3" not in secret.text
    hook = a.post("/events/webhooks", json={"name": f"{tag}-hook", "url": "http://127.0.0.1:9/",
                                             "signatureSecret": f"whsec-{tag}-h00k"})
    assert hook.status_code == 201, hook.text
    key = a.post("/api-keys", json={"name": f"{tag}-ci"})
    token = a.post("/access-tokens", json={"name": f"{tag}-cli"})
    assert key.status_code == token.status_code == 201, (key.text, token.text)
    teams = a.get("/teams").json()
    ids = {
        "sandbox_id": sandbox_id, "snapshot_id": snap.json()["snapshotID"],
        "template_id": template.json()["templateID"], "template_name": f"{tag}-template",
        "build_id": template.json()["buildID"], "volume_id": volume.json()["volumeID"],
        "team_id": next(t["teamID"] for t in teams if t["isDefault"]),
        "api_key_id": key.json()["id"], "access_token_id": token.json()["id"],
        "secret_id": secret.json()["secretID"], "webhook_id": hook.json()["id"],
    }
    return ids, {key.json()["key"], token.json()["token"], envd_token, f"sk-{tag}-v4lu3",
                 f"whsec-{tag}-h00k"}


def _body_for(method: str, path: str, ids: dict[str, str]) -> dict[str, Any] | None:
    """A well-formed body that names team A's objects where the route takes one."""
    bodies: dict[tuple[str, str], dict[str, Any]] = {
        ("POST", "/v2/sandboxes"): {"templateID": ids["snapshot_id"]},
        ("POST", "/sandboxes"): {"templateID": ids["template_name"]},
        ("POST", "/v3/templates"): {"name": ids["template_name"]},
        ("POST", "/templates/tags"): {"target": ids["template_name"], "tags": ["x"]},
        ("DELETE", "/templates/tags"): {"name": ids["template_name"], "tags": ["x"]},
        ("POST", "/volumes"): {"name": "b-own-volume"},
        ("POST", "/api-keys"): {"name": "b-second"},
        ("POST", "/access-tokens"): {"name": "b-token"},
        ("POST", "/secrets"): {"name": "b-secret", "value": "b-value"},
        ("POST", "/secrets/{secret_id}"): {"value": "overwritten"},
        ("POST", "/teams"): {"name": "b-made"},
        ("POST", "/events/webhooks"): {"name": "b-hook", "url": "http://127.0.0.1:9/b"},
        ("PATCH", "/events/webhooks/{webhook_id}"): {"url": "http://127.0.0.1:9/stolen"},
        # B's own create, from an image: a malformed reference (no registry is reached).
        ("POST", "/sandboxes-cold"): {"image": "Not A Reference"},
        ("POST", "/sandboxes/{sandbox_id}/timeout"): {"timeout": 100},
        ("POST", "/sandboxes/{sandbox_id}/connect"): {"timeout": 100},
        ("PUT", "/sandboxes/{sandbox_id}/network"): {"allowOut": ["10.0.0.1"]},
        ("PATCH", "/api-keys/{api_key_id}"): {"name": "stolen"},
        ("PATCH", "/teams/{team_id}"): {"quota": {"maxSandboxes": 1}},
        ("POST", "/admin/teams/{team_id}/api-keys"): {"name": "stolen"},
        ("POST", "/v2/templates/{template_id}/builds/{build_id}"): {"fromImage": "alpine"},
        ("PATCH", "/volumecontent/{volume_id}/path"): {"mode": 420},
    }
    return bodies.get((method, path), {} if method in ("POST", "PUT", "PATCH") else None)


def _fill(path: str, ids: dict[str, str]) -> str:
    values = {
        "sandbox_id": ids["sandbox_id"], "template_id": ids["template_id"],
        "alias": ids["template_name"], "build_id": ids["build_id"],
        "volume_id": ids["volume_id"], "team_id": ids["team_id"],
        "api_key_id": ids["api_key_id"], "access_token_id": ids["access_token_id"],
        "secret_id": ids["secret_id"], "webhook_id": ids["webhook_id"],
        "files_hash": "a" * 64, "digest": "sha256:" + "b" * 64,
    }
    filled = re.sub(r"\{(\w+)(:path)?\}", lambda m: values[m.group(1)], path)
    assert "{" not in filled, path
    # The volume content routes name the file in the query; the batch metrics A's sandbox.
    if path == "/sandboxes/metrics":
        return f"{filled}?sandbox_ids={ids['sandbox_id']}"
    if path == "/teams/{team_id}/metrics/max":  # well-formed: the refusal is for the team
        return f"{filled}?metric=concurrent_sandboxes"
    return filled + ("?path=/a" if path.startswith("/volumecontent/") else "")


def walk(b: httpx.Client, spec: dict[str, Any], ids: dict[str, str], secrets: set[str],
         team_b: str) -> int:
    """Every route of ``spec`` called with B's client; how many were called."""
    walked = 0
    for path, operations in spec["paths"].items():
        for method in operations:
            method = method.upper()
            if (method, path) in PUBLIC:
                continue
            url = _fill(path, ids)
            body = _body_for(method, path, ids)
            answer = b.request(method, url, json=body) if body is not None \
                else b.request(method, url)
            walked += 1
            shown = answer.text
            for secret in secrets - {""}:
                assert secret not in shown, (method, path)
            if (method, path) in OWN_INVALID:
                assert answer.status_code in (400, 422), (method, path, shown)
            elif (method, path) == ("GET", "/audit"):
                # B's own log: its tries (which name A's ids), none of A's entries.
                entries = answer.json()["entries"]
                assert {e["teamID"] for e in entries} <= {team_b}, entries
            elif (method, path) in OWN:
                assert answer.status_code in (200, 201), (method, path, shown)
                for object_id in ids.values():
                    assert object_id not in shown, (method, path, object_id, shown)
            else:
                assert answer.status_code in (401, 403, 404, 409), (
                    method, path, answer.status_code, shown)
    return walked
