"""The ``scale`` group of ``python -m bench.cluster`` for any number of routers.

``--routers 1,2,4,8`` runs ``scale_r<N>`` (one node, ``routers = N``, ``--pairs`` publishers ->
as many subscribers, QoS 0 on unlogged topics, every connection placed by the kernel through
``SO_REUSEPORT``) for each N, A/B interleaved (the list forwards in even rounds, backwards in
odd ones, so slow drift of the machine hits every N alike). For each N the scale table gives
the aggregate msg/s, its ratio to ``scale_r1`` (the median of the per-round ratios, as the
target rows), broker CPU per message, the share of messages that crossed a link and what a
crossing costs over a local delivery. The r2/r1 target row of ``bench/cluster.py`` is unchanged.

The generator is sized with the pairs: one publisher process per ``PAIRS_PER_PUBLISHER`` pairs
(each with two subscriber processes), so 32 pairs run exactly as before (1 + 2 processes) and
128 pairs on a 16-core machine get 4 + 8. A generator process near a full core is the ceiling,
not the broker: the table shows the busiest one and flags it (like Kafka's and EMQX's
benchmark guides, which ask for more producer hosts before reading a broker figure as a limit).
"""

from __future__ import annotations

import statistics

#: Pairs per publisher process (with two subscriber processes each): 32 is the historic
#: 32-pair shape of scale_r1/scale_r2, so their figures stay comparable with earlier runs.
PAIRS_PER_PUBLISHER = 32
#: A generator process busier than this (share of one core) may be what limited the rate.
GEN_CEILING = 0.85
MAX_PAIRS = 999  # topics bench/p000..p999: one length, so one packet size per subscriber


def workload(n: int) -> str:
    return f"scale_r{n}"


def parse_routers(text: str) -> list[int]:
    """``"1,2,4,8"`` -> [1, 2, 4, 8]; ValueError (said to the user) on anything else."""
    out: list[int] = []
    for part in text.split(","):
        n = int(part)  # ValueError on junk
        if n < 1 or n > 64:
            raise ValueError(f"{n}: routers must be 1..64")
        if n not in out:
            out.append(n)
    if 1 not in out:  # every ratio is to scale_r1
        out.insert(0, 1)
    return out


def register(routers: list[int], pairs: int, workloads: dict, group_of: dict) -> None:
    """Add ``scale_r<N>`` for every N to the bench's workload table (label, unit, higher is
    better), replacing the 1- and 2-router labels so they name this run's pair count."""
    for n in routers:
        w = workload(n)
        workloads[w] = (f"1 node, routers = {n}: {pairs} pub -> {pairs} sub, QoS 0", "msg/s",
                        True)
        group_of[w] = "scale"


def order(routers: list[int], rnd: int) -> list[int]:
    """A/B then B/A: forwards in even rounds, backwards in odd ones."""
    return list(routers) if rnd % 2 == 0 else list(reversed(routers))


def generator_shape(pairs: int) -> list[tuple[int, int]]:
    """Publisher groups as (first pair, last pair + 1): one publisher process each."""
    groups = max(1, -(-pairs // PAIRS_PER_PUBLISHER))
    size = -(-pairs // groups)  # as even as possible: 40 pairs -> 20 + 20, not 32 + 8
    return [(a, min(pairs, a + size)) for a in range(0, pairs, size)]


def _ok(doc: dict, w: str) -> list[dict]:
    return [r for r in doc["runs"] if r["workload"] == w and r["result"].get("status") == "ok"]


def _median_run(doc: dict, w: str) -> dict | None:
    runs = sorted((r["result"] for r in _ok(doc, w)), key=lambda r: r["value"])
    return runs[(len(runs) - 1) // 2] if runs else None


def _us(r: dict | None) -> float | None:
    if not r or not r.get("value") or "broker_cpu" not in r:
        return None
    return r.get("us_per_msg") or r["broker_cpu"] * 1e6 / r["value"]


def rows(doc: dict) -> list[dict]:
    """One row per N run: median msg/s, ratio to scale_r1 (median of per-round ratios),
    broker us/msg, crossed share, us per crossing, the busiest generator process."""
    ns = doc["meta"].get("scale_routers") or [1, 2]
    base = {r["round"]: r["result"]["value"] for r in _ok(doc, workload(1))}
    r1 = _us(_median_run(doc, workload(1)))
    out = []
    for n in ns:
        w = workload(n)
        ok = _ok(doc, w)
        ratios = [r["result"]["value"] / base[r["round"]] for r in ok if base.get(r["round"])]
        med = _median_run(doc, w)
        us = _us(med)
        share = (med or {}).get("crossed_link_share")
        tried = sum(1 for r in doc["runs"] if r["workload"] == w)
        out.append({
            "routers": n, "workload": w,
            "value": statistics.median(r["result"]["value"] for r in ok) if ok else None,
            "ok_runs": len(ok), "runs": tried,
            "ratio": statistics.median(ratios) if ratios else None,
            "per_round": [round(x, 3) for x in ratios],
            "us_per_msg": us, "crossed_link_share": share,
            "us_per_crossing": ((us - r1) / share if us is not None and r1 is not None
                                and share else None),
            "gen_busiest": (med or {}).get("gen_cpu_busiest"),
            "broker_cpu": (med or {}).get("broker_cpu"),
        })
    return out


def table(doc: dict) -> tuple[list[str], list[list[str]]]:
    """The scale table (header, body) for bench/cluster.py's text and Markdown output."""
    def f(x: float | None, spec: str, suffix: str = "") -> str:
        return "-" if x is None else f"{x:{spec}}{suffix}"

    body = []
    for r in rows(doc):
        gen = f(r["gen_busiest"] and r["gen_busiest"] * 100, ".0f", "%")
        if r["gen_busiest"] is not None and r["gen_busiest"] > GEN_CEILING:
            gen += " (generator-bound?)"
        body.append([
            f"{r['routers']}", f(r["value"], ",.0f"),
            f(r["ratio"], ".2f", "x") + (f" ({' / '.join(f'{x:.2f}' for x in r['per_round'])})"
                                        if len(r["per_round"]) > 1 else ""),
            f(r["broker_cpu"] and r["broker_cpu"] * 100, ".0f", "%"),
            f(r["us_per_msg"], ".1f"), f(r["crossed_link_share"] and
                                         r["crossed_link_share"] * 100, ".0f", "%"),
            f(r["us_per_crossing"], ".1f"), gen,
            f"{r['ok_runs']}/{r['runs']}"])
    head = ["routers", "msg/s (median)", "x routers = 1 (per round)", "broker CPU",
            "broker us/msg", "crossed a link", "us/crossing", "busiest generator proc",
            "ok runs"]
    return head, body
