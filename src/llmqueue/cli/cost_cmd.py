"""``llmqueue cost``: tokens per dollar, cost per million tokens, SLO error budgets, replica counts."""

from __future__ import annotations

import click

from llmqueue.cli.common import command, json_option, print_json, print_kv, renamed_option


@click.group("cost", invoke_without_command=True,
             context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.pass_context
def cost(ctx):
    """Cost and operations arithmetic (the Serving Systems course, sections 7 and 9.3).

    \b
    tokens        tokens per dollar = 3600 Q / C_hour, $ per million tokens, effective cost at utilization u
    error-budget  allowed bad requests (1 - SLO target) * N in a window, burned and remaining
    replicas      replicas c = ceil(lam / (mu rho_target)) and the utilization they run at
    """
    if ctx.invoked_subcommand is None:
        click.echo(ctx.get_help())


@command("tokens")
@click.option("--tokens-per-s", "Q", type=float, required=True, help="Throughput Q of the deployment at full load (tokens/s).")
@click.option("--price-per-hour", "C_hour", type=float, required=True, help="Cost C_hour of the deployment ($/hour).")
@click.option("--utilization", "u", type=float, default=1.0, show_default=True,
              help="Fraction u of the capacity actually used, in (0, 1]: idle capacity is paid for.")
@json_option
def tokens_cmd(Q, C_hour, u, as_json):
    """Tokens per dollar (3600 Q / C_hour) and dollars per million tokens (C_hour 1e6 / (3600 Q)).

    At utilization u the effective cost per token is divided by u.

    JSON keys: Q, C_hour, u, tokens_per_dollar, dollars_per_Mtok, tokens_per_dollar_eff,
    dollars_per_Mtok_eff, dollars_per_token_eff.

    Example: llmqueue cost tokens --tokens-per-s 2500 --price-per-hour 8 --utilization 0.5
    """
    from llmqueue.theory.cost import token_cost

    r = token_cost(Q=Q, C_hour=C_hour, u=u)
    if as_json:
        print_json(r)
        return
    print_kv([
        ("throughput Q (tokens/s)", r.Q),
        ("cost C_hour ($/hour)", r.C_hour),
        ("tokens per $ (full load)", r.tokens_per_dollar),
        ("$ per 1M tokens (full load)", f"{r.dollars_per_Mtok:.4g}"),
        ("utilization u", r.u),
        ("tokens per $ at u", r.tokens_per_dollar_eff),
        ("$ per 1M tokens at u", f"{r.dollars_per_Mtok_eff:.4g}"),
    ], title="Token cost (the Serving Systems course, 7.2-7.4)")


@command("error-budget")
@click.option("--slo-target", "slo_target", type=float, required=True,
              help="Fraction of requests that must be good, e.g. 0.999.")
@click.option("--requests", "N", type=float, help="Requests in the window.")
@click.option("--rate", "lam", type=float, help="Arrival rate (req/s); use with --window-s instead of --requests.")
@click.option("--window-s", "window", type=float, help="Window length (s).")
@click.option("--bad", "bad", type=float, help="Bad requests observed so far in the window.")
@json_option
def error_budget_cmd(slo_target, N, lam, window, bad, as_json):
    """SLO error budget: (1 - slo_target) * N bad requests allowed in the window.

    Give --requests N, or --rate R --window-s S (N = R S). With --bad: the fraction of the budget
    burned and what remains (negative when overspent). With a window: the full-outage time the
    budget covers, (1 - slo_target) * window.

    JSON keys: slo_target, N, lam, window, allowed, downtime, bad, burned, remaining, exhausted.

    Example: llmqueue cost error-budget --slo-target 0.999 --rate 100 --window-s 2592000
    """
    from llmqueue.theory.cost import error_budget

    r = error_budget(slo_target=slo_target, N=N, lam=lam, window=window, bad=bad)
    if as_json:
        print_json(r)
        return
    pairs = [("SLO target", r.slo_target), ("requests in window N", r.N)]
    if r.lam is not None:
        pairs += [("rate (req/s)", r.lam)]
    if r.window is not None:
        pairs += [("window (s)", r.window)]
    pairs += [("allowed bad requests", r.allowed)]
    if r.downtime is not None:
        pairs += [("full-outage time covered (s)", r.downtime)]
    if r.bad is not None:
        pairs += [("bad requests", r.bad), ("budget burned", f"{100 * r.burned:.4g}%"),
                  ("remaining", r.remaining), ("exhausted", r.exhausted)]
    print_kv(pairs, title="Error budget (the Serving Systems course, 9.3)")


@command("replicas")
@renamed_option("--rate", "lam", old=("--lam",), type=float, required=True, metavar="REQ/S",
                help="Arrival rate lam (req/s) across all replicas.")
@click.option("--mu", type=float, required=True, help="Service rate mu of one replica (req/s).")
@click.option("--rho-target", "rho_target", type=float, default=0.75, show_default=True,
              help="Target per-replica utilization, in (0, 1).")
@json_option
def replicas_cmd(lam, mu, rho_target, as_json):
    """Replicas c = ceil(lam / (mu rho_target)) and their utilization rho = lam / (c mu).

    JSON keys: lam, mu, rho_target, a (offered load lam/mu), c, rho, c_stable (fewest replicas with rho < 1).

    Example: llmqueue cost replicas --rate 300 --mu 100 --rho-target 0.7
    """
    from llmqueue.theory.cost import replicas_for_utilization

    r = replicas_for_utilization(lam=lam, mu=mu, rho_target=rho_target)
    if as_json:
        print_json(r)
        return
    print_kv([
        ("arrival rate lam (req/s)", r.lam), ("per-replica rate mu (req/s)", r.mu),
        ("offered load lam/mu", r.a), ("target utilization", r.rho_target),
        ("replicas c", r.c), ("utilization at c", r.rho), ("fewest stable replicas", r.c_stable),
    ], title="Replicas for a target utilization")


cost.add_command(tokens_cmd)
cost.add_command(error_budget_cmd)
cost.add_command(replicas_cmd)
