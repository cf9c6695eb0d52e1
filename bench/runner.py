"""The coordinator: runs each workload against one freshly started broker, with time bounds.

Workers are forked processes (``loadgen.worker_main``); the coordinator itself stays
synchronous and only samples counters and /proc, so it takes next to no CPU.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import queue
import statistics
import time
from dataclasses import dataclass

from bench import loadgen as lg
from bench.brokers import Broker, cpu_seconds, machine_busy_seconds, machine_steal_seconds

WORKLOADS = ["qos0", "qos1", "qos2", "fanin", "fanout", "trie", "large", "latency",
             "latency_untuned", "storm", "idle"]

# metric name, unit, True when higher is better
METRICS = {
    "qos0": ("throughput", "msg/s", True),
    "qos1": ("throughput", "msg/s", True),
    "qos2": ("throughput", "msg/s", True),
    "fanin": ("throughput", "msg/s", True),
    "fanout": ("deliveries", "deliveries/s", True),
    "trie": ("throughput", "msg/s", True),
    "large": ("bandwidth", "MB/s", True),
    "latency": ("p99", "ms", False),
    "latency_untuned": ("p99", "ms", False),
    "storm": ("connect time", "s", False),
    "idle": ("RSS per connection", "KiB", False),
}

DEVICE_TOPIC = "devices/bench-0001/telemetry"


@dataclass
class Mode:
    warmup: float
    duration: float
    rounds: int
    storm_n: int
    fanin_pubs: int
    fanout_subs: int
    trie_filters: int
    settle: float
    ready_timeout: float


FULL = Mode(warmup=1.0, duration=5.0, rounds=3, storm_n=10_000, fanin_pubs=100,
            fanout_subs=1000, trie_filters=10_000, settle=1.0, ready_timeout=60.0)
QUICK = Mode(warmup=0.3, duration=1.0, rounds=1, storm_n=1000, fanin_pubs=100,
             fanout_subs=1000, trie_filters=10_000, settle=0.3, ready_timeout=20.0)


class Phase:
    """A set of worker processes that share one control array; always cleaned up."""

    def __init__(self, broker: Broker, mode: Mode, tag: str):
        self.broker = broker
        self.mode = mode
        self.tag = tag
        self.ctx = multiprocessing.get_context("fork")
        self.specs: list[tuple[str, dict]] = []
        self.procs: list = []
        self.arr = None
        self.results = self.ctx.Queue()
        self.reports: dict[int, dict] = {}

    def add(self, kind: str, **params) -> int:
        base = lg.HEADER_SLOTS + lg.WORKER_SLOTS * len(self.specs)
        params.setdefault("port", self.broker.port)
        params.setdefault("tag", self.tag)
        self.specs.append((kind, params))
        return base

    def start(self, extra_time: float = 0.0) -> None:
        n = lg.HEADER_SLOTS + lg.WORKER_SLOTS * len(self.specs)
        self.arr = self.ctx.RawArray("q", n)
        m = self.mode
        deadline = time.monotonic() + m.ready_timeout + m.warmup + m.duration + extra_time + 10
        for i, (kind, params) in enumerate(self.specs):
            params["deadline"] = deadline
            base = lg.HEADER_SLOTS + lg.WORKER_SLOTS * i
            p = self.ctx.Process(target=lg.worker_main, args=(kind, params, self.arr, base,
                                                              self.results), daemon=True)
            p.start()
            self.procs.append(p)

    def slot(self, base: int, field: int) -> int:
        return self.arr[base + field]

    def total(self, field: int, kinds: tuple[str, ...]) -> int:
        return sum(self.arr[lg.HEADER_SLOTS + lg.WORKER_SLOTS * i + field]
                   for i, (k, _) in enumerate(self.specs) if k in kinds)

    def wait_ready(self, timeout: float) -> str | None:
        """None when every worker is ready, else why not."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            states = [self.arr[lg.HEADER_SLOTS + lg.WORKER_SLOTS * i + lg.READY]
                      for i in range(len(self.specs))]
            if any(s < 0 for s in states):
                self._drain(0.5)
                errs = [r.get("error") for r in self.reports.values() if r.get("error")]
                return f"worker failed: {errs[0] if errs else 'unknown'}"
            if all(s > 0 for s in states):
                return None
            if not self.broker.alive():
                return f"broker died: {self.broker.log_tail()}"
            dead = [p for p in self.procs if not p.is_alive()]
            if dead:
                self._drain(0.5)
                errs = [r.get("error") for r in self.reports.values() if r.get("error")]
                return f"worker exited: {errs[0] if errs else dead[0].exitcode}"
            time.sleep(0.01)
        return f"setup did not finish within {timeout:.0f}s (broker stalled?)"

    def go(self) -> None:
        self.arr[lg.GO] = 1

    def worker_states(self, wait: float = 0.5) -> list[dict]:
        """Each worker's kind, READY slot (-1: it failed), whether its process lives and the
        error it reported (waiting up to ``wait`` s for reports): for a stalled run's report
        (which side stopped), and to refuse a rate measured with a worker gone."""
        self._drain(wait)
        out = []
        for i, ((kind, _), proc) in enumerate(zip(self.specs, self.procs, strict=False)):
            base = lg.HEADER_SLOTS + lg.WORKER_SLOTS * i
            out.append({"kind": kind, "ready": self.arr[base + lg.READY],
                        "alive": proc.is_alive(),
                        "error": self.reports.get(base, {}).get("error")})
        return out

    def lost_workers(self) -> list[dict]:
        """Workers gone mid-run (failed, or their process exited): a rate measured then is
        the survivors', not the workload's (a publisher whose connections the broker took
        over, as two workers sharing client ids once did: bench/loadgen.py)."""
        return [w for w in self.worker_states(wait=0.0) if w["ready"] != 1 or not w["alive"]]

    def cpu(self) -> list[float]:
        return [cpu_seconds([p.pid]) for p in self.procs]

    def snapshot(self, fields: dict[str, tuple[int, tuple[str, ...]]]) -> dict:
        by_proc = getattr(self.broker, "cpu_by_process", None)  # a cluster: one per process
        return {"t": time.monotonic(), "broker_cpu": self.broker.cpu_seconds(),
                "broker_procs": by_proc() if by_proc else {},
                "machine": machine_busy_seconds(),
                "steal": machine_steal_seconds(),
                "gen_cpu": self.cpu(),
                **{name: self.total(f, kinds) for name, (f, kinds) in fields.items()}}

    def _drain(self, timeout: float) -> None:
        end = time.monotonic() + timeout
        while len(self.reports) < len(self.procs) and time.monotonic() < end:
            try:
                base, rep = self.results.get(timeout=max(0.01, end - time.monotonic()))
            except queue.Empty:
                break
            self.reports[base] = rep

    def stop(self, wait: float = 5.0) -> dict[int, dict]:
        if self.arr is not None:
            self.arr[lg.STOP] = 1
        self._drain(wait)
        for p in self.procs:
            p.join(timeout=1.0)
            if p.is_alive():
                p.terminate()
                p.join(timeout=1.0)
            if p.is_alive():
                p.kill()
                p.join(timeout=1.0)
        with contextlib.suppress(Exception):
            self.results.close()
        return self.reports


