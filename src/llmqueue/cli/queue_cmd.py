"""``llmqueue queue``: the classic queueing models as subcommands."""

from __future__ import annotations

import click

from llmqueue.cli.common import command, json_option, print_json, print_kv, renamed_option


@click.group("queue", context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
def queue():
    """Classic queueing models: Little's law, M/M/1, M/D/1, M/G/1, M/M/c, M/M/c/K, M/M/c+M, G/G/1, G/G/c.

    Rates are per second, times in seconds. A steady-state quantity asked of an
    unstable queue (rho >= 1) is an error that says "unstable" (exit 2).
    """


@command("little")
@click.option("--L", "L", type=float, help="Mean number in system.")
@renamed_option("--rate", "lam", old=("--lam",), type=float, metavar="REQ/S", help="Arrival rate lam = throughput (req/s).")
@click.option("--W", "W", type=float, help="Mean time in system (s).")
@json_option
def little_cmd(L, lam, W, as_json):
    """Little's law L = lam * W: give two, get the third (the Queueing System essay: --rate 900 --W 0.12 gives L = 108)."""
    from llmqueue.theory.littles_law import little

    r = little(L=L, lam=lam, W=W)
    if as_json:
        print_json(r)
    else:
        print_kv([("L (in system)", r.L), ("lam (req/s)", r.lam), ("W (s)", r.W)], title="Little's law L = lam * W")


queue.add_command(little_cmd)


# --- shared options and printing ------------------------------------------------------------------

lam_option = renamed_option("--rate", "lam", old=("--lam",), type=float, required=True, metavar="REQ/S",
                            help="Arrival rate lam (req/s).")
mu_option = click.option("--mu", type=float, required=True, help="Service rate of one server (req/s); mean service time 1/mu.")
c_option = click.option("--c", "c", type=int, required=True, help="Number of servers.")
K_option = click.option("--K", "K", type=int, required=True, help="System capacity K >= c (in service plus waiting).")
scv_s_option = click.option("--scv-s", "scv_s", type=float, default=1.0, show_default=True,
                            help="Squared coefficient of variation of service time (0 constant, 1 exponential).")
scv_a_option = click.option("--scv-a", "scv_a", type=float, default=1.0, show_default=True,
                            help="Squared coefficient of variation of inter-arrival time (1 Poisson).")


def _means(r):
    return [
        ("rho (utilization)", r.rho),
        ("L (mean in system)", r.L),
        ("Lq (mean waiting)", r.Lq),
        ("W (mean response, s)", r.W),
        ("Wq (mean wait, s)", r.Wq),
    ]


def _percentiles(r):
    return [
        (f"{which} p{pct} (s)", getattr(r, f"{field}_p{pct}"))
        for which, field in (("Wq", "Wq"), ("W", "W"))
        for pct in (50, 90, 95, 99)
    ]


def _emit(r, as_json, title, pairs):
    _check_finite(r)
    if as_json:
        print_json(r)
    else:
        print_kv(pairs, title=title)


def _check_finite(r) -> None:
    """A stable queue has finite means and percentiles: an infinite or NaN one is a float overflow
    (rates near the limits of double precision), refused instead of printed."""
    import dataclasses
    import math

    from llmqueue.errors import InputError

    if getattr(r, "stable", True) is False:
        return
    for f in dataclasses.fields(r):
        v = getattr(r, f.name)
        if isinstance(v, float) and not math.isfinite(v):
            raise InputError("lam", f"{f.name} overflows double-precision arithmetic with these rates (lam "
                             f"{r.lam:g}, mu {r.mu:g})", "give both rates in another unit (e.g. per hour or "
                             "per millisecond) so they are nearer 1")


# --- models ---------------------------------------------------------------------------------------

@command("mm1", short_help="M/M/1: means, P(wait), wait and response percentiles.")
@lam_option
@mu_option
@json_option
def mm1_cmd(lam, mu, as_json):
    """M/M/1: Poisson arrivals, exponential service, one FCFS server (W = 1/(mu - lam))."""
    from llmqueue.theory.classic import mm1

    r = mm1(lam=lam, mu=mu)
    pairs = [("lam (req/s)", r.lam), ("mu (req/s)", r.mu), *_means(r), ("P_wait", r.P_wait), *_percentiles(r)]
    _emit(r, as_json, "M/M/1 (Poisson arrivals, exponential service, 1 server, FCFS)", pairs)


def _mg1_pairs(r):
    return [("lam (req/s)", r.lam), ("mu (req/s)", r.mu), ("scv_s", r.scv_s), *_means(r), ("P_wait", r.P_wait)]


@command("md1", short_help="M/D/1: constant service (P-K with scv_s = 0).")
@lam_option
@mu_option
@json_option
def md1_cmd(lam, mu, as_json):
    """M/D/1: Poisson arrivals, constant service time 1/mu, one FCFS server (P-K with scv_s = 0)."""
    from llmqueue.theory.classic import md1

    r = md1(lam=lam, mu=mu)
    _emit(r, as_json, "M/D/1 (Poisson arrivals, constant service, 1 server, FCFS)", _mg1_pairs(r))


@command("mg1", short_help="M/G/1 by Pollaczek-Khinchine, given the service SCV.")
@lam_option
@mu_option
@scv_s_option
@json_option
def mg1_cmd(lam, mu, scv_s, as_json):
    """M/G/1 by Pollaczek-Khinchine: Wq = rho (1 + scv_s)/2 * (1/mu)/(1 - rho)."""
    from llmqueue.theory.classic import mg1

    r = mg1(lam=lam, mu=mu, scv_s=scv_s)
    _emit(r, as_json, "M/G/1 (Pollaczek-Khinchine; Poisson arrivals, general service, 1 server)", _mg1_pairs(r))


@command("mmc", short_help="M/M/c (Erlang C): P(wait), means, wait and response percentiles.")
@lam_option
@mu_option
@c_option
@json_option
def mmc_cmd(lam, mu, c, as_json):
    """M/M/c (Erlang C): Poisson arrivals, c exponential servers, FCFS; wait and response percentiles."""
    from llmqueue.theory.classic import mmc

    r = mmc(lam=lam, mu=mu, c=c)
    pairs = [("lam (req/s)", r.lam), ("mu (req/s)", r.mu), ("c (servers)", r.c), ("a (offered erlangs)", r.a),
             *_means(r), ("P_wait (Erlang C)", r.P_wait), ("Erlang B (M/M/c/c loss)", r.erlang_b), *_percentiles(r)]
    _emit(r, as_json, f"M/M/{r.c} (Erlang C; Poisson arrivals, exponential service, FCFS)", pairs)


@command("mmck", short_help="M/M/c/K: blocking probability, carried throughput, means.")
@lam_option
@mu_option
@c_option
@K_option
@json_option
def mmck_cmd(lam, mu, c, K, as_json):
    """M/M/c/K: c exponential servers, room for K in total; arrivals to a full system are blocked."""
    from llmqueue.theory.classic import mmck

    r = mmck(lam=lam, mu=mu, c=c, K=K)
    pairs = [("lam (offered, req/s)", r.lam), ("mu (req/s)", r.mu), ("c (servers)", r.c), ("K (capacity)", r.K),
             ("rho (offered utilization)", r.rho), ("P_block", r.P_block), ("lam_eff (carried, req/s)", r.lam_eff),
             ("rho_eff (carried utilization)", r.rho_eff), ("P0 (empty)", r.P0), ("P_wait (admitted)", r.P_wait),
             ("L (mean in system)", r.L), ("Lq (mean waiting)", r.Lq),
             ("W (admitted, s)", r.W), ("Wq (admitted, s)", r.Wq)]
    _emit(r, as_json, f"M/M/{r.c}/{r.K} (finite capacity, blocked arrivals lost; always stable)", pairs)


@command("mmc-abandon", short_help="M/M/c+M (Erlang A): waiting customers abandon; P(abandon), waits.")
@lam_option
@mu_option
@c_option
@click.option("--theta", type=float, help="Abandonment rate of a waiting customer (1/s): 1 / the mean patience.")
@click.option("--patience", type=float, metavar="S", help="Mean patience of a waiting customer (s); theta = 1/S.")
@json_option
def mmc_abandon_cmd(lam, mu, c, theta, patience, as_json):
    """M/M/c+M (Erlang A): c exponential servers, Poisson arrivals, and exponential patience while
    waiting (a client that closes its stream before the first token). Stable at any load when
    patience is finite: the abandonments carry the excess.

    Example: llmqueue queue mmc-abandon --rate 12 --mu 1 --c 10 --patience 2
    """
    from llmqueue.errors import InputError
    from llmqueue.theory.abandonment import erlang_a

    if (theta is None) == (patience is None):
        raise InputError("theta", "give the abandonment rate --theta or the mean patience --patience (one of them)",
                         "e.g. --patience 30 (seconds), or --theta 0.0333")
    if patience is not None:
        if not patience > 0:
            raise InputError("patience", f"must be a positive number of seconds (got {patience:g})", "e.g. --patience 30")
        theta = 1.0 / patience
    r = erlang_a(lam=lam, mu=mu, c=c, theta=theta)
    pairs = [("lam (offered, req/s)", r.lam), ("mu (req/s)", r.mu), ("c (servers)", r.c),
             ("theta (abandonment rate, 1/s)", r.theta), ("rho (offered utilization)", r.rho),
             ("P_wait", r.P_wait), ("P_abandon", r.P_abandon), ("throughput (served, req/s)", r.throughput),
             ("utilization (carried)", r.utilization), ("L (mean in system)", r.L), ("Lq (mean waiting)", r.Lq),
             ("Wq (mean wait, every arrival, s)", r.Wq), ("Wq (served, s)", r.Wq_served),
             ("Wq (abandoned: time to leave, s)", r.Wq_abandoned), ("W (served, s)", r.W_served)]
    _emit(r, as_json, f"M/M/{r.c}+M (Erlang A; exponential patience while waiting; always stable for theta > 0)",
          pairs)


def _approx_pairs(r):
    return [("lam (req/s)", r.lam), ("mu (req/s)", r.mu), ("c (servers)", r.c), ("scv_a", r.scv_a),
            ("scv_s", r.scv_s), *_means(r), ("exact", r.exact)]


@command("gg1", short_help="G/G/1 mean wait by Kingman's approximation.")
@lam_option
@mu_option
@scv_a_option
@scv_s_option
@json_option
def gg1_cmd(lam, mu, scv_a, scv_s, as_json):
    """G/G/1 by Kingman: Wq ~ rho/(1 - rho) * (scv_a + scv_s)/2 * (1/mu) (approximation; exact if scv_a = 1)."""
    from llmqueue.theory.classic import gg1_kingman

    r = gg1_kingman(lam=lam, mu=mu, scv_a=scv_a, scv_s=scv_s)
    _emit(r, as_json, "G/G/1 (Kingman approximation)", _approx_pairs(r))


@command("ggc", short_help="G/G/c mean wait by the Allen-Cunneen approximation.")
@lam_option
@mu_option
@c_option
@scv_a_option
@scv_s_option
@json_option
def ggc_cmd(lam, mu, c, scv_a, scv_s, as_json):
    """G/G/c by Allen-Cunneen: Wq ~ Wq(M/M/c) * (scv_a + scv_s)/2 (approximation; exact for M/M/c)."""
    from llmqueue.theory.classic import ggc_allen_cunneen

    r = ggc_allen_cunneen(lam=lam, mu=mu, c=c, scv_a=scv_a, scv_s=scv_s)
    _emit(r, as_json, f"G/G/{r.c} (Allen-Cunneen approximation)", _approx_pairs(r))


for _cmd in (mm1_cmd, md1_cmd, mg1_cmd, mmc_cmd, mmck_cmd, mmc_abandon_cmd, gg1_cmd, ggc_cmd):
    queue.add_command(_cmd)
