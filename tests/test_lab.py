"""`make lab` as a newcomer meets it: the launcher serves the lab, on loopback, behind its token.

Starts fp8lab.lab.launch (what `make lab` runs) in isolated Jupyter directories, fetches the
lab page and /api/status with the token, checks that the API refuses a request without it
(403) and that the server listens on 127.0.0.1 only, then stops it.
"""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from fp8lab.lab import FIRST_NOTEBOOK, find_free_port

from .labserver import running_lab


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
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
