"""`make lab` as a newcomer meets it: the launcher serves the lab, on loopback, behind its token.

Starts fp8lab.lab.launch (what `make lab` runs) in isolated Jupyter directories, fetches the
lab page and /api/status with the token, checks that the API refuses a request without it
(403) and that the server listens on 127.0.0.1 only, then stops it. A second lab, started with
http_proxy pointing at a local listener and with no user settings of its own, shows that the
token stays off every command line and away from the proxy, and that the lab's own
configuration turns the news pop-up and the update check off while the user's settings still
load from, and save to, Jupyter's usual place.
"""

from __future__ import annotations

import http.server
import json
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

from fp8lab.lab.launcher import FIRST_NOTEBOOK, REPO, find_free_port, launch, ready
from tests.labserver import isolated_jupyter, running_lab

PROXY_VARIABLES = ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY")
NOTIFICATION = "@jupyterlab/apputils-extension:notification"
DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # this test's own requests: never proxied
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                  "--disable-background-networking", "--no-first-run", "--disable-sync"]


def _get(url: str, headers: dict[str, str] | None = None, method: str = "GET", body: bytes | None = None
         ) -> tuple[int, str]:
    req = urllib.request.Request(url, headers=headers or {}, method=method, data=body)
    try:
        with DIRECT.open(req, timeout=10) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def _listening_addresses(port: int) -> set[str]:
    """Local IPv4/IPv6 addresses (hex, as the kernel writes them) listening on `port`."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        path = Path(table)
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            address, hex_port = fields[1].split(":")
            if int(hex_port, 16) == port and fields[3] == "0A":  # 0A: LISTEN
                found.add(address)
    return found


def test_make_lab_serves_the_lab_behind_its_token(tmp_path):
    busy = socket.socket()
    busy.bind(("127.0.0.1", find_free_port()))  # the port the launcher would try first is taken
    busy.listen()
    try:
        with running_lab(tmp_path) as lab:
            assert lab.port != busy.getsockname()[1], "the launcher did not move on from a port in use"
            assert lab.url.startswith(f"http://127.0.0.1:{lab.port}/lab/tree/{FIRST_NOTEBOOK}?token=")
            assert len(lab.token) >= 24

            status, page = _get(lab.url)
            assert status == 200 and "jupyter-config-data" in page, f"the lab page did not load: {status}"

            status, body = _get(f"{lab.base}/api/status?token={lab.token}")
            assert status == 200 and "started" in json.loads(body)

            status, _ = _get(f"{lab.base}/api/status")
            assert status == 403, f"/api/status without the token answered {status}, expected 403"
            status, _ = _get(f"{lab.base}/api/contents/{FIRST_NOTEBOOK}", headers={"Authorization": "token wrong"})
            assert status == 403, f"/api/contents with a wrong token answered {status}, expected 403"

            listening = _listening_addresses(lab.port)
            if Path("/proc/net/tcp").exists():
                assert listening == {"0100007F"}, f"expected to listen on 127.0.0.1 only, found {listening}"
            proc = lab.proc
        assert proc.poll() is not None, "the lab kept running after terminate()"
    finally:
        busy.close()


def test_launcher_reports_a_server_that_dies(tmp_path):
    """A bad option makes jupyter exit at once; launch() must say so, not hang until its deadline."""
    with pytest.raises(RuntimeError, match="exited with code"):
        with running_lab(tmp_path, extra=["--ServerApp.port_retries=not-a-number"], wait=30):
            pass


class _Recorder(http.server.BaseHTTPRequestHandler):
    """Records each request (path and headers) on its server and answers `self.server.answer`."""

    def do_GET(self) -> None:
        self.server.requests.append((self.path, dict(self.headers)))
        status = self.server.answer(self)
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


def _recording_server(answer) -> http.server.ThreadingHTTPServer:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    server.requests, server.answer = [], answer
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _descendants(pid: int) -> list[int]:
    children = Path(f"/proc/{pid}/task/{pid}/children")
    found = [int(c) for c in children.read_text().split()] if children.exists() else []
    return found + [d for c in found for d in _descendants(c)]


@pytest.fixture(scope="module")
def lab_behind_proxy(tmp_path_factory):
    """A lab started while http_proxy & co. point at a local listener (a proxy would answer 502),
    with isolated Jupyter directories but no user settings: the user-settings directory is
    Jupyter's default, JUPYTER_CONFIG_DIR/lab/user-settings. Yields (lab, the listener)."""
    home = tmp_path_factory.mktemp("lab")
    proxy = _recording_server(lambda _: 502)
    env, options = isolated_jupyter(home)
    # what a user has: no --LabApp.user_settings_dir, no news_url option
    options = [o for o in options if not o.startswith(("--LabApp.user_settings_dir", "--LabApp.news_url"))]
    with pytest.MonkeyPatch.context() as mp:
        for name in PROXY_VARIABLES:
            mp.setenv(name, f"http://127.0.0.1:{proxy.server_address[1]}")
        for name in ("no_proxy", "NO_PROXY"):
            mp.delenv(name, raising=False)
        with open(home / "server.log", "w") as log:
            proc, url = launch(env=env, extra=options, wait=30, log=log)
    try:
        token = url.split("token=", 1)[1]
        yield {"proc": proc, "url": url, "token": token, "base": url.split("/lab/", 1)[0], "home": home}, proxy
    finally:
        proc.terminate()
        proc.wait(20)
        proxy.shutdown()


