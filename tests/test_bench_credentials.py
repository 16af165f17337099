"""Where ``llmqueue bench`` sends the API key and the custom headers (loopback only).

The key goes to ``--url``'s origin (scheme, host, port) and nowhere else: not to another origin a
``/v1/models`` redirect names, not through a proxy the environment names unless the user asks
(``--proxy`` / ``--trust-env``), not in clear through a proxy at all unless the user says so; a
value with CR or LF is refused before anything is sent. Truth comes from what the servers
received: recording servers here, the stub's own counters (``authorized``, ``proxied``,
``x_headers``).
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
from _cli import run_cli

from llmqueue.bench.client import run_bench
from llmqueue.bench.credentials import proxy_auth, proxy_for, request_headers
from llmqueue.bench.stub_server import StubServer
from llmqueue.bench.served_model import server_model
from llmqueue.errors import InputError
from llmqueue.records import read_records
from llmqueue.workload import Workload

KEY = "sk-test-secret"
WL = ("--arrival", "poisson:100", "--prompt", "fixed:4", "--output", "fixed:2", "--num-requests", "10",
      "--no-progress")


class Recorder:
    """An HTTP server on 127.0.0.1 that records every request (method, target, headers) and
    answers with ``answer(target) -> (status, headers, body)`` (default: a model list)."""

    def __init__(self, answer=None):
        self.seen: list[tuple[str, str, dict]] = []
        self.answer = answer or (lambda target: (200, {"Content-Type": "application/json"},
                                                 b'{"object": "list", "data": [{"id": "rec-model"}]}'))
        rec = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                n = int(self.headers.get("Content-Length") or 0)
                if n:
                    self.rfile.read(n)
                rec.seen.append((self.command, self.path, dict(self.headers)))
                status, headers, body = rec.answer(self.path)
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_POST = do_GET

            def log_message(self, *a):
                pass

        self.srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.srv.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.srv.serve_forever, daemon=True)
        self.thread.start()

    def keys(self) -> list[str]:
        return [h.get("Authorization") for _, _, h in self.seen if h.get("Authorization")]

    def close(self):
        self.srv.shutdown()
        self.srv.server_close()


@contextlib.contextmanager
def recorder(answer=None):
    r = Recorder(answer)
    try:
        yield r
    finally:
        r.close()


@pytest.fixture(scope="module")
def stub():
    with StubServer(token_delay_s=0.001) as s:
        yield s


@pytest.fixture
def clean_env(monkeypatch):
    """No proxy variable from the machine running the tests; urllib's cached default opener
    (which read the variables when first used) forgotten, so a client that still used urllib
    would see the variables these tests set."""
    import urllib.request

    for k in ("http_proxy", "https_proxy", "all_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY",
              "NO_PROXY"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr(urllib.request, "_opener", None)
    return monkeypatch


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# -- redirects --------------------------------------------------------------------------------

def test_a_models_redirect_to_another_origin_never_gets_the_key(clean_env, tmp_path):
    """Acceptance: /v1/models redirects to another port; that server never receives the key
    (before: urllib followed the redirect with ``Authorization: Bearer ...``). The run is refused
    in one line, exit 2."""
    with recorder() as other:
        def answer(target):
            return 307, {"Location": f"{other.url}/v1/models"}, b""

        with recorder(answer) as home:
            code, out, err = run_cli("bench", "--url", home.url, "--api-key", KEY, *WL,
                                     "--out", str(tmp_path / "r"))
            line = _one_line(err)
            assert code == 2
            assert line.startswith(f"llmqueue: error: --url: {home.url}/v1/models redirects to another origin "
                                   f"(http://127.0.0.1:{other.port})")
            assert KEY not in line
            assert home.keys() == [f"Bearer {KEY}"]  # asked once, at the origin of --url
        assert other.seen == []
        # the same through the library, and with the other origin differing only in scheme
        with recorder(lambda t: (302, {"Location": f"https://127.0.0.1:{other.port}/v1/models"}, b"")) as home:
            with pytest.raises(InputError, match=r"redirects to another origin \(https://127.0.0.1"):
                server_model(home.url, KEY)
        assert other.seen == []


def test_a_models_redirect_within_the_origin_is_followed(clean_env):
    def answer(target):
        if target == "/v1/models":
            return 308, {"Location": "/v1/models/"}, b""
        return 200, {"Content-Type": "application/json"}, b'{"data": [{"id": "moved-model"}]}'

    with recorder(answer) as home:
        assert server_model(home.url, KEY) == "moved-model"
        assert [t for _, t, _ in home.seen] == ["/v1/models", "/v1/models/"]
        assert home.keys() == [f"Bearer {KEY}"] * 2


# -- proxies ----------------------------------------------------------------------------------

def test_proxy_variables_are_ignored_unless_asked(clean_env, stub, tmp_path):
    """http_proxy & co. do not route anything (before: the /v1/models lookup went through them
    with the key, in clear)."""
    before = stub.stats()
    with recorder() as proxy:
        for k in ("http_proxy", "HTTP_PROXY", "all_proxy"):
            clean_env.setenv(k, proxy.url)
        code, out, err = run_cli("bench", "--url", stub.url, "--api-key", KEY, *WL, "--out", str(tmp_path / "r"))
        assert code == 0, err
        assert proxy.seen == []
        assert proxy_for(stub.url) is None
        assert server_model(stub.url, KEY) == stub.model and proxy.seen == []
    after = stub.stats()
    assert after["authorized"] - before["authorized"] == 10 + 2  # the run, its lookup and ours
    assert after["proxied"] == before["proxied"]


def test_trust_env_refuses_a_key_in_clear_through_a_proxy(clean_env, stub, tmp_path):
    before = stub.stats()
    with recorder() as proxy:
        clean_env.setenv("http_proxy", proxy.url)
        code, out, err = run_cli("bench", "--url", stub.url, "--api-key", KEY, "--trust-env", *WL,
                                 "--out", str(tmp_path / "r"))
        line = _one_line(err)
        assert code == 2 and line.startswith(f"llmqueue: error: --proxy: the API key would cross the proxy "
                                             f"{proxy.url} in clear")
        assert "--allow-key-over-http-proxy" in line
        code, out, err = run_cli("bench", "--url", stub.url, "--api-key", KEY, "--proxy", proxy.url,
                                 "--model", "m", *WL, "--out", str(tmp_path / "r2"))
        assert code == 2 and "in clear" in _one_line(err)
        assert proxy.seen == []
    assert stub.stats()["requests"] == before["requests"]


@pytest.mark.parametrize("how", ["--proxy", "--trust-env"])
def test_the_proxy_carries_everything_when_asked(clean_env, tmp_path, how):
    """Asked for, the proxy carries the lookup and every request (the stub stands in for the
    proxy and the server behind it: it answers what is addressed to another host); --url names
    a port where nothing listens, so nothing went there directly."""
    with StubServer(token_delay_s=0.001) as proxy:
        args = ["--proxy", proxy.url] if how == "--proxy" else ["--trust-env"]
        clean_env.setenv("http_proxy", proxy.url)
        code, out, err = run_cli("bench", "--url", "http://127.0.0.1:9", "--api-key", KEY,
                                 "--allow-key-over-http-proxy", *args, *WL, "--out", str(tmp_path / "r"), "--json")
        st = proxy.stats()
    assert code == 0, err
    r = read_records(tmp_path / "r")
    assert len(r) == 10 and (r["status"] == "ok").all()
    assert st["proxied"] == st["authorized"] == 11  # ten requests and the /v1/models lookup
    clean_env.setenv("no_proxy", "127.0.0.1")
    assert proxy_for("http://127.0.0.1:9", trust_env=True) is None  # no_proxy exempts the host


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory):
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a test certificate")
    d = tmp_path_factory.mktemp("tls")
    cert, key = d / "cert.pem", d / "key.pem"
    p = subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                        str(cert), "-days", "2", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                       capture_output=True, text=True)
    if p.returncode != 0:
        pytest.skip(f"openssl could not make a certificate: {p.stderr.strip()[-200:]}")
    return str(cert), str(key)


class TunnelProxy:
    """A CONNECT proxy on 127.0.0.1: records each CONNECT line and every byte it carries from the
    client to the server."""

    def __init__(self):
        self.connects: list[bytes] = []
        self.carried = bytearray()
        self.lock = threading.Lock()
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._tunnel, args=(c,), daemon=True).start()

    def _tunnel(self, c):
        head = b""
        while b"\r\n\r\n" not in head:
            d = c.recv(4096)
            if not d:
                c.close()
                return
            head += d
        line = head.split(b"\r\n", 1)[0]
        with self.lock:
            self.connects.append(line)
        host, port = line.split()[1].rsplit(b":", 1)
        up = socket.create_connection((host.decode(), int(port)))
        c.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")

        def pipe(a, b, record):
            try:
                while True:
                    d = a.recv(65536)
                    if not d:
                        break
                    if record:
                        with self.lock:
                            self.carried += d
                    b.sendall(d)
            except OSError:
                pass
            finally:
                for s in (a, b):
                    try:
                        s.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass

        t = threading.Thread(target=pipe, args=(up, c, False), daemon=True)
        t.start()
        pipe(c, up, True)
        t.join()
        c.close()
        up.close()

    def close(self):
        self.sock.close()


def test_an_https_server_through_a_proxy_is_reached_by_a_connect_tunnel(clean_env, tls_files):
    """The proxy sees a CONNECT per connection and only ciphertext: never the key nor a request."""
    cert, key = tls_files
    clean_env.setenv("SSL_CERT_FILE", cert)  # the client trusts the test certificate
    proxy = TunnelProxy()
    try:
        with StubServer(token_delay_s=0.001, tls_cert=cert, tls_key=key) as s:
            assert s.url.startswith("https://")
            assert server_model(s.url, KEY, proxy=proxy.url) == s.model
            reqs = Workload("poisson:100", prompt="fixed:4", output="fixed:3").generate(seed=1, n=12)
            res = run_bench(s.url, s.model, reqs, api_key=KEY, proxy=proxy.url)
            st = s.stats()
    finally:
        proxy.close()
    assert (res.records["status"] == "ok").all(), res.summary["errors"]
    assert np.array_equal(res.records["output_tokens"], reqs.output_tokens)
    assert st["authorized"] == 13 and st["proxied"] == 0
    port = s.url.rsplit(":", 1)[1]
    assert proxy.connects and set(proxy.connects) == {f"CONNECT 127.0.0.1:{port} HTTP/1.1".encode()}
    assert KEY.encode() not in proxy.carried and b"POST /v1" not in proxy.carried and len(proxy.carried) > 1000


# -- header values --------------------------------------------------------------------------------

@pytest.mark.parametrize("args, flag", [
    (("--api-key", "abc\r\nX-Injected: yes"), "--api-key"),
    (("--api-key", "abc\nX-Injected: yes"), "--api-key"),
    (("--header", "X-A: b\r\nX-Injected: yes"), "--header"),
    (("--header", "X-A: b\rX-Injected: yes"), "--header"),
    (("--header", "X-A: b\x00"), "--header"),
    (("--header", "no colon here"), "--header"),
    (("--header", "Bad Name: x"), "--header"),
    (("--header", "Host: elsewhere"), "--header"),
    (("--header", "Content-Length: 0"), "--header"),
    (("--header", "X-A: 1", "--header", "x-a: 2"), "--header"),
    (("--api-key", "k", "--header", "Authorization: Bearer other"), "--header"),
    (("--proxy", "socks5://127.0.0.1:1080"), "--proxy"),
    (("--proxy", "http://127.0.0.1:3128", "--trust-env"), "--proxy"),
])
def test_bad_header_values_are_refused_before_anything_is_sent(clean_env, stub, args, flag):
    """Before: ``--api-key $'abc\\r\\nX-Injected: yes'`` added a header to every request."""
    before = stub.stats()
    code, out, err = run_cli("bench", "--url", stub.url, "--model", "m", *args, *WL)
    line = _one_line(err)
    assert code == 2 and line.startswith(f"llmqueue: error: {flag}"), line
    assert "abc" not in line and "yes" not in line  # a value (perhaps a key) is never repeated
    after = stub.stats()
    assert after["requests"] == before["requests"] and "x-injected" not in after["x_headers"]


def test_custom_headers_reach_the_server_and_the_lookup(clean_env, stub, tmp_path):
    before = stub.stats()["x_headers"]
    code, out, err = run_cli("bench", "--url", stub.url, "--header", "X-Tenant: blue", "--header",
                             "x-trace:1", *WL, "--out", str(tmp_path / "r"))
    assert code == 0, err
    after = stub.stats()["x_headers"]
    for name in ("x-tenant", "x-trace"):
        assert after.get(name, 0) - before.get(name, 0) == 11  # ten requests and the lookup


def test_request_headers_and_proxy_settings():
    assert request_headers("k", ["X-A: 1", ("X-B", " 2")]) == {"Authorization": "Bearer k", "X-A": "1", "X-B": " 2"}
    assert request_headers("", None) == {} and request_headers(None, {"X-A": "b c"}) == {"X-A": "b c"}
    with pytest.raises(InputError, match="control character"):
        request_headers(None, {"X-A": "a\x07b"})
    assert proxy_for("http://h:1", proxy="http://u:p@proxy:3128") == "http://u:p@proxy:3128"
    assert proxy_auth("http://u%40x:p%3A@proxy:3128") == "Basic dUB4OnA6"  # base64 of "u@x:p:"
    assert proxy_auth("http://proxy:3128") is None
    with pytest.raises(InputError, match=r"socks5://u:\*\*\*@proxy is not an http:// proxy") as e:
        proxy_for("http://h:1", proxy="socks5://u:pw@proxy")
    assert "pw" not in str(e.value)
