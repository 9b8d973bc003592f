"""Inbound traffic as E2B's ``network`` config shapes it, through the official SDK: with
``allow_public_traffic=False`` a sandbox's own ports answer only requests carrying its
traffic access token (the create answer's ``trafficAccessToken``; 403 otherwise, and a paused
sandbox is not woken by one without it), envd's port is unaffected, every sandbox has its
own token, the egress update keeps the setting; ``mask_request_host`` is the Host the
sandbox's server sees."""

from __future__ import annotations

import httpx
from e2b import Sandbox

from tests.server.harness import API_KEY, NodeServer
from tests.server.test_lifecycle import wait_for

HEADER = "e2b-traffic-access-token"
#: Prints the request's Host and path, on port 8080.
ECHO_HOST = (
    "import http.server\n"
    "class H(http.server.BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        body = (self.headers['Host'] + ' ' + self.path).encode()\n"
    "        self.send_response(200); self.send_header('Content-Length', str(len(body)))\n"
    "        self.end_headers(); self.wfile.write(body)\n"
    "http.server.HTTPServer(('0.0.0.0', 8080), H).serve_forever()\n"
)


def _get(server: NodeServer, sbx: Sandbox, path: str = "/x", **headers: str) -> httpx.Response:
    return httpx.get(f"{server.url}{path}", headers={"Host": sbx.get_host(8080), **headers},
                     timeout=10)


def _serve(server: NodeServer, sbx: Sandbox, token: str | None) -> None:
    sbx.files.write("/tmp/echo.py", ECHO_HOST)
    sbx.commands.run("python3 /tmp/echo.py", background=True, timeout=0)
    extra = {HEADER: token} if token else {}
    wait_for("the user's server", lambda: _get(server, sbx, **extra).status_code == 200)


def test_private_ports_need_the_sandbox_s_traffic_token(server: NodeServer) -> None:
    sbx = Sandbox.create(timeout=120, network={"allow_public_traffic": False,
                                                "mask_request_host": "app.internal:${PORT}"})
    other = Sandbox.create(timeout=120, network={"allow_public_traffic": False})
    public = Sandbox.create(timeout=120)
    try:
        token = sbx.traffic_access_token
        assert token and other.traffic_access_token and token != other.traffic_access_token
        assert public.traffic_access_token is None
        _serve(server, sbx, token)
        ok = _get(server, sbx, "/hello", **{HEADER: token})
        # The Host the user's server sees is the mask, ${PORT} filled in.
        assert ok.status_code == 200 and ok.text == "app.internal:8080 /hello"
        for headers in ({}, {HEADER: "wrong"}, {HEADER: other.traffic_access_token}):
            refused = _get(server, sbx, **headers)
            assert refused.status_code == 403, refused.text
            assert refused.json()["code"] == 403 and "traffic access token" in (
                refused.json()["message"])
        # envd's port has its own token: the SDK's commands and files work as ever.
        assert sbx.commands.run("echo fine").stdout == "fine\n"
        # Connect hands out the same token.
        assert Sandbox.connect(sbx.sandbox_id).traffic_access_token == token
        # An egress update replaces the egress rules, not the inbound settings.
        with httpx.Client(base_url=server.url, headers={"X-API-KEY": API_KEY}) as api:
            assert api.put(f"/sandboxes/{sbx.sandbox_id}/network",
                           json={"denyOut": ["10.0.0.0/8"]}).status_code == 204
            bad = api.post("/sandboxes", json={"templateID": "base",
                                               "network": {"allowPublicTraffic": "no"}})
            assert bad.status_code == 400, bad.text
        assert _get(server, sbx).status_code == 403
        assert _get(server, sbx, **{HEADER: token}).status_code == 200
        # A sandbox that resumes on traffic is not woken by a request without the token.
        sleeper = Sandbox.create(timeout=120, network={"allow_public_traffic": False},
                                 lifecycle={"on_timeout": "pause", "auto_resume": True})
        try:
            _serve(server, sleeper, sleeper.traffic_access_token)
            sleeper.pause()
            assert _get(server, sleeper).status_code == 403
            assert Sandbox.get_info(sleeper.sandbox_id).state.value == "paused"
            woken = _get(server, sleeper, **{HEADER: sleeper.traffic_access_token or ""})
            assert woken.status_code == 200, woken.text
        finally:
            sleeper.kill()
        # A public sandbox's ports take anyone (no token asked).
        _serve(server, public, None)
        assert _get(server, public).status_code == 200
    finally:
        for s in (sbx, other, public):
            s.kill()
