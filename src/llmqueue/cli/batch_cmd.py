"""``llmqueue batch``: Inference Foundations' batch-service model, its B_min bounds, the P99 decision and Table 2."""

from __future__ import annotations

import math

import click

from llmqueue.cli.common import command, fmt, json_option, print_json, print_kv, print_table, renamed_option

DEFAULT_SIZES = (1, 2, 4, 8, 16, 32, 64)


def _ms(x: float) -> float:
    """Seconds to milliseconds, keeping inf/NaN (printed as null in JSON)."""
    return x * 1e3


def _parse_sizes(text: str) -> list[int]:
    from llmqueue._validate import positive_int
    from llmqueue.errors import InputError

    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise InputError("sizes", f"no batch sizes in {text!r}", "give a comma-separated list, e.g. 1,4,8,16,32")
    return [positive_int("sizes", t) for t in items]


def _row_json(r) -> dict:
    return {
        "batch_size": r.B,
        "effective_batch_size": r.B_eff,
        "t_svc_ms": _ms(r.T_svc),
        "mu_eff_per_s": r.mu_eff,
        "rho": r.rho,
        "stable": r.stable,
        "mean_wait_ms": _ms(r.Wq),
        "mean_accumulation_ms": _ms(r.T_batch),
        "mean_response_ms": _ms(r.W),
        "in_system": r.L,
        "sd_response_ms": _ms(r.sigma_T),
        "p99_normal_ms": _ms(r.P99_normal),
        "p99_exponential_ms": _ms(r.P99_exponential),
        "refined_mean_wait_ms": _ms(r.Wq_refined),
        "refined_mean_accumulation_ms": _ms(r.T_batch_refined),
        "refined_mean_response_ms": _ms(r.W_refined),
        "refined_in_system": r.L_refined,
        "action": r.action,
    }


def _pct(rho: float, stable: bool) -> str:
    s = f"{100 * rho:.1f}%"
    return s if stable else s + " (unstable)"


def _f1(x: float) -> str:
    if math.isnan(x):
        return "-"
    return "inf" if math.isinf(x) else f"{x:.1f}"


@command("batch")
@renamed_option("--rate", "lam", old=("--lam",), type=float, required=True, metavar="REQ/S",
                help="Arrival rate lam (req/s, Poisson).")
@click.option("--t-fixed-ms", "t_fixed_ms", type=float, required=True,
              help="Fixed time per batch T_fixed (ms): kernel launches, weight loading.")
@click.option("--t-req-ms", "t_req_ms", type=float, required=True, help="Marginal time per request t_req (ms).")
@click.option("--sizes", help="Batch sizes to tabulate, comma-separated (default 1,2,4,...,64; "
                              "with --b-max and no --sizes: B_min, 2 B_min, ..., B_max).")
@click.option("--rho-target", "rho_target", type=float, default=0.75, show_default=True,
              help="Target utilization for B_min (equation 2).")
@click.option("--slo-ms", "slo_ms", type=float, help="P99 latency SLO (ms): adds the P99 columns and the decision.")
@click.option("--b-max", "b_max", type=int, help="Largest batch size (the decision's B_max; caps --sizes).")
@click.option("--t-max-ms", "t_max_ms", type=float,
              help="Dynamic-batching timeout T_max (ms); each row's B is then the cap B_max.")
@click.option("--sigma-ms", "sigma_ms", type=float,
              help="Measured standard deviation of the response time (ms) for the normal P99 (default: the model's).")
@click.option("--p99", "p99", type=click.Choice(["normal", "exponential"]), default="normal", show_default=True,
              help="P99 approximation used by the decision: E[T] + 2.33 sigma_T, or -ln(0.01) E[T] (~4.6 E[T]).")
