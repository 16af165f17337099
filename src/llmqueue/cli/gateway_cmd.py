"""``llmqueue gateway``: the scenario's control plane in front of real engines."""

from __future__ import annotations

import os

import click

from llmqueue.cli.common import OutputPath, command, run_outputs
from llmqueue.errors import InputError
from llmqueue.serve.http import IDLE_TIMEOUT_S, MAX_CONNECTIONS, REQUEST_TIMEOUT_S


def gateway_outputs(p) -> list:
    """The files a gateway run folder receives: a run's, its ``run.json`` and ``decisions.jsonl``."""
    return run_outputs(p) + [p / "run.json", p / "decisions.jsonl"]


READY = "llmqueue gateway: listening on {url} (pools: {pools}); records to {out}"


def _backends(values) -> dict:
    out: dict = {}
    for v in values:
        name, sep, urls = v.partition("=")
        if not sep or not name or not urls:
            raise InputError("backend", f"{v!r} is not POOL=URL[,URL...]", "e.g. --backend latency=http://127.0.0.1:8000")
        for u in urls.split(","):
            if not u.startswith(("http://", "https://")):
                raise InputError("backend", f"{u!r} is not an http(s) URL", "e.g. http://127.0.0.1:8000")
            out.setdefault(name, []).append(u)
    return out


def _listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise InputError("listen", f"{value!r} is not HOST:PORT", "e.g. 127.0.0.1:8080 (port 0: a free one)")
    return host.strip("[]") or "127.0.0.1", int(port)


def _keys(values) -> dict:
    out = {}
    for v in values:
        pool, sep, var = v.partition("=")
        if not sep or not pool or not var:
            raise InputError("upstream_key", f"{v!r} is not POOL=ENVVAR", "e.g. --upstream-key latency=VLLM_API_KEY")
        key = os.environ.get(var)
        if not key:
            raise InputError("upstream_key", f"the environment variable {var} is not set",
                             f"export {var}=... (the key stays out of the command line and the records)")
        out[pool] = key
    return out


def fleet_of(scenario: str, sets=()):
    """``(FleetSpec, classes -> priority)`` a scenario describes (one pool for a single engine)."""
    from llmqueue.cluster.spec import FleetSpec, Pool
    from llmqueue.scenario.override import scenario_with
    from llmqueue.simulate import spec_from_scenario

    o = scenario_with(scenario, sets=sets)
    spec = spec_from_scenario(o.scenario)
    fleet = spec.fleet
    if fleet is None:
        fleet = FleetSpec(pools=[Pool("default", spec.engine, spec.step_time, max(spec.replicas, 1), spec.router,
                                      model=o.scenario.deployment.model or "")])
    return fleet, {c.name: c.priority for c in o.scenario.mix.classes}


@command("gateway")
@click.option("--scenario", required=True, help="A scenario file or shipped example: its pools, lanes, routers and "
              "gateway rules (rate limits, admission by depth and age, shedding, fallback, fair shares) run live.")
@click.option("--set", "sets", multiple=True, metavar="PATH=VALUE", help="Assign one of the scenario's fields.")
@click.option("--backend", "backends", multiple=True, metavar="POOL=URL[,URL...]",
              help="The engines (OpenAI-compatible base URLs, one per replica) of a pool; repeat per pool.")
@click.option("--listen", default="127.0.0.1:8080", show_default=True, metavar="HOST:PORT",
              help="Address to listen on (loopback unless told otherwise; port 0: a free one).")
@click.option("--out", "out_dir", required=True, type=OutputPath("dir", also=gateway_outputs),
              help="The run folder: requests.parquet (one record per request, written every second) and "
                   "decisions.jsonl (each decision with the numbers it read).")
@click.option("--seed", type=int, default=0, show_default=True, help="The routers' random streams.")
@click.option("--upstream-key", "keys", multiple=True, metavar="POOL=ENVVAR",
              help="An API key (read from the environment variable) sent only to that pool's engines.")
