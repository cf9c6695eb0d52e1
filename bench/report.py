"""Summaries, ratios, acceptance targets, and the table / JSON / PNG / Markdown outputs."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from bench.runner import METRICS

EXTRAS = ["broker_cpu", "gen_cpu_total", "gen_cpu_busiest", "other_cpu", "steal_cpu",
          "steal_burst_ms", "p50_ms",
          "p99_ms", "p999_ms", "max_ms", "target_rate", "connects_per_s", "peak_rss_MB",
          "connected", "sent_per_s", "vs_own_qos0", "missing", "rss_MB_idle", "baseline_rss_MB",
          "connections"]


def summarize(runs: list[dict], brokers: list[str], workloads: list[str]) -> dict:
    summary: dict[str, dict[str, dict]] = {}
    for w in workloads:
        summary[w] = {}
        for b in brokers:
            rs = [r["result"] for r in runs if r["workload"] == w and r["broker"] == b]
            if not rs:
                continue
            ok = [r for r in rs if r.get("status") in ("ok", "partial")]
            cell: dict = {"rounds": len(rs), "ok_rounds": len(ok)}
            if ok:
                cell["value"] = statistics.median(r["value"] for r in ok)
                cell["values"] = [r["value"] for r in ok]
                cell["status"] = "ok" if all(r["status"] == "ok" for r in ok) else "partial"
                for k in EXTRAS:
                    xs = [r[k] for r in ok if isinstance(r.get(k), int | float)]
                    if xs:
                        cell[k] = statistics.median(xs)
                held = sorted({r["cpu_latency_qos"] for r in ok if "cpu_latency_qos" in r})
                if held:
                    cell["cpu_latency_qos"] = " / ".join(held)
            else:
                cell["status"] = rs[-1].get("status", "failed")
                cell["error"] = rs[-1].get("error", "")
            summary[w][b] = cell
    # trie: the ratio to the broker's own qos0 median (same session, same rounds)
    for b, cell in summary.get("trie", {}).items():
        base = summary.get("qos0", {}).get(b, {}).get("value")
        if base and "value" in cell:
            cell["vs_own_qos0"] = cell["value"] / base
    return summary


def ratios(summary: dict) -> dict:
    out: dict[str, dict[str, float | None]] = {}
    for w, cells in summary.items():
        m = cells.get("meshmq", {}).get("value")
        out[w] = {}
        for other in ("mosquitto", "amqtt"):
            o = cells.get(other, {}).get("value")
            out[w][f"meshmq/{other}"] = (m / o) if (m is not None and o) else None
    return out


def targets(summary: dict, rat: dict) -> list[dict]:
    def get(w: str, b: str, key: str = "value") -> float | None:
        return summary.get(w, {}).get(b, {}).get(key)

    def ratio(w: str, other: str) -> float | None:
        return rat.get(w, {}).get(f"meshmq/{other}")

    specs = [
        ("qos0 meshmq/Mosquitto >= 0.5x", ratio("qos0", "mosquitto"), ">=", 0.5),
        ("qos1 meshmq (durable log)/Mosquitto >= 1.0x", ratio("qos1", "mosquitto"), ">=", 1.0),
        ("fanout meshmq/Mosquitto >= 0.5x", ratio("fanout", "mosquitto"), ">=", 0.5),
        ("trie: meshmq drop <= 20% vs its own qos0", get("trie", "meshmq", "vs_own_qos0"), ">=",
         0.8),
        ("qos0 meshmq/amqtt >= 10x", ratio("qos0", "amqtt"), ">=", 10.0),
        ("qos1 meshmq/amqtt >= 10x", ratio("qos1", "amqtt"), ">=", 10.0),
        (f"latency meshmq p99 <= 5 ms ({_host_state(summary)})", get("latency", "meshmq"),
         "<=", 5.0),
        ("idle meshmq <= 16 KiB RSS per connection", get("idle", "meshmq"), "<=", 16.0),
    ]
    out = []
    for name, value, op, thr in specs:
        if value is None:
            verdict = "N/A"
        elif op == ">=":
            verdict = "PASS" if value >= thr else "FAIL"
        else:
            verdict = "PASS" if value <= thr else "FAIL"
        out.append({"target": name, "value": value, "op": op, "threshold": thr,
                    "result": verdict})
    return out


def _host_state(summary: dict) -> str:
    held = summary.get("latency", {}).get("meshmq", {}).get("cpu_latency_qos", "")
    if held.startswith("held"):
        return "CPU latency QoS " + held
    return "host as is: CPU latency QoS " + (held or "not recorded")


# ---------------------------------------------------------------------------------- rendering


def fmt(v: float | None, unit: str = "") -> str:
    if v is None:
        return "-"
    if unit in ("msg/s", "deliveries/s"):
        return f"{v:,.0f}"
    if abs(v) >= 100:
        return f"{v:,.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def _cell(cell: dict | None, unit: str) -> str:
    if not cell:
        return "-"
    if "value" not in cell:
        return cell.get("status", "failed").upper()
    s = fmt(cell["value"], unit)
    if cell.get("status") == "partial" or cell["ok_rounds"] < cell["rounds"]:
        s += "*"
    return s


def metric_label(w: str, doc: dict) -> str:
    name, unit, higher = METRICS[w]
    arrow = "higher is better" if higher else "lower is better"
    if w in ("storm", "idle"):
        n = doc.get("meta", {}).get("mode", {}).get("storm_n")
        name = f"{name} @ {n:,} conns" if n else name
    return f"{name} ({unit}, {arrow})"


def rows(doc: dict) -> tuple[list[str], list[list[str]]]:
    brokers = doc["brokers"]
    head = ["workload", "metric", *brokers, "meshmq/Mosquitto", "meshmq/amqtt"]
    body = []
    for w in doc["workloads"]:
        cells = doc["summary"].get(w, {})
        unit = METRICS[w][1]
        r = doc["ratios"].get(w, {})
        line = [w, metric_label(w, doc)]
        line += [_cell(cells.get(b), unit) for b in brokers]
        for other in ("mosquitto", "amqtt"):
            v = r.get(f"meshmq/{other}")
            line.append("-" if v is None else f"{v:.2f}x")
        body.append(line)
    return head, body


def _pct(c: dict, k: str) -> str:
    return f"{c[k] * 100:.0f}%" if k in c else "-"


def detail_rows(doc: dict) -> tuple[list[str], list[list[str]]]:
    head = ["workload", "broker", "extra", "broker CPU", "generator CPU (busiest proc)",
            "other CPU", "steal"]
    body = []
    for w in doc["workloads"]:
        for b in doc["brokers"]:
            c = doc["summary"].get(w, {}).get(b)
            if not c:
                continue
            if "value" not in c:
                body.append([w, b, f"{c.get('status')}: {c.get('error', '')}"[:90], "", "", "",
                             ""])
                continue
            extra = ""
            if w in ("latency", "latency_untuned"):
                extra = (f"p50 {fmt(c.get('p50_ms'))} / p99 {fmt(c.get('p99_ms'))} / p999 "
                         f"{fmt(c.get('p999_ms'))} ms at {fmt(c.get('target_rate'), 'msg/s')} "
                         f"msg/s")
                if len(c.get("values", ())) > 1:  # the spread is the story on a noisy VM
                    extra += " (p99 per round: " + " / ".join(fmt(v) for v in c["values"]) + ")"
                if "steal_burst_ms" in c:
                    extra += f"; worst 100 ms of steal: {c['steal_burst_ms']:.0f} ms"
                extra += ("; CPU latency QoS " + c["cpu_latency_qos"] if "cpu_latency_qos" in c
                          else "; host as is (idle vCPUs halt)")
            elif w == "trie" and c.get("vs_own_qos0"):
                extra = f"{c['vs_own_qos0']:.2f}x of own qos0"
            elif w == "storm":
                extra = (f"{fmt(c.get('connects_per_s'), 'msg/s')} conn/s, peak RSS "
                         f"{fmt(c.get('peak_rss_MB'))} MB")
            elif w == "idle":
                extra = (f"RSS {fmt(c.get('rss_MB_idle'))} MB with {fmt(c.get('connections'))} "
                         f"idle conns, {fmt(c.get('baseline_rss_MB'))} MB before")
            elif w == "fanout":
                extra = f"{fmt(c.get('sent_per_s'), 'msg/s')} publishes/s"
            gen = (f"{_pct(c, 'gen_cpu_total')} ({_pct(c, 'gen_cpu_busiest')})"
                   if "gen_cpu_total" in c else "-")
            body.append([w, b, extra, _pct(c, "broker_cpu"), gen, _pct(c, "other_cpu"),
                         _pct(c, "steal_cpu")])
    return head, body


def text_table(head: list[str], body: list[list[str]]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body, strict=True)]
    line = lambda r: "  ".join(str(x).ljust(w) for x, w in zip(r, widths, strict=True))  # noqa: E731
    return "\n".join([line(head), line(["-" * w for w in widths]), *map(line, body)])


def md_table(head: list[str], body: list[list[str]]) -> str:
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    out += ["| " + " | ".join(str(x).replace("|", "/") for x in r) + " |" for r in body]
    return "\n".join(out)


def targets_rows(doc: dict) -> tuple[list[str], list[list[str]]]:
    head = ["target", "measured", "result"]
    body = [[t["target"], fmt(t["value"]), t["result"]] for t in doc["targets"]]
    return head, body


def render_text(doc: dict) -> str:
    parts = [text_table(*rows(doc)), "", text_table(*detail_rows(doc)), "",
             text_table(*targets_rows(doc))]
    if doc.get("skipped"):
        parts += ["", *(f"skipped {b}: {why}" for b, why in doc["skipped"].items())]
    parts += ["", "Values are medians over rounds; * = some rounds failed or partial. CPU is in "
              "cores (100% = one core) over the measurement window.", steal_note(doc)]
    if latency_note(doc):
        parts.append(latency_note(doc))
    return "\n".join(parts)


def steal_note(doc: dict) -> str:
    meta = doc.get("meta", {})
    n = len(doc.get("discarded", ()))
    limit = meta.get("steal_limit_cpu")
    if limit is None:
        return ""
    lat = meta.get("steal_limits_cpu", {}).get("latency")
    burst = meta.get("steal_burst_limits_ms", {}).get("latency")
    if lat is not None and burst is not None:
        limit_text = (f"{limit * 100:.0f}% of a core ({lat * 100:.0f}% for latency, or over "
                      f"{burst:.0f} ms stolen in any 100 ms of it)")
    elif lat is not None:
        limit_text = f"{limit * 100:.0f}% of a core ({lat * 100:.0f}% for latency)"
    else:
        limit_text = f"{limit * 100:.0f}% of a core"
    return (f"Runs with hypervisor steal over {limit_text} were run again (up to "
            f"{meta.get('steal_retries', 0)} times; the least-disturbed attempt counts, chosen "
            f"by steal, not by result): {n} attempt(s) set aside, all kept in the JSON.")


def latency_note(doc: dict) -> str:
    if not {"latency", "latency_untuned"} & set(doc.get("workloads", ())):
        return ""
    meta = doc.get("meta", {})
    host = ", ".join(f"{k} {meta[k]}" for k in ("cpuidle_driver", "guest_halt_poll_ns")
                     if k in meta)
    held = {c.get("cpu_latency_qos", "not recorded")
            for c in doc.get("summary", {}).get("latency", {}).values()}
    if held and all(h.startswith("held") for h in held):
        how = ("with a CPU latency QoS request of 0 us held (/dev/cpu_dma_latency, as tuned's "
               "latency-performance profile does), so idle vCPUs poll instead of halting")
    else:
        how = f"on the host as it is: the CPU latency QoS request was {' / '.join(sorted(held))}"
    return (f"latency runs each broker at 50% of its own qos0 maximum {how}; latency_untuned is "
            f"the same run on the host as it is{f' ({host})' if host else ''}, never re-run for "
            "steal. bench/README.md says why.")


def render_markdown(doc: dict) -> str:
    meta = doc.get("meta", {})
    mode = "quick" if meta.get("quick") else "full"
    out = [
        f"Measured with `python -m bench{' --quick' if meta.get('quick') else ''}` on "
        f"{meta.get('machine', 'this machine')} ({meta.get('date', '')}, {mode} mode, "
        f"{meta.get('rounds', '?')} round(s), median shown). Broker and load generator share "
        f"the same {meta.get('cpus', '?')} cores.",
        "",
        md_table(*rows(doc)),
        "",
        md_table(*detail_rows(doc)),
        "",
        md_table(*targets_rows(doc)),
    ]
    if steal_note(doc):
        out += ["", steal_note(doc)]
    if latency_note(doc):
        out += ["", latency_note(doc)]
    if doc.get("skipped"):
        out += ["", *(f"- {b} not measured: {why}" for b, why in doc["skipped"].items())]
    return "\n".join(out) + "\n"


def write_json(doc: dict, path: Path) -> None:
    path.write_text(json.dumps(doc, indent=2, default=str))


def write_png(doc: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ws = [w for w in doc["workloads"] if doc["summary"].get(w)]
    if not ws:
        return
    cols = 4
    nrows = (len(ws) + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(4 * cols, 3.2 * nrows), squeeze=False)
    colors = {"meshmq": "#2a7ab0", "mosquitto": "#7a9a3a", "amqtt": "#c06030"}
    for ax, w in zip(axes.flat, ws, strict=False):
        cells = doc["summary"][w]
        names = [b for b in doc["brokers"] if b in cells]
        vals = [cells[b].get("value") or 0 for b in names]
        bars = ax.bar(names, vals, color=[colors.get(b, "grey") for b in names])
        for bar, b in zip(bars, names, strict=True):
            label = fmt(cells[b].get("value"), METRICS[w][1]) if "value" in cells[b] else \
                cells[b].get("status", "?")
            ax.annotate(label, (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                        ha="center", va="bottom", fontsize=8)
        name, unit, higher = METRICS[w]
        ax.set_title(f"{w}: {name}", fontsize=10)
        ax.set_ylabel(f"{unit} ({'higher' if higher else 'lower'} is better)", fontsize=8)
        ax.tick_params(labelsize=8)
    for ax in list(axes.flat)[len(ws):]:
        ax.axis("off")
    fig.suptitle(f"meshmq bench ({'quick' if doc['meta'].get('quick') else 'full'}, "
                 f"{doc['meta'].get('date', '')})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
