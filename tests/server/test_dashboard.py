"""The web dashboard (docs/dashboard.md) in a real headless browser: Debian's Chromium driven
by Selenium WebDriver, against a node with the fake runtime.

- The static files: served without a key, with the CSP and friends; anything else 404 with
  E2B's error body.
- Signing in: the key typed into the form; it is in no URL the browser ever asked for (the
  address after every step and every request in Chromium's performance log), the API calls
  carry it as ``X-API-KEY``; a reload keeps the tab signed in, a reload without the
  session storage shows the sign-in form again.
- The list (three sandboxes made through the API), a metadata filter, a sandbox's page: the
  chart draws polled ``/metrics`` samples, the log tail shows its lifecycle; pause, resume,
  fork and kill (through the in-page confirmation) do what they say, checked through the API.
- An API error shows in the banner; a team's key sees no node capacity (403, no banner).
- At scale: ``SCALE`` sandboxes behind the list (made concurrently; the time is printed), the
  first page in the DOM within 1 s of the click, one list request per page, every page walked
  with next and back with previous.

Screenshots of each step go to ``$AENV_TEST_ARTIFACTS`` (else the test's tmp dir; printed).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import httpx
import pytest
from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from tests.server.harness import API_KEY, NodeServer, serving, slot_base

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

# Selenium Manager must not look for drivers online: Debian's are named below.
os.environ.setdefault("SE_OFFLINE", "true")
CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")
# make test installs both (scripts/install-system-deps.sh): missing, the suite fails here.
assert CHROMIUM and CHROMEDRIVER, "needs Debian's chromium and chromium-driver"

#: Sandboxes behind the list in the scale test. Each is a real (fake-runtime) sandbox made
#: through the API: ~3-5 a second to create and ~4 to kill on a loaded 2-core machine (a
#: network slot and an overlay root each), so the default keeps the file near 3 minutes;
#: AENV_TEST_DASHBOARD_SCALE=1000 runs the full size (see docs/dashboard.md for its times).
SCALE = int(os.environ.get("AENV_TEST_DASHBOARD_SCALE", "110"))
#: The first page must be in the DOM this soon after the click (ms, measured by the page).
FIRST_PAGE_MS = 1000.0
#: Creates in flight at once for the scale test: more made the node's 30 s wait for a fake
#: guest's envd run out at about a thousand sandboxes (every one of them probed meanwhile).
CREATING = 6


# -- fixtures ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    given = os.environ.get("AENV_TEST_ARTIFACTS")
    where = Path(given) / "dashboard" if given else tmp_path_factory.mktemp("dashboard")
    where.mkdir(parents=True, exist_ok=True)
    print(f"dashboard screenshots: {where}")
    return where


class Browser:
    """A headless Chromium and what it asked for (its performance log, drained as we go)."""

    def __init__(self, base: str, artifacts: Path) -> None:
        options = Options()
        options.binary_location = CHROMIUM or ""
        for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--window-size=1400,1000", "--no-first-run", "--no-default-browser-check",
                    "--disable-background-networking", "--disable-component-update",
                    "--disable-sync", "--disable-default-apps", "--disable-extensions",
                    "--disable-domain-reliability", "--metrics-recording-only", "--no-pings",
                    "--disable-features=Translate,OptimizationHints,MediaRouter",
                    # Nothing leaves the machine: every non-loopback request meets a dead proxy.
                    "--proxy-server=http://127.0.0.1:9"):
            options.add_argument(arg)
        options.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
        self.driver: WebDriver = webdriver.Chrome(options=options,
                                                  service=Service(CHROMEDRIVER or ""))
        self.driver.set_page_load_timeout(30)
        self.base = base
        self.artifacts = artifacts
        self.requests: list[dict[str, Any]] = []
        self.addresses: list[str] = []
        self.shots = 0

    def close(self) -> None:
        self.driver.quit()

    # What the browser did ----------------------------------------------------------------

    def drain(self) -> None:
        self.addresses.append(self.driver.current_url)
        for entry in self.driver.get_log("performance"):
            message = json.loads(entry["message"])["message"]
            if message["method"] == "Network.requestWillBeSent":
                self.requests.append(message["params"])

    def urls(self) -> list[str]:
        self.drain()
        seen = list(self.addresses)
        for params in self.requests:
            seen += [params["request"]["url"], params.get("documentURL", "")]
        return seen

    def list_requests(self, since: int) -> list[str]:
        """The sandbox list requests (not the paused count's) sent since ``since``."""
        self.drain()
        urls = [p["request"]["url"] for p in self.requests[since:]]
        return [u for u in urls if "/v2/sandboxes?" in u and "state=paused&" not in u]

    def assert_key_in_no_url(self) -> None:
        for url in self.urls():
            for form in (API_KEY, API_KEY[4:20]):
                assert form not in url and form not in unquote(url), url

    # Driving the page --------------------------------------------------------------------

    def shot(self, name: str) -> None:
        self.shots += 1
        self.driver.save_screenshot(str(self.artifacts / f"{self.shots:02d}-{name}.png"))
        self.assert_key_in_no_url()  # after every step

    def find(self, test: str) -> Any:
        return self.driver.find_element(By.CSS_SELECTOR, f'[data-test="{test}"]')

    def all(self, test: str) -> list[Any]:
        return self.driver.find_elements(By.CSS_SELECTOR, f'[data-test="{test}"]')

    def until(self, check: Callable[[], Any], timeout: float = 15, what: str = "") -> Any:
        def probe(_: Any) -> Any:
            try:
                return check()
            except Exception:  # an element not there yet, or going away
                return None
        try:
            return WebDriverWait(self.driver, timeout, poll_frequency=0.05).until(probe)
        except Exception:
            self.shot(f"failed-{what or 'wait'}")
            banner = self.find("error-banner")
            raise AssertionError(f"timed out waiting for {what}; banner: "
                                 f"{banner.get_attribute('textContent')!r}") from None

    def js(self, script: str, *args: Any) -> Any:
        return self.driver.execute_script(script, *args)

    def open(self, fragment: str = "") -> None:
        self.driver.get(f"{self.base}/dashboard{fragment}")
        self.until(lambda: self.js("return document.body.dataset.ready") == "1", what="page")

    def sign_in(self, key: str) -> None:
        self.until(lambda: self.find("signin-key").is_displayed(), what="sign-in form")
        field = self.find("signin-key")
        field.clear()
        field.send_keys(key)
        self.find("signin-submit").click()
        self.until(lambda: not self.find("signin").is_displayed(), what="signed in")

    def row_ids(self) -> list[str]:
        return [str(i) for i in self.js(
            "return [...document.querySelectorAll('[data-test=sandbox-row]')]"
            ".map(r => r.dataset.id)")]

    def generation(self) -> int:
        return int(self.find("sandbox-table").get_attribute("data-generation") or 0)

    def settle(self) -> None:
        """Wait for the last list load's follow-up calls (paused count, live usage): a timed
        click then measures its own load, not the node still answering the previous one's."""
        self.until(lambda: self.find("sandbox-table").get_attribute("data-settled")
                   == str(self.generation()), timeout=30, what="the list settled")

    def banner(self) -> str | None:
        banner = self.find("error-banner")
        return banner.get_attribute("textContent").strip() if banner.is_displayed() else None


@pytest.fixture
def browser_for(artifacts: Path) -> Iterator[Callable[[NodeServer], Browser]]:
    made: list[Browser] = []

    def make(node: NodeServer) -> Browser:
        made.append(Browser(node.url, artifacts))
        return made[-1]

    yield make
    for browser in made:
        browser.close()


@pytest.fixture(scope="module")
def node() -> Iterator[NodeServer]:
    with serving(runtime="fake", net_pool_size="4", warm_pool_size="0",
                 precreate_pool_size="0") as server:
        yield server


def _api(node: NodeServer, key: str = API_KEY) -> httpx.Client:
    return httpx.Client(base_url=node.url, headers={"X-API-KEY": key}, timeout=60)


# -- the static files ----------------------------------------------------------------------

def test_the_files_are_served_without_a_key_and_locked_down(node: NodeServer) -> None:
    with httpx.Client(base_url=node.url, timeout=30) as anyone:
        for path, kind in (("/dashboard", "text/html"), ("/dashboard/", "text/html"),
                           ("/dashboard/index.html", "text/html"),
                           ("/dashboard/app.js", "text/javascript"),
                           ("/dashboard/app.css", "text/css")):
            answer = anyone.get(path)
            assert answer.status_code == 200, (path, answer.text)
            assert answer.headers["content-type"].startswith(kind), path
            assert answer.headers["cache-control"] == "no-cache"
            assert answer.headers["x-content-type-options"] == "nosniff"
            csp = answer.headers["content-security-policy"]
            assert "default-src 'self'" in csp and "script-src 'self'" in csp
            assert "frame-ancestors 'none'" in csp and "unsafe" not in csp
        page = anyone.get("/dashboard").text
        assert "http://" not in page and "https://" not in page  # nothing remote
        for path in ("/dashboard/__init__.py", "/dashboard/nothing.js", "/dashboard/..%2Fapp.py",
                     "/dashboard/a/b"):
            missing = anyone.get(path)
            assert missing.status_code == 404, (path, missing.text)
            assert missing.json()["code"] == 404
        # The API itself still wants a key.
        assert anyone.get("/v2/sandboxes").status_code == 401


# -- signing in, one sandbox, its actions ----------------------------------------------------

def test_sign_in_list_open_act_and_kill(node: NodeServer,
                                        browser_for: Callable[[NodeServer], Browser]) -> None:
    with _api(node) as api:
        made = [api.post("/sandboxes", json={"templateID": "base",
                                             "metadata": {"suite": "dashboard", "n": str(i)}}
                         ).json()["sandboxID"] for i in range(3)]
    b = browser_for(node)
    b.open()
    assert b.find("signin-key").is_displayed()
    assert not b.find("sandbox-table").is_displayed()
    b.shot("sign-in")

    b.sign_in(API_KEY)
    b.until(lambda: set(made) <= set(b.row_ids()), what="the three sandboxes listed")
    assert int(b.find("count-running").text) >= 3
    b.until(lambda: b.find("count-paused").text == "0", what="the paused count")
    first = next(r for r in b.all("sandbox-row") if r.get_attribute("data-id") == made[0])
    assert "running" in first.text and "suite=dashboard" in first.text and "base" in first.text
    b.until(lambda: "MiB /" in next(r for r in b.all("sandbox-row")
                                    if r.get_attribute("data-id") == made[0]).text,
            what="the page's live memory use")
    b.shot("list")
    # The key is kept in the tab's session storage and nowhere else the page could leak it.
    assert b.js("return sessionStorage.getItem('aenv.dashboard.apiKey')") == API_KEY
    assert b.js("return localStorage.length") == 0
    assert b.js("return document.cookie") == ""
    b.drain()
    calls = [p["request"] for p in b.requests if "/v2/sandboxes?" in p["request"]["url"]]
    assert calls and all(c["headers"].get("X-API-KEY") == API_KEY for c in calls), calls[:1]

    # A reload keeps the tab signed in; without the session storage it asks again.
    b.driver.refresh()
    b.until(lambda: set(made) <= set(b.row_ids()), what="the list after a reload")
    b.js("sessionStorage.clear()")
    b.driver.refresh()
    b.until(lambda: b.find("signin-key").is_displayed(), what="sign-in after losing the key")
    assert not b.find("sandbox-table").is_displayed()
    b.shot("signed-out-by-reload")
    b.sign_in(API_KEY)

    # The metadata filter.
    b.until(lambda: b.find("filter-metadata").is_displayed())
    b.find("filter-metadata").send_keys("suite=dashboard, n=1")
    before = b.generation()
    b.find("filter-apply").click()
    b.until(lambda: b.generation() > before, what="the filtered list")
    assert b.row_ids() == [made[1]]
    b.shot("filtered")
    b.find("filter-metadata").clear()
    b.find("filter-apply").click()
    b.until(lambda: len(b.row_ids()) >= 3)

    # One sandbox: detail, a chart of polled samples, the log tail.
    target = made[0]
    next(r for r in b.all("sandbox-row") if r.get_attribute("data-id") == target).click()
    b.until(lambda: b.find("sandbox-id").text == target, what="the sandbox's page")
    assert b.driver.current_url.endswith(f"#sandbox/{target}")
    b.until(lambda: "running" in b.find("sandbox-detail").text, what="its detail")
    assert "suite=dashboard" in b.find("sandbox-detail").text
    b.until(lambda: int(b.find("metrics-chart").get_attribute("data-points")) > 1,
            timeout=20, what="two metric samples drawn")
    assert "memory 45 MiB /" in b.find("chart-now").text  # the fake guest's idle sample
    # The canvas really has ink on it (not only the attribute).
    inked = b.js("const c = document.querySelector('[data-test=metrics-chart]');"
                 "const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;"
                 "let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i]) n++; return n;")
    assert inked > 1000
    b.until(lambda: "sandbox created" in b.find("log-area").text, what="its logs")
    b.shot("sandbox")

    # Pause, resume, fork: the buttons and the API agree.
    b.find("action-pause").click()
    b.until(lambda: b.find("sandbox-state").text == "paused", what="paused")
    with _api(node) as api:
        assert api.get(f"/sandboxes/{target}").json()["state"] == "paused"
    b.until(lambda: "sandbox paused" in b.find("log-area").text, what="the pause logged")
    b.until(lambda: b.find("action-resume").is_enabled())
    b.find("action-resume").click()
    b.until(lambda: b.find("sandbox-state").text == "running", what="resumed")
    b.until(lambda: "sandbox resumed" in b.find("log-area").text, what="the resume logged")
    b.until(lambda: b.find("action-fork").is_enabled())
    b.find("action-fork").click()
    notice = b.until(lambda: b.find("notice").text if "Forked" in b.find("notice").text
                     else None, what="the fork's notice")
    child = notice.split(" into ")[1].rstrip(".")
    with _api(node) as api:
        assert api.get(f"/sandboxes/{child}").status_code == 200, notice
    b.shot("acted")

    # Kill: asks first (in the page), then the sandbox is gone.
    b.find("action-kill").click()
    b.until(lambda: b.find("kill-confirm").is_displayed(), what="the kill confirmation")
    with _api(node) as api:
        assert api.get(f"/sandboxes/{target}").status_code == 200  # not yet
    b.shot("kill-confirm")
    b.find("kill-confirm").click()
    b.until(lambda: b.driver.current_url.endswith("#sandboxes"), what="back to the list")
    b.until(lambda: target not in b.row_ids() and made[1] in b.row_ids(),
            what="the list without it")
    with _api(node) as api:
        assert api.get(f"/sandboxes/{target}").status_code == 404
    assert b.banner() is None
    b.shot("killed")

    # An API error is shown, not swallowed.
    b.driver.get(f"{node.url}/dashboard#sandbox/{target}")
    b.until(lambda: "404" in (b.banner() or ""), what="the error banner")
    assert target in b.banner()
    b.shot("error-banner")
    b.find("error-close").click()
    assert b.banner() is None

    # Templates and a build's logs (a build asked for, not started: waiting, no lines yet),
    # node capacity (the operator key), events.
    with _api(node) as api:
        template = api.post("/v3/templates", json={"name": "dash-template"}).json()
    b.find("tab-templates").click()
    b.until(lambda: any(r.get_attribute("data-id") == template["templateID"]
                        for r in b.all("template-row")), what="the template")
    row = next(r for r in b.all("template-row")
               if r.get_attribute("data-id") == template["templateID"])
    assert "dash-template" in row.text and "waiting" in row.text
    row.click()
    b.until(lambda: b.find("build-status").text == "waiting", what="its build")
    assert "no log lines yet" in b.find("build-logs").text
    b.shot("templates")
    b.find("tab-node").click()
    b.until(lambda: b.find("node-pools").text.strip() != "", what="the node's pools")
    assert "network slots ready" in b.find("node-pools").text
    b.until(lambda: len(b.all("loop-table")[0].find_elements(By.TAG_NAME, "tr")) > 0)
    b.shot("node")
    b.find("tab-events").click()
    b.until(lambda: "sandbox created" in b.find("event-table").text, what="recent events")
    b.until(lambda: int(b.find("team-chart").get_attribute("data-points")) > 0,
            what="the team's series")
    b.shot("events")

    # A team's key: its own (empty) list, no node capacity, and no error for it.
    with _api(node) as api:
        team_key = api.post("/teams", json={"name": "dashboard-team"}).json()["apiKey"]
    b.find("signout").click()
    b.until(lambda: b.find("signin-key").is_displayed(), what="signed out")
    assert b.js("return sessionStorage.length") == 0
    b.driver.get(f"{node.url}/dashboard#sandboxes")
    b.sign_in(team_key)
    b.until(lambda: "No sandboxes" in b.find("sandbox-table").text, what="the team's list")
    b.find("tab-node").click()
    b.until(lambda: b.find("node-denied").is_displayed(), what="capacity hidden")
    assert b.banner() is None
    b.shot("team-key")

    # A wrong key: the banner, and back to the sign-in form.
    b.find("signout").click()
    b.until(lambda: b.find("signin-key").is_displayed(), what="signed out again")
    b.find("signin-key").send_keys("e2b_" + "f" * 40)
    b.find("signin-submit").click()
    b.until(lambda: "401" in (b.banner() or "") and b.find("signin-key").is_displayed(),
            what="a wrong key refused")
    b.shot("wrong-key")

    # The page kept to its own policy: no inline script or style, nothing from elsewhere.
    console = [e["message"] for e in b.driver.get_log("browser")]
    assert not [m for m in console if "Content Security Policy" in m], console
    b.assert_key_in_no_url()
    for key in (API_KEY, team_key):
        assert all(key not in u for u in b.urls())
    with _api(node) as api:
        for sandbox_id in [*made[1:], child]:
            api.delete(f"/sandboxes/{sandbox_id}")


# -- no answer ---------------------------------------------------------------------------------

#: Makes the page's next ``n`` fetches of ``method`` fail as a connection the browser reused
#: and found reset does (TypeError "Failed to fetch"), and counts every fetch by method.
FAIL_NEXT_FETCHES = """
const [method, n] = arguments;
if (!window.realFetch) window.realFetch = window.fetch;
window.toFail = { method, left: n };
window.fetches = { GET: 0, POST: 0, DELETE: 0 };
window.fetch = (url, init) => {
  const m = (init && init.method) || "GET";
  window.fetches[m] = (window.fetches[m] || 0) + 1;
  if (m === window.toFail.method && window.toFail.left > 0) {
    window.toFail.left--;
    return Promise.reject(new TypeError("Failed to fetch"));
  }
  return window.realFetch(url, init);
};
"""


def test_a_read_without_an_answer_is_tried_again_an_action_is_not(
        node: NodeServer, browser_for: Callable[[NodeServer], Browser]) -> None:
    with _api(node) as api:
        sid = api.post("/sandboxes", json={"templateID": "base",
                                           "metadata": {"suite": "no-answer"}}).json()["sandboxID"]
    b = browser_for(node)
    b.open()
    b.sign_in(API_KEY)
    b.until(lambda: sid in b.row_ids(), what="the sandbox listed")
    b.settle()

    # Two lost answers: the third try lists, and the banner never shows.
    b.js(FAIL_NEXT_FETCHES, "GET", 2)
    before = b.generation()
    b.find("refresh").click()
    b.until(lambda: b.generation() > before, what="the list after two lost answers")
    assert b.banner() is None
    assert b.js("return window.toFail.left") == 0 and sid in b.row_ids()

    # Three lost answers: the page says so.
    b.settle()
    b.js(FAIL_NEXT_FETCHES, "GET", 3)
    b.find("refresh").click()
    b.until(lambda: "could not be reached" in (b.banner() or ""), what="the banner")
    assert "GET /v2/sandboxes → no answer" in (b.banner() or "")
    assert b.js("return window.fetches.GET") == 3

    # An action whose answer is lost is not sent again: the node may have taken it.
    b.open(f"#sandbox/{sid}")
    b.until(lambda: b.find("action-pause").is_enabled(), what="the pause button")
    b.js(FAIL_NEXT_FETCHES, "POST", 1)
    b.find("action-pause").click()
    b.until(lambda: "POST" in (b.banner() or ""), what="the pause's banner")
    assert "no answer" in (b.banner() or "")
    assert b.js("return window.fetches.POST") == 1
    with _api(node) as api:
        assert api.get(f"/sandboxes/{sid}").json()["state"] == "running"
        assert api.delete(f"/sandboxes/{sid}").status_code == 204


# -- at scale --------------------------------------------------------------------------------

async def _create_many(url: str, count: int) -> list[str]:
    async with httpx.AsyncClient(base_url=url, headers={"X-API-KEY": API_KEY}, timeout=300,
                                 limits=httpx.Limits(max_connections=CREATING)) as client:
        gate = asyncio.Semaphore(CREATING)

        async def one(i: int) -> str:
            async with gate:
                # An hour's lifetime: none may reach its end (and pause) while the rest are made.
                answer = await client.post("/sandboxes", json={
                    "templateID": "base", "timeout": 3600,
                    "metadata": {"scale": "yes", "i": str(i)}})
                assert answer.status_code == 201, answer.text
                return str(answer.json()["sandboxID"])

        return list(await asyncio.gather(*(one(i) for i in range(count))))


@pytest.fixture(scope="module")
def big_node() -> Iterator[NodeServer]:
    # The top of this session's slot block: the harness gives servers ranges from its bottom,
    # 100 at a time, and a whole suite starts fewer than 90 (tests/server/harness.py).
    first = slot_base() + 9000
    with serving(runtime="fake", warm_pool_size="0", precreate_pool_size="0",
                 net_pool_size="32", max_sandboxes=str(SCALE + 50),
                 net_first_index=str(first), net_last_index=str(first + SCALE + 200)) as server:
        yield server


@pytest.mark.timeout(max(600, 120 + SCALE))
def test_the_first_page_of_many_renders_fast_and_pages_one_at_a_time(
        big_node: NodeServer, browser_for: Callable[[NodeServer], Browser]) -> None:
    began = time.monotonic()
    made = asyncio.run(_create_many(big_node.url, SCALE))
    print(f"created {SCALE} fake sandboxes in {time.monotonic() - began:.1f} s")
    b = browser_for(big_node)
    b.open()
    b.sign_in(API_KEY)
    b.until(lambda: len(b.row_ids()) == 100, timeout=30, what="the first page")
    b.until(lambda: b.find("count-running").text == str(SCALE), what="the running count")

    # Refresh: a new first page, timed by the page from the click to its rows in the DOM.
    b.settle()
    before = b.generation()
    b.drain()
    sent = len(b.requests)
    clicked = time.monotonic()
    b.find("refresh").click()
    b.until(lambda: b.generation() > before, what="the refreshed page")
    wall = time.monotonic() - clicked
    table = b.find("sandbox-table")
    load_ms = float(table.get_attribute("data-load-ms"))
    render_ms = float(table.get_attribute("data-render-ms"))
    print(f"first page of {SCALE}: {load_ms:.0f} ms click to rows (render {render_ms:.1f} ms;"
          f" {wall * 1000:.0f} ms seen from the test)")
    assert len(b.row_ids()) == 100
    assert load_ms < FIRST_PAGE_MS, load_ms
    assert len(b.list_requests(sent)) == 1  # one page, not all of them
    b.shot("scale-first-page")

    # Every page once with "next" (one request each), then back with "previous".
    seen = list(b.row_ids())
    pages = 1
    while b.find("next-page").is_enabled():
        b.settle()
        before = b.generation()
        b.drain()
        sent = len(b.requests)
        b.find("next-page").click()
        b.until(lambda before=before: b.generation() > before, what=f"page {pages + 1}")
        assert float(b.find("sandbox-table").get_attribute("data-load-ms")) < FIRST_PAGE_MS
        assert len(b.list_requests(sent)) == 1
        seen += b.row_ids()
        pages += 1
    assert pages == -(-SCALE // 100)
    assert sorted(seen) == sorted(made)  # each sandbox on exactly one page
    assert "(last)" in b.find("page-info").text
    b.shot("scale-last-page")
    before = b.generation()
    b.find("prev-page").click()
    b.until(lambda: b.generation() > before, what="the page before")
    assert b.row_ids() == seen[-100 - (len(seen) % 100 or 100):-(len(seen) % 100 or 100)]
    assert b.banner() is None