def test_the_token_is_on_no_command_line(lab_behind_proxy):
    """`ps` shows every user each process's arguments: the server's (and its children's) hold no token."""
    lab, _ = lab_behind_proxy
    if not Path("/proc/self/cmdline").exists():
        pytest.skip("needs /proc to read other processes' command lines")
    pids = [lab["proc"].pid, *_descendants(lab["proc"].pid)]
    for pid in pids:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        assert not any(lab["token"] in arg for arg in argv), f"process {pid} has the token in its argv: {argv}"
        assert "jupyter" in " ".join(argv) or pid != lab["proc"].pid
    status, _ = _get(f"{lab['base']}/api/status", headers={"Authorization": f"token {lab['token']}"})
    assert status == 200, "the server did not take the token from its environment"


def test_the_readiness_check_goes_around_the_proxy(lab_behind_proxy):
    lab, proxy = lab_behind_proxy
    assert lab["proc"].poll() is None  # launch() returned: the lab answered, directly
    assert proxy.requests == [], f"requests reached the proxy: {proxy.requests}"


def test_ready_sends_the_token_in_a_header_not_the_url(monkeypatch):
    server = _recording_server(lambda h: 200 if h.headers.get("Authorization") == "token s3cret" else 403)
    proxy = _recording_server(lambda _: 502)
    for name in PROXY_VARIABLES:
        monkeypatch.setenv(name, f"http://127.0.0.1:{proxy.server_address[1]}")
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    try:
        port = server.server_address[1]
        assert ready(port, "s3cret")
        assert not ready(port, "wrong")
        assert [path for path, _ in server.requests] == ["/api/status", "/api/status"]
        assert not any("s3cret" in path for path, _ in server.requests)
        assert proxy.requests == []
        with socket.socket() as s:  # nothing listening: not ready, no exception
            s.bind(("127.0.0.1", 0))
            assert not ready(s.getsockname()[1], "s3cret", timeout=1)
    finally:
        server.shutdown()
        proxy.shutdown()


