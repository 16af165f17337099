"""``llmqueue profile`` against servers that do not answer (issue 37, item 4): it stops in one line,
exit 2, within its ``--budget`` and a small margin, whatever part of the exchange hangs: a server
that accepts connections and never answers, one that answers the GETs (``/metrics``, ``/v1/models``)
but never a completion, and one that refuses connections."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

BUDGET_S = 4.0
MARGIN_S = 30.0  # a hang is what this catches (the old code ran past 150 s); a loaded machine starts slowly
SERVER = ("--server-max-num-seqs", "4", "--server-max-num-batched-tokens", "512", "--server-max-model-len", "4096",
          "--server-num-gpu-blocks", "1000", "--server-block-size", "16")


def _silent():
    """A socket that listens and never accepts: the kernel completes each connection, nothing answers."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(64)
    return s, s.getsockname()[1], s.close


def _refusing():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    return None, port, lambda: None


def _gets_only():
    """Answers GET /v1/models (and 404 elsewhere) at once, and never a POST."""
    release = threading.Event()

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            body = json.dumps({"data": [{"id": "m"}]}).encode() if self.path == "/v1/models" else b"{}"
            self.send_response(200 if self.path == "/v1/models" else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self):
            release.wait(120)

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()

    def stop():
        release.set()
        srv.shutdown()
        srv.server_close()

    return srv, srv.server_address[1], stop


CASES = [
    ("silent, --model given", _silent, ("--model", "m", *SERVER), "did not answer GET /metrics"),
    ("silent, no --model", _silent, (), "did not answer GET /v1/models"),
    ("answers GETs, never a completion", _gets_only, ("--model", "m", *SERVER), "prefill probes were answered"),
    ("answers GETs, never a completion, no --model", _gets_only, SERVER, "timed out"),
    ("refuses connections", _refusing, ("--model", "m", *SERVER), "connection refused"),
]


@pytest.mark.parametrize("make,args,fragment", [pytest.param(m, a, f, id=i) for i, m, a, f in CASES])
def test_profile_stops_in_one_line_within_its_budget(tmp_path, make, args, fragment):
    _, port, stop = make()
    try:
        t0 = time.monotonic()
        try:
            p = subprocess.run([sys.executable, "-m", "llmqueue.cli.main", "profile", "--url", f"http://127.0.0.1:{port}",
                                "--out", str(tmp_path / "o"), "--no-progress", "--budget", str(BUDGET_S), *args],
                               capture_output=True, text=True, timeout=BUDGET_S + MARGIN_S + 30)
        except subprocess.TimeoutExpired:
            pytest.fail(f"profile --budget {BUDGET_S:g} still ran after {BUDGET_S + MARGIN_S + 30:g} s")
        took = time.monotonic() - t0
    finally:
        stop()
    err = p.stderr.strip()
    assert p.returncode == 2, err
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert err.startswith("llmqueue: error: --url") and fragment in err, err
    assert took < BUDGET_S + MARGIN_S, (took, err)
    assert not (tmp_path / "o" / "profile.json").exists()