# Window of the steal-burst figure: a tenth of a second, long against a 1 ms publish period and
# short against the 50 ms that 1% of a 5 s latency window is.
STEAL_BURST_SPAN_S = 0.1


def _cpu_stats(s0: dict, s1: dict) -> dict:
    dt = s1["t"] - s0["t"]
    gen = [b - a for a, b in zip(s0["gen_cpu"], s1["gen_cpu"], strict=True)]
    broker = (s1["broker_cpu"] - s0["broker_cpu"]) / dt
    busy = (s1["machine"] - s0["machine"]) / dt
    steal = (s1["steal"] - s0["steal"]) / dt
    procs = {name: round((s1["broker_procs"][name] - cpu0) / dt, 3)
             for name, cpu0 in s0.get("broker_procs", {}).items()
             if name in s1.get("broker_procs", {})}
    return {
        **({"broker_procs_cpu": procs} if procs else {}),
        "window_s": round(dt, 3),
        "broker_cpu": round(broker, 3),
        "gen_cpu_total": round(sum(gen) / dt, 3),
        "gen_cpu_busiest": round(max(gen) / dt, 3) if gen else 0.0,
        "gen_cpu_each": [round(g / dt, 3) for g in gen],  # per worker, in Phase.add order
        # Busy cores on the whole machine not explained by broker + generator (kernel softirq,
        # other people's jobs): a large value means the run was disturbed.
        "other_cpu": round(max(0.0, busy - steal - broker - sum(gen) / dt), 3),
        # vCPU time the hypervisor gave to other guests: every stolen slice stalls whoever ran
        # on that vCPU, so latency tails follow this more than anything the broker does.
        "steal_cpu": round(steal, 3),
    }