@json_option
def batch(lam, t_fixed_ms, t_req_ms, sizes, rho_target, slo_ms, b_max, t_max_ms, sigma_ms, p99, as_json):
    """Batch-service model T_svc(B) = T_fixed + t_req*B under Poisson arrivals (Inference Foundations).

    Per batch size B: T_svc, capacity mu_eff = B/T_svc, utilization rho = lam T_svc/B, the
    M/D/1-on-batches queue wait E[W] = lam T_svc^2 / (2B(1-rho)), accumulation E[T_batch]
    = B/(2 lam) (with --t-max-ms: T_max/2 when lam T_max < B), and E[T] = E[W] + E[T_batch]
    + T_svc. Unstable rows (rho >= 1) show inf (JSON null). Also B_min for stability and for
    --rho-target (equation 2), the Table 2 action per row and, with --slo-ms, the largest B
    whose P99 meets the SLO.

    REFINED columns (not in the seed): batches of exactly B Poisson arrivals form an Erlang-B
    stream, so the batch queue is E_B/D/1 (exact, via Spitzer's identity) and the mean
    accumulation is (B-1)/(2 lam).

    JSON: lam, t_fixed_ms, t_req_ms, rho_target, t_max_ms, slo_ms, sigma_ms, b_max,
    p99_method; b_min_stability, b_min_stability_int, b_min_target, b_min_target_int;
    lowest_mean_response_batch_size, lowest_refined_mean_response_batch_size; rows[]:
    batch_size, effective_batch_size, t_svc_ms, mu_eff_per_s (req/s), rho (fraction),
    stable, mean_wait_ms (E[W]), mean_accumulation_ms (E[T_batch]), mean_response_ms
    (E[T]), in_system (L = lam E[T]), sd_response_ms, p99_normal_ms, p99_exponential_ms,
    refined_mean_wait_ms, refined_mean_accumulation_ms, refined_mean_response_ms,
    refined_in_system, action; decision (null without --slo-ms): slo_ms, p99_method,
    candidates, batch_size, batch_size_normal, batch_size_exponential,
    lowest_mean_response_batch_size, lowest_refined_mean_response_batch_size,
    action_batch_size, action.

    Inference Foundations, Table 1: llmqueue batch --rate 100 --t-fixed-ms 50 --t-req-ms 0.5 --sizes 1,4,8,16,32
    """
    from llmqueue._validate import nonnegative, positive, positive_int, probability
    from llmqueue.errors import InputError
    from llmqueue.theory.batch import b_min_stability, batch_table, candidate_sizes

    lam = positive("lam", lam)
    t_fixed_ms = positive("t_fixed_ms", t_fixed_ms)
    t_req_ms = nonnegative("t_req_ms", t_req_ms)
    rho_target = probability("rho_target", rho_target)
    slo_ms = None if slo_ms is None else positive("slo_ms", slo_ms)
    t_max_ms = None if t_max_ms is None else positive("t_max_ms", t_max_ms)
    sigma_ms = None if sigma_ms is None else nonnegative("sigma_ms", sigma_ms)
    b_max = None if b_max is None else positive_int("b_max", b_max)
    T_fixed, t_req = t_fixed_ms / 1e3, t_req_ms / 1e3

    if sizes is not None:
        bs = _parse_sizes(sizes)
        if b_max is not None:
            bs = [b for b in bs if b <= b_max]
            if not bs:
                raise InputError("b_max", f"every --sizes value exceeds --b-max {b_max}")
    elif b_max is not None:
        bs = candidate_sizes(B_min=b_min_stability(lam=lam, T_fixed=T_fixed, t_req=t_req).B_min_int, B_max=b_max)
    else:
        bs = list(DEFAULT_SIZES)

    t = batch_table(lam=lam, T_fixed=T_fixed, t_req=t_req, sizes=bs, rho_target=rho_target,
                    T_max=None if t_max_ms is None else t_max_ms / 1e3,
                    sigma=None if sigma_ms is None else sigma_ms / 1e3,
                    slo=None if slo_ms is None else slo_ms / 1e3, p99=p99)
    d = t.decision
    out = {
        "model": "T_svc(B) = T_fixed + t_req*B, M/D/1 on batches (Inference Foundations); refined_*: E_B/D/1",
        "lam": lam, "t_fixed_ms": t_fixed_ms, "t_req_ms": t_req_ms, "rho_target": rho_target,
        "t_max_ms": t_max_ms, "slo_ms": slo_ms, "sigma_ms": sigma_ms, "b_max": b_max, "p99_method": p99,
        "b_min_stability": t.b_min_stability.B_min, "b_min_stability_int": t.b_min_stability.B_min_int,
        "b_min_target": t.b_min_target.B_min, "b_min_target_int": t.b_min_target.B_min_int,
        "lowest_mean_response_batch_size": t.B_mean_opt,
        "lowest_refined_mean_response_batch_size": t.B_mean_opt_refined,
        "rows": [_row_json(r) for r in t.rows],
        "decision": None if d is None else {
            "slo_ms": slo_ms, "p99_method": d.p99_method, "candidates": list(d.candidates),
            "batch_size": d.B_slo, "batch_size_normal": d.B_slo_normal,
            "batch_size_exponential": d.B_slo_exponential,
            "lowest_mean_response_batch_size": d.B_mean_opt,
            "lowest_refined_mean_response_batch_size": d.B_mean_opt_refined,
            "action_batch_size": d.B_action, "action": d.action,
        },
    }
    if as_json:
        print_json(out)
        return

    timeout = t_max_ms is not None
    headers = ["B"] + (["B_eff"] if timeout else []) + ["T_svc ms", "req/s", "rho", "E[W] ms", "E[T_batch] ms",
                                                       "E[T] ms", "refined E[T] ms"]
    if d is not None:
        headers += ["sd ms", "P99 normal ms", "P99 exp ms"]
    headers += ["action"]
    rows = []
    for r in t.rows:
        row = [str(r.B)] + ([fmt(r.B_eff, 3)] if timeout else [])
        row += [_f1(_ms(r.T_svc)), _f1(r.mu_eff), _pct(r.rho, r.stable), _f1(_ms(r.Wq)), _f1(_ms(r.T_batch)),
                _f1(_ms(r.W)), _f1(_ms(r.W_refined))]
        if d is not None:
            row += [_f1(_ms(r.sigma_T)), _f1(_ms(r.P99_normal)), _f1(_ms(r.P99_exponential))]
        rows.append(row + [r.action])
    title = (f"Batch service T_svc(B) = {t_fixed_ms:g} + {t_req_ms:g}*B ms at lam = {lam:g} req/s (Inference Foundations)"
             + (f", timeout T_max = {t_max_ms:g} ms" if timeout else ""))
    print_table(headers, rows, title=title)
    click.echo()
    s, g = t.b_min_stability, t.b_min_target
    pairs = [
        ("B_min, stability (mu_eff > lam)", f"{s.B_min:.4g} -> {s.B_min_int}"),
        (f"B_min, rho <= {rho_target:g} (equation 2)", f"{g.B_min:.4g} -> {g.B_min_int}"),
        ("lowest E[T] (seed / refined)", f"B = {fmt(t.B_mean_opt)} / B = {fmt(t.B_mean_opt_refined)}"),
    ]
    if d is not None:
        def pick(b):
            return "none" if b is None else f"B = {b}"
        pairs += [
            (f"largest B with P99 <= {slo_ms:g} ms (normal)", pick(d.B_slo_normal)),
            (f"largest B with P99 <= {slo_ms:g} ms (exponential)", pick(d.B_slo_exponential)),
            (f"action ({d.p99_method} P99) at B = {fmt(d.B_action)}", d.action),
        ]
    print_kv(pairs)
    click.echo()
    click.echo("E[W]: M/D/1 wait of a batch, lam T_svc^2/(2B(1-rho)); E[T_batch] = B/(2 lam); "
               "E[T] = E[W] + E[T_batch] + T_svc.")
    click.echo("refined: E_B/D/1 (batches of exactly B Poisson arrivals; Spitzer's identity) "
               "with accumulation (B-1)/(2 lam); not in the seed.")