@pytest.mark.browser
def test_a_newcomer_meets_no_news_pop_up_in_the_browser(lab_behind_proxy):
    """The pop-up itself, in headless chromium: without the lab's configuration it shows ~0.1 s
    after the shell appears (measured here); with it, nothing in the 3 s after."""
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.fail("Debian's chromium is not installed: run `make browser-deps` (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    lab, _ = lab_behind_proxy
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page()
            page.goto(f"{lab['base']}/lab/workspaces/news{uuid.uuid4().hex[:8]}?reset&token={lab['token']}")
            page.wait_for_selector("#jp-main-dock-panel", timeout=60_000)
            page.wait_for_timeout(3_000)
            assert page.get_by_text("Jupyter news").count() == 0, "the news pop-up is showing"
        finally:
            browser.close()


def test_no_news_pop_up_and_no_update_check_yet_the_users_settings_persist(lab_behind_proxy):
    """The pop-up asks while fetchNews is "none" (JupyterLab's default). The lab's own
    configuration makes "false" the default and switches the server's news feed and update
    check off; a user's own setting is saved where Jupyter keeps it and wins over the default."""
    lab, _ = lab_behind_proxy
    auth = {"Authorization": f"token {lab['token']}"}
    status, body = _get(f"{lab['base']}/lab/api/settings/{NOTIFICATION}", headers=auth)
    assert status == 200
    answer = json.loads(body)
    defaults = {k: v.get("default") for k, v in answer["schema"]["properties"].items()}
    assert defaults["fetchNews"] == "false" and defaults["checkForUpdates"] is False, defaults
    assert answer["settings"] == {}, "the lab must set defaults, not write the user's settings"
    assert json.loads(_get(f"{lab['base']}/lab/api/news", headers=auth)[1]) == {"news": []}
    assert json.loads(_get(f"{lab['base']}/lab/api/update", headers=auth)[1]) == {"notification": None}
    page = _get(lab["url"])[1]
    config = json.loads(page.split('id="jupyter-config-data" type="application/json">', 1)[1].split("</script>")[0])
    assert config["news"] == {"disabled": True}
    user_settings = lab["home"] / "config" / "lab" / "user-settings"  # Jupyter's default place under JUPYTER_CONFIG_DIR
    assert Path(config["userSettingsDir"]) == user_settings

    # the user changes their mind: saved in their own settings, and it wins over the lab's default
    def put(raw: dict) -> int:
        body = json.dumps({"raw": json.dumps(raw)}).encode()
        return _get(f"{lab['base']}/lab/api/settings/{NOTIFICATION}", headers=auth, method="PUT", body=body)[0]

    try:
        assert put({"fetchNews": "true"}) == 204
        saved = user_settings / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
        assert json.loads(saved.read_text()) == {"fetchNews": "true"}
        answer = json.loads(_get(f"{lab['base']}/lab/api/settings/{NOTIFICATION}", headers=auth)[1])
        assert answer["settings"]["fetchNews"] == "true"
    finally:
        put({})  # as a newcomer has it, for the other tests on this lab


# ---- `fp8lab lab` as a command: its working folder, its arguments, and SIGTERM ---------------------------------


def test_copy_notebooks_copies_only_what_is_missing(tmp_path):
    from fp8lab.lab.launcher import copy_notebooks, notebooks_source

    source = notebooks_source()
    names = sorted(p.name for p in [*source.glob("*.ipynb"), source / "ANSWERS.md"])
    assert len(names) == 11, names  # ten notebooks and the answer key
    copied, kept = copy_notebooks(tmp_path / "work")
    assert copied == names and kept == []
    mine = tmp_path / "work" / "02_per_tensor_scaling.ipynb"
    mine.write_text("a learner's edit")
    (tmp_path / "work" / "05_fp8_gemm.ipynb").unlink()
    copied, kept = copy_notebooks(tmp_path / "work")
    assert copied == ["05_fp8_gemm.ipynb"] and "02_per_tensor_scaling.ipynb" in kept and len(kept) == 10
    assert mine.read_text() == "a learner's edit"


def test_the_working_folder_is_the_clone_unless_dir_says_otherwise(tmp_path):
    from fp8lab.lab.launcher import REPO, working_folder

    assert working_folder(None) == (REPO, FIRST_NOTEBOOK)  # this checkout: notebooks/ in place, as `make lab`
    assert working_folder(tmp_path / "x") == ((tmp_path / "x").resolve(), "00_setup_check.ipynb")


def _lab_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fp8lab", "lab", *args], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def test_lab_help_names_its_options():
    r = _lab_cli("--help")
    assert r.returncode == 0, r.stderr
    for option in ("--dir", "--port", "--no-browser", "--ip", "--allow-remote", "fp8lab-notebooks"):
        assert option in r.stdout, option


@pytest.mark.parametrize("args, says", [
    (["--frobnicate"], "unrecognized arguments: --frobnicate"),
    (["notebooks"], "unrecognized arguments: notebooks"),
    (["--port", "eighty"], "invalid int value"),
    (["--port", "70000"], "--port must be in 1..65535"),
    (["--ip", "0.0.0.0"], "add --allow-remote"),
    (["--ip", "192.0.2.1", "--no-browser"], "add --allow-remote"),
])
def test_lab_refuses_bad_arguments_with_usage(args, says):
    r = _lab_cli(*args)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "usage: fp8lab lab" in r.stderr and says in r.stderr, r.stderr


def test_lab_refuses_a_working_folder_that_is_a_file(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    r = _lab_cli("--dir", str(tmp_path / "notes.txt"), "--no-browser")
    assert r.returncode == 2 and "cannot hold the notebooks" in r.stderr, r.stderr
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_lab_refuses_a_port_in_use():
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    try:
        r = _lab_cli("--port", str(busy.getsockname()[1]), "--no-browser")
    finally:
        busy.close()
    assert r.returncode == 2 and "is in use" in r.stderr, r.stderr


def test_sigterm_stops_jupyter_with_the_launcher(tmp_path):
    """`python -m fp8lab lab --dir X --no-browser` copies the notebooks into X and serves them behind the
    token; SIGTERM to the launcher stops its Jupyter and the kernels too, instead of leaving them serving with
    the token."""
    from tests.wheels import alive, isolated_env, lab_children, start_lab, stop_lab

    work = tmp_path / "my notebooks"
    port = find_free_port(9300)
    proc, _, url = start_lab([sys.executable, "-m", "fp8lab", "lab", "--dir", str(work), "--no-browser",
                                  "--port", str(port)], {**isolated_env(tmp_path / "home"), "PYTHONPATH": str(REPO)},
                                 tmp_path)
    children = lab_children(proc.pid)
    try:
        assert url["port"] == port and url["path"] == "00_setup_check.ipynb"
        assert len(list(work.glob("*.ipynb"))) == 10 and (work / "ANSWERS.md").is_file()
        status, _ = _get(f"http://127.0.0.1:{port}/api/contents/00_setup_check.ipynb",
                         headers={"Authorization": f"token {url['token']}"})
        assert status == 200
        assert _get(f"http://127.0.0.1:{port}/api/contents/00_setup_check.ipynb")[0] == 403
        (server,) = children
        assert url["token"] not in Path(f"/proc/{server}/cmdline").read_text()
        status, _ = _get(f"http://127.0.0.1:{port}/api/kernels", method="POST", body=b"{}",
                         headers={"Authorization": f"token {url['token']}", "Content-Type": "application/json"})
        assert status == 201
        deadline = time.monotonic() + 60  # a hang guard
        while not lab_children(server) and time.monotonic() < deadline:
            time.sleep(0.2)
        children += lab_children(server)  # the kernel
        assert len(children) == 2, children
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        while any(alive(pid) for pid in children) and time.monotonic() < deadline + 60:
            time.sleep(0.2)
        assert not alive(server), "Jupyter kept serving after the launcher got SIGTERM"
        assert not alive(children[1]), "the kernel outlived the launcher"
        assert not ready(port, url["token"]), "the port still answers to the token"
    finally:
        stop_lab(proc, children)