def _measure(ph: Phase, fields: dict, primary: str) -> tuple[dict, dict] | str:
    """GO, warm up, then measure over the window. Returns (deltas, cpu) or a failure reason."""
    m = ph.mode
    ph.go()
    end = time.monotonic() + m.warmup
    while time.monotonic() < end:
        if not ph.broker.alive():
            return f"broker died: {ph.broker.log_tail()}"
        time.sleep(0.02)
    s0 = ph.snapshot(fields)
    end = s0["t"] + m.duration
    # Stall check: the primary counter must move in every quarter of the window.
    checks = [s0["t"] + m.duration * k / 4 for k in (1, 2, 3)]
    last = s0[primary]
    steal = [(s0["t"], s0["steal"])]  # sampled every ~10 ms for the worst burst
    while time.monotonic() < end:
        steal.append((time.monotonic(), machine_steal_seconds()))
        if not ph.broker.alive():
            return f"broker died: {ph.broker.log_tail()}"
        if checks and time.monotonic() >= checks[0]:
            checks.pop(0)
            now = ph.total(*fields[primary])
            if now == last:
                return (f"stalled: nothing delivered for {m.duration / 4:.2f}s "
                        f"({now - s0[primary]} in the window before)")
            last = now
        time.sleep(0.01)
    s1 = ph.snapshot(fields)
    dt = s1["t"] - s0["t"]
    deltas = {k: (s1[k] - s0[k]) / dt for k in fields}
    if deltas[primary] <= 0 or s1[primary] == last:
        return "stalled: nothing delivered during the (end of the) measurement window"
    steal.append((s1["t"], s1["steal"]))
    return deltas, {**_cpu_stats(s0, s1), "steal_burst_ms": round(_worst_burst(steal) * 1e3, 1)}


def _worst_burst(samples: list[tuple[float, float]], span: float = STEAL_BURST_SPAN_S) -> float:
    """Most vCPU time stolen within any ``span`` seconds of the window (both vCPUs summed).

    The average steal hides what breaks a p99: 40 ms stolen in one 100 ms slice is under 1% of a
    5 s window, yet everything routed in and after that slice waits for it."""
    worst = 0.0
    j = 0
    for t, v in samples:
        while t - samples[j][0] > span:
            j += 1
        worst = max(worst, v - samples[j][1])
    return worst


