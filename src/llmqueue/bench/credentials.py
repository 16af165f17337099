"""Where the benchmark's credentials and headers may go.

- Header values are checked before anything is sent: a CR, LF or NUL would let a value end its
  line and add headers of its own (``--api-key $'abc\\r\\nX-Injected: yes'``), so it is refused;
  names must be HTTP tokens, and the headers that frame the request (``Host``,
  ``Content-Length``...) are the client's own. An error never repeats a value (it may be a key).
- The origin rule: the API key and the custom headers go only to the origin (scheme, host,
  port) of ``--url``. The client's own connections only ever reach that origin; the
  ``/v1/models`` lookup follows a redirect only within it and refuses one elsewhere.
- Proxies are used only when asked for: ``proxy`` (an ``http://`` proxy URL) or ``trust_env``
  (the usual ``http_proxy`` / ``https_proxy`` / ``all_proxy`` / ``no_proxy`` variables, read by
  :func:`urllib.request.getproxies` and :func:`urllib.request.proxy_bypass`). An ``https://``
  server is reached through a ``CONNECT`` tunnel, so the proxy sees only ciphertext; a plain
  ``http://`` server through a proxy would show it the key in clear, which is refused unless
  ``allow_key_over_http_proxy`` says otherwise.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from urllib.parse import urlsplit

from llmqueue.errors import InputError

# RFC 9110 token: the characters a header name may hold
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
# headers that frame the request or the connection: the client writes them itself
_RESERVED = frozenset({"host", "content-length", "transfer-encoding", "connection", "keep-alive", "te",
                       "trailer", "upgrade", "proxy-authorization", "proxy-connection", "content-type"})


def _check_value(field: str, value: str, what: str) -> None:
    if any(c in value for c in "\r\n\0"):
        raise InputError(field, f"{what} contains a line break (CR or LF) or a NUL character",
                         "give it on one line: such a value could add headers of its own")
    if any((ord(c) < 32 and c != "\t") or ord(c) == 127 for c in value):
        raise InputError(field, f"{what} contains a control character", "give printable characters only")


def parse_header(text: str) -> tuple[str, str]:
    """``"Name: value"`` (a ``--header`` flag) -> ``(name, value)``, value stripped of the
    spaces around it."""
    name, sep, value = str(text).partition(":")
    name = name.strip()
    if not sep or not name:
        raise InputError("header", "a header without 'Name:' before its value", "give it as 'Name: value'")
    return name, value.strip()


def request_headers(api_key: str | None = None, headers: Mapping[str, str] | Iterable | None = None) -> dict:
    """The headers every request of the run carries: ``Authorization: Bearer <api_key>`` and the
    custom ones, checked (see the module docstring). ``headers``: a mapping, or ``(name, value)``
    pairs / ``"Name: value"`` strings."""
    out: dict[str, str] = {}
    if api_key:  # None or "" (an empty OPENAI_API_KEY): no key
        if not isinstance(api_key, str):
            raise InputError("api_key", "must be a string")
        _check_value("api_key", api_key, "the API key")
        out["Authorization"] = f"Bearer {api_key}"
    if headers is None:
        return out
    items = headers.items() if isinstance(headers, Mapping) else headers
    seen = {k.lower() for k in out}
    for item in items:
        name, value = parse_header(item) if isinstance(item, str) else item
        if not isinstance(name, str) or not _TOKEN.fullmatch(name):
            raise InputError("header", f"{name!r} is not a header name", "use letters, digits and -_.!#$%&'*+^`|~")
        if not isinstance(value, str):
            raise InputError("header", f"{name}: the value must be a string")
        low = name.lower()
        if low in _RESERVED:
            raise InputError("header", f"{name} is set by the client itself", "leave it out")
        if low in seen:
            what = "--api-key's Authorization" if low == "authorization" and api_key else "another one"
            raise InputError("header", f"{name} given twice (with {what})", "give it once")
        _check_value("header", value, f"the value of {name}")
        seen.add(low)
        out[name] = value
    return out


def origin(url: str) -> tuple[str, str, int]:
    """``(scheme, host, port)`` of an http(s) URL, lower-cased, the default port filled in."""
    p = urlsplit(url)
    scheme = (p.scheme or "").lower()
    try:
        port = p.port
    except ValueError:
        port = -1
    if port is None:
        port = 443 if scheme == "https" else 80
    return scheme, (p.hostname or "").lower(), port


def origin_text(o: tuple[str, str, int]) -> str:
    scheme, host, port = o
    shown = f"[{host}]" if ":" in host else host
    return f"{scheme}://{shown}:{port}"


def _redacted(url: str) -> str:
    """A proxy URL without its password, for messages."""
    p = urlsplit(url)
    if p.password is None:
        return url
    return url.replace(f":{p.password}@", ":***@", 1)


def proxy_for(url: str, *, proxy: str | None = None, trust_env: bool = False) -> str | None:
    """The proxy to reach ``url`` through: ``proxy`` if given, else with ``trust_env`` the one the
    environment names for its scheme (unless ``no_proxy`` exempts its host), else None (direct).
    Only ``http://`` proxies are supported."""
    if proxy is not None and trust_env:
        raise InputError("proxy", "give --proxy or --trust-env, not both")
    field = "proxy"
    if proxy is None:
        if not trust_env:
            return None
        import urllib.request

        scheme, host, _ = origin(url)
        env = urllib.request.getproxies()
        proxy = env.get(scheme) or env.get("all")
        if not proxy or urllib.request.proxy_bypass(host):
            return None
        field = "trust_env"
        if "://" not in proxy:  # "host:port", as curl reads it
            proxy = "http://" + proxy
    p = urlsplit(proxy)
    try:
        p.port
    except ValueError:
        raise InputError(field, f"the proxy {_redacted(proxy)} has a bad port") from None
    if p.scheme.lower() != "http" or not p.hostname:
        raise InputError(field, f"the proxy {_redacted(proxy)} is not an http:// proxy URL",
                         "give one like http://proxy.example:3128 (https and socks proxies are not supported)")
    return proxy


def check_key_over_proxy(url: str, proxy: str | None, has_key: bool, allow: bool = False) -> None:
    """Refuse to send an API key through a proxy to a plain-HTTP server (the proxy would read it)
    unless ``allow``."""
    if proxy is not None and has_key and not allow and origin(url)[0] == "http":
        raise InputError("proxy", f"the API key would cross the proxy {_redacted(proxy)} in clear (the server "
                         "is plain http://)", "use an https:// --url, drop the proxy, or pass "
                         "--allow-key-over-http-proxy")


def proxy_auth(proxy: str) -> str | None:
    """``Proxy-Authorization`` value for a proxy URL with ``user:password@`` (Basic), or None."""
    p = urlsplit(proxy)
    if p.username is None:
        return None
    import base64
    from urllib.parse import unquote

    raw = f"{unquote(p.username)}:{unquote(p.password or '')}".encode()
    value = "Basic " + base64.b64encode(raw).decode()
    _check_value("proxy", value, "the proxy's credentials")
    return value


__all__ = ["check_key_over_proxy", "origin", "origin_text", "parse_header", "proxy_auth", "proxy_for",
           "request_headers"]