@click.option("--forward-client-key/--no-forward-client-key", default=False, show_default=True,
              help="Pass the client's Authorization header to the engines (off: client keys stay at the gateway).")
@click.option("--max-retries", type=click.IntRange(0, 16), default=2, show_default=True,
              help="Times a request that failed before its first byte is sent to another replica.")
@click.option("--upstream-timeout", type=click.FloatRange(min=0.001), default=600.0, show_default=True,
              metavar="SECONDS", help="An engine that has not finished an answer by then: 504 (or the stream cut).")
@click.option("--upstream-first-byte-timeout", type=click.FloatRange(min=0.001), default=None, metavar="SECONDS",
              help="An engine whose answer has not begun by then: 504 (default: --upstream-timeout). vLLM sends a "
                   "streamed answer's head at once, a whole answer's at its end.")
@click.option("--client-timeout", type=click.FloatRange(min=0.001), default=REQUEST_TIMEOUT_S, show_default=True,
              metavar="SECONDS", help="A client whose request (head and body) is not whole by then gets 408 and is disconnected.")
@click.option("--idle-timeout", type=click.FloatRange(min=0.001), default=IDLE_TIMEOUT_S, show_default=True,
              metavar="SECONDS", help="A kept-alive client connection with no request for this long is closed.")
@click.option("--max-connections", type=click.IntRange(min=1), default=MAX_CONNECTIONS, show_default=True,
              help="Open client connections held at most; one more gets 503 and is closed (an idle one costs "
                   "about 2 KB; the process's open-file limit must allow them).")
@click.option("--scrape-interval", type=click.FloatRange(min=0.05), default=1.0, show_default=True, metavar="SECONDS",
              help="How often each engine's /metrics (and a failed one's /health) is read.")
@click.option("--drain-timeout", type=click.FloatRange(min=0), default=30.0, show_default=True, metavar="SECONDS",
              help="On Ctrl-C or SIGTERM: how long requests in flight may finish (then cut; exit 130).")
@click.pass_context
def gateway(ctx, scenario, sets, backends, listen, out_dir, seed, keys, forward_client_key, max_retries,
            upstream_timeout, upstream_first_byte_timeout, client_timeout, idle_timeout, max_connections,
            scrape_interval, drain_timeout):
    """Run the scenario's control plane in front of real engines (vLLM, SGLang, TGI, llmqueue emulate).

    Each request is classified (X-Request-Class, else the lanes' prompt geometry; the tenant from
    X-Tenant or the client's key), admitted or shed by the scenario's gateway rules (429 / 503 with
    Retry-After), routed by the pool's router on a view of numbers (the gateway's counts and each
    engine's /metrics), and relayed; the policies are the objects `llmqueue simulate` runs, and each
    decision is recorded with the view it saw. /metrics puts queueing theory's prediction beside
    the measured wait and shed rate.

    Example (two emulated engines):

      llmqueue emulate --replicas 2 --port 8100 --step-time 0.02 &

      llmqueue gateway --scenario chat --backend default=http://127.0.0.1:8100,http://127.0.0.1:8101 --out runs/gw
    """
    from llmqueue.serve.gateway_run import serve_gateway

    pools = _backends(backends)
    host, port = _listen(listen)
    fleet, classes = fleet_of(scenario, sets)
    code = serve_gateway(fleet, pools, classes=classes, host=host, port=port, out_dir=out_dir, seed=seed,
                         upstream_keys=_keys(keys), forward_client_key=forward_client_key, max_retries=max_retries,
                         upstream_timeout_s=upstream_timeout, upstream_first_byte_timeout_s=upstream_first_byte_timeout,
                         request_timeout_s=client_timeout, idle_timeout_s=idle_timeout,
                         max_connections=max_connections, scrape_interval_s=scrape_interval,
                         drain_timeout_s=drain_timeout,
                         on_ready=lambda url: click.echo(READY.format(url=url, pools=", ".join(pools), out=out_dir)))
    ctx.exit(code)