def _throughput(broker: Broker, mode: Mode, tag: str, *, qos: int, topics: list[str],
                sub_filter: str, sub_topic: str, n_subs: int = 1, payload_len: int = 64,
                window: int = 2000, batch: int = 64, idle_filters: int = 0,
                scale: float = 1.0, sub_procs: int = 1, pub_port: int | None = None,
                sub_port: int | None = None) -> dict:
    """One throughput run. ``pub_port``/``sub_port``: connect publishers/subscribers to another
    port than the broker's (the nodes of a cluster, bench/cluster.py)."""
    ph = Phase(broker, mode, tag)
    ports = {"pub": {"port": pub_port} if pub_port else {},
             "sub": {"port": sub_port} if sub_port else {}}
    try:
        if idle_filters:
            ph.add("idle_subs", n_conns=10, filters=idle_filters)
        per_proc = [n_subs // sub_procs + (i < n_subs % sub_procs) for i in range(sub_procs)]
        recv_slots = [ph.add("sub", n=k, filter=sub_filter, topic=sub_topic, qos=qos,
                             payload_len=payload_len, **ports["sub"]) + lg.RECV
                      for k in per_proc]
        if qos == 0:
            ph.add("pub0", topics=topics, payload_len=payload_len, window=window, batch=batch,
                   recv_slots=recv_slots, fanout=n_subs, **ports["pub"])
        else:
            ph.add("pubn", topic=topics[0], payload_len=payload_len, qos=qos, window=window,
                   recv_slots=recv_slots, **ports["pub"])
        ph.start()
        why = ph.wait_ready(mode.ready_timeout)
        if why:
            return {"status": "failed", "error": why}
        fields = {"recv": (lg.RECV, ("sub",)), "bytes": (lg.BYTES, ("sub",)),
                  "sent": (lg.SENT, ("pub0", "pubn"))}
        res = _measure(ph, fields, "recv")
        if isinstance(res, str):
            return {"status": "stalled" if res.startswith("stalled") else "failed", "error": res}
        if ph.lost_workers():
            return {"status": "failed", "error": "a generator worker failed during the run",
                    "workers": ph.worker_states()}
        d, cpu = res
        value = d["recv"] * scale
        return {"status": "ok", "value": value, "recv_per_s": d["recv"], "sent_per_s": d["sent"],
                "payload_MBps": d["recv"] * payload_len / 1e6, **cpu}
    finally:
        ph.stop()


def run_qos0(b: Broker, m: Mode, ctx: dict) -> dict:
    return _throughput(b, m, "q0", qos=0, topics=["bench/0"], sub_filter="bench/0",
                       sub_topic="bench/0")


def run_qos1(b: Broker, m: Mode, ctx: dict) -> dict:
    return _throughput(b, m, "q1", qos=1, topics=[DEVICE_TOPIC], sub_filter=DEVICE_TOPIC,
                       sub_topic=DEVICE_TOPIC, window=1000)


def run_qos2(b: Broker, m: Mode, ctx: dict) -> dict:
    return _throughput(b, m, "q2", qos=2, topics=[DEVICE_TOPIC], sub_filter=DEVICE_TOPIC,
                       sub_topic=DEVICE_TOPIC, window=1000)


def run_fanin(b: Broker, m: Mode, ctx: dict) -> dict:
    topics = [f"bench/{i:03d}" for i in range(m.fanin_pubs)]
    return _throughput(b, m, "fi", qos=0, topics=topics, sub_filter="bench/+",
                       sub_topic=topics[0], window=4000, batch=16)


def run_fanout(b: Broker, m: Mode, ctx: dict) -> dict:
    # Window counted in messages: up to 20 x n_subs deliveries are in flight.
    return _throughput(b, m, "fo", qos=0, topics=["bench/fanout"], sub_filter="bench/fanout",
                       sub_topic="bench/fanout", n_subs=m.fanout_subs, window=20, batch=1,
                       sub_procs=2)


def run_trie(b: Broker, m: Mode, ctx: dict) -> dict:
    r = _throughput(b, m, "tr", qos=0, topics=["bench/0"], sub_filter="bench/0",
                    sub_topic="bench/0", idle_filters=m.trie_filters)
    r["idle_filters"] = m.trie_filters
    base = ctx.get("qos0")
    if r.get("status") == "ok" and base:
        r["vs_own_qos0"] = r["value"] / base
    return r


def run_large(b: Broker, m: Mode, ctx: dict) -> dict:
    r = _throughput(b, m, "lg", qos=0, topics=["bench/large"], sub_filter="bench/large",
                    sub_topic="bench/large", payload_len=16384, window=64, batch=4,
                    scale=16384 / 1e6)
    return r


def run_latency(b: Broker, m: Mode, ctx: dict) -> dict:
    max_rate = ctx.get("qos0")
    source = "50% of own qos0 run"
    if ctx.get("latency_rate"):  # --latency-rate: the same offered load for every broker
        max_rate = 2 * ctx["latency_rate"]
        source = "fixed (--latency-rate)"
    elif not max_rate:
        cal = run_qos0(b, m, ctx)
        if cal.get("status") != "ok":
            return {"status": "failed", "error": f"qos0 calibration: {cal.get('error')}"}
        max_rate = cal["value"]
        source = "50% of a qos0 calibration run"
    rate = max(100.0, 0.5 * max_rate)
    ph = Phase(b, m, "lat")
    try:
        # ctx["sub_port"]: the subscriber on another node of a cluster (bench/cluster.py)
        base = ph.add("latency", topic="bench/lat", rate=rate, warmup=m.warmup,
                      duration=m.duration, grace=2.0, sub_port=ctx.get("sub_port"))
        ph.start(extra_time=3.0)
        why = ph.wait_ready(m.ready_timeout)
        if why:
            return {"status": "failed", "error": why}
        res = _measure(ph, {"recv": (lg.RECV, ("latency",))}, "recv")
        if isinstance(res, str):
            return {"status": "stalled" if res.startswith("stalled") else "failed", "error": res}
        d, cpu = res
        ph._drain(m.duration + 6.0)
        rep = ph.reports.get(base, {})
        if "p99_ms" not in rep:
            return {"status": "failed", "error": rep.get("error", "no latency report")}
        lost = rep["expected_samples"] - rep["samples"]
        return {"status": "ok", "value": rep["p99_ms"], "p50_ms": rep["p50_ms"],
                "p99_ms": rep["p99_ms"], "p999_ms": rep["p999_ms"], "max_ms": rep["max_ms"],
                "target_rate": rate, "delivered_per_s": d["recv"], "missing": max(0, lost),
                "rate_source": source, **cpu}
    finally:
        ph.stop()


def run_storm_idle(b: Broker, m: Mode, ctx: dict) -> dict:
    """``storm`` and ``idle`` share one run: connect N, then hold them idle and weigh the RSS."""
    n = m.storm_n
    ph = Phase(b, m, "st")
    try:
        time.sleep(0.2)
        base_rss = b.rss()
        # 64 handshakes in flight: enough to keep any broker busy, yet under the usual listen
        # backlog (100), so the result is the broker's accept+CONNECT cost and not SYN retries.
        base = ph.add("storm", n=n, concurrency=64, connect_timeout=30.0)
        ph.start(extra_time=60.0)
        cpu0, t0 = b.cpu_seconds(), time.monotonic()
        ph.go()
        peak = base_rss
        limit = time.monotonic() + max(m.ready_timeout, n / 200)
        state = 0
        while time.monotonic() < limit:
            state = ph.slot(base, lg.READY)
            peak = max(peak, b.rss())
            if state != 0 or not b.alive() or not ph.procs[0].is_alive():
                break
            time.sleep(0.01)
        if state <= 0:
            why = "broker died" if not b.alive() else "connect storm did not finish in time"
            ph._drain(0.5)
            err = ph.reports.get(base, {}).get("error")
            return {"status": "failed", "error": err or why}
        connect_s = ph.slot(base, lg.EXTRA) / 1e9
        connected = ph.slot(base, lg.RECV)
        errors = ph.slot(base, lg.ERR)
        broker_cpu = (b.cpu_seconds() - cpu0) / max(1e-9, time.monotonic() - t0)
        time.sleep(m.settle)
        peak = max(peak, b.rss())
        idle_rss = b.rss()
        per_conn = (idle_rss - base_rss) / max(1, connected)
        storm = {"status": "ok" if connected == n else "partial", "value": connect_s,
                 "connected": connected, "errors": errors, "connects_per_s": connected / connect_s,
                 "peak_rss_MB": peak / 1e6, "baseline_rss_MB": base_rss / 1e6,
                 "broker_cpu": round(broker_cpu, 3)}
        idle = {"status": "ok" if connected else "failed", "value": per_conn / 1024,
                "rss_MB_idle": idle_rss / 1e6,
                "connections": connected, "rss_MB": idle_rss / 1e6,
                "baseline_rss_MB": base_rss / 1e6}
        return {"storm": storm, "idle": idle}
    finally:
        ph.stop()


RUNNERS = {
    "qos0": run_qos0, "qos1": run_qos1, "qos2": run_qos2, "fanin": run_fanin,
    "fanout": run_fanout, "trie": run_trie, "large": run_large, "latency": run_latency,
    # The same run on the host as it is (idle vCPUs free to halt; bench/hosttune.py): "latency"
    # holds a CPU latency QoS request around it, this one does not.
    "latency_untuned": run_latency,
}


def median_ok(results: list[dict]) -> float | None:
    vals = [r["value"] for r in results if r.get("status") in ("ok", "partial")]
    return statistics.median(vals) if vals else None
