"""The model a server serves: the first one it lists at ``/v1/models`` (what ``bench``,
``profile`` and ``sweep``/``capacity --url`` request when ``--model`` is not given)."""

from __future__ import annotations

from llmqueue.bench.http import check_url


def server_model(url: str, api_key: str | None = None, *, opts=None, timeout_s: float = 10.0, **options) -> str:
    """The first model the server lists at ``/v1/models``, asked with the run's key and headers,
    directly or through the proxy the run uses: those of ``opts`` (a
    :class:`~llmqueue.bench.options.BenchOptions`) or of ``options`` (its fields), with
    ``api_key`` (:mod:`llmqueue.bench.credentials`). A redirect is followed only within ``url``'s
    origin (scheme, host, port): one to another origin is refused, so the key never goes there.
    ``timeout_s``: the connect and read timeouts (a server that does not answer in time: one line).
    httpx, with ``trust_env=False``: proxy variables are read only when the options ask for them."""
    import ssl
    from urllib.parse import urljoin, urlsplit

    import httpx

    from llmqueue.bench.client import BenchConnectError
    from llmqueue.bench.credentials import origin, origin_text
    from llmqueue.bench.options import BenchOptions
    from llmqueue.errors import InputError, LlmqueueError

    check_url(url)
    p = urlsplit(url)
    if p.scheme not in ("http", "https") or not p.hostname:
        raise InputError("url", f"{url!r} is not an http(s) URL", "e.g. http://127.0.0.1:8000")
    base = f"{p.scheme}://{p.netloc.rsplit('@', 1)[-1]}"
    if api_key is not None:
        options["api_key"] = api_key
    opts = BenchOptions(**options) if opts is None else opts.replace(**options)
    hdrs, px = opts.route(base)
    home = origin(base)
    target = base + "/v1/models"
    try:
        # the trust store the run's own connections use (the system's, or SSL_CERT_FILE)
        verify = ssl.create_default_context()
        with httpx.Client(proxy=px, trust_env=False, follow_redirects=False, timeout=timeout_s, verify=verify) as client:
            for _ in range(6):
                r = client.get(target, headers=hdrs)
                if not r.is_redirect:
                    break
                nxt = urljoin(target, r.headers["location"])
                if origin(nxt) != home:
                    raise InputError("url", f"{base}/v1/models redirects to another origin "
                                     f"({origin_text(origin(nxt))}): the API key and headers go only to "
                                     f"{origin_text(home)}", "give --model, or the server's own address as --url")
                target = nxt
            else:
                raise InputError("model", f"not given, and {base}/v1/models redirects too many times", "give --model")
            if r.status_code != 200:
                raise InputError("model", f"not given, and {base}/v1/models answered HTTP {r.status_code}",
                                 "give --model")
            data = r.json()
        return str(data["data"][0]["id"])
    except LlmqueueError:
        raise
    except (httpx.ConnectError, httpx.ConnectTimeout, httpx.ProxyError) as e:
        msg = str(e) or type(e).__name__
        problem = "connection refused" if "refused" in msg.lower() else msg
        if px is not None:
            problem += ", through the proxy"
        raise BenchConnectError(base, problem) from None
    except httpx.TimeoutException:
        raise InputError("url", f"{base} did not answer GET /v1/models within {timeout_s:g} s",
                         "check the server (is it still loading the model?), or give --model") from None
    except httpx.HTTPError as e:
        raise InputError("model", f"not given, and {base}/v1/models could not be read ({type(e).__name__})",
                         "give --model") from None
    except (ValueError, KeyError, IndexError, TypeError) as e:
        raise InputError("model", f"not given, and {base}/v1/models did not list a model ({e})",
                         "give --model") from None
