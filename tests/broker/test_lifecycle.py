"""Process lifecycle: SIGTERM drain, metrics, health endpoints, bad config, defaults."""

import os
import signal
import subprocess
import sys
import time

import pytest
from helpers import raw as R
from helpers.broker import REPO_ROOT, BrokerProc, free_port, metric_sum, wait_for
from helpers.clients import V5, V311, unique

pytestmark = pytest.mark.timeout(60)

METRIC_NAMES = [
    "meshmq_listener_sockets",
    "meshmq_packets_received_total",
    "meshmq_messages_dropped_total",
    "meshmq_subscriptions",
    "meshmq_retained_messages",
    "meshmq_sessions",
    "meshmq_event_loop_lag_seconds",
]


def test_sigterm_drains_v5_clients_with_0x8b_and_exits_0(start_broker, raw):
    """Graceful shutdown: on SIGTERM v5 clients receive DISCONNECT 0x8B (Server shutting down)
    [MQTT-3.14.2-1], every connection is closed, and the process exits with code 0."""
    b = start_broker()
    v5 = [raw(b, version=5) for _ in range(3)]
    for c in v5:
        c.connect(unique("drain"))
    v3 = raw(b, version=4)
    v3.connect(unique("drain3"))
    b.proc.send_signal(signal.SIGTERM)
    for c in v5:
        got = c.wait_closed(timeout=15)
        assert [p.reason_code for p in got if p.type == R.DISCONNECT] == [0x8B], got
    assert v3.wait_closed(timeout=15) == []  # 3.1.1 has no server DISCONNECT
    try:
        code = b.proc.wait(20)
    except subprocess.TimeoutExpired:
        raise AssertionError("broker did not exit after SIGTERM") from None
    assert code == 0, f"exit code {code}; log:\n{b.log_tail()}"


def test_sigterm_stops_accepting(start_broker, raw):
    """After SIGTERM completes, the MQTT port no longer accepts connections."""
    b = start_broker()
    port = b.port
    assert b.stop() == 0
    with pytest.raises(OSError):
        R.RawClient(b.host, port, timeout=2)


def test_sigterm_flushes_queued_qos1_to_connected_client(start_broker, raw, clients):
    """Drain flushes what was already accepted: QoS 1 messages acknowledged to the publisher
    just before SIGTERM reach the connected v5 subscriber before its DISCONNECT 0x8B."""
    b = start_broker()
    topic = unique("flush") + "/t"
    sub = raw(b, version=5)
    sub.connect(unique("flush"))
    sub.subscribe(topic, 1)
    pub = clients.connected(b, protocol=V5)
    for i in range(20):
        pub.publish(topic, str(i), 1)
    b.proc.send_signal(signal.SIGTERM)
    got = sub.wait_closed(timeout=15)
    payloads = [p.payload for p in got if p.type == R.PUBLISH]
    # Some may already have been read by nobody: all 20 were sent before SIGTERM.
    assert payloads == [str(i).encode() for i in range(20)], got
    assert got[-1].type == R.DISCONNECT and got[-1].reason_code == 0x8B
    assert b.proc.wait(20) == 0


def test_metrics_expose_names(broker, clients):
    """/metrics (Prometheus text) exposes the documented metric families."""
    text = broker.metrics_text()
    missing = [n for n in METRIC_NAMES if n not in text and n.removesuffix("_total") not in text]
    assert not missing, f"metrics missing from /metrics: {missing}\n{text[:2000]}"


def test_metrics_move(broker, clients):
    """The gauges and counters follow reality: one more connection, subscription, retained
    message and session, and more PUBLISH packets received."""
    before = broker.metrics()

    topic = unique("metric") + "/t"
    c = clients.connected(broker, protocol=V311)
    c.subscribe(topic, 1)
    c.publish(topic, b"r", 1, retain=True)
    c.expect_message()

    def moved():
        now = broker.metrics()
        checks = {
            "meshmq_listener_sockets": metric_sum(now, "meshmq_listener_sockets")
            > metric_sum(before, "meshmq_listener_sockets"),
            "meshmq_subscriptions": metric_sum(now, "meshmq_subscriptions")
            > metric_sum(before, "meshmq_subscriptions"),
            "meshmq_retained_messages": metric_sum(now, "meshmq_retained_messages")
            > metric_sum(before, "meshmq_retained_messages"),
            "meshmq_sessions": metric_sum(now, "meshmq_sessions")
            > metric_sum(before, "meshmq_sessions"),
            "meshmq_packets_received_total": metric_sum(now, "meshmq_packets_received_total")
            >= metric_sum(before, "meshmq_packets_received_total") + 3,
        }
        return checks if all(checks.values()) else None

    try:
        wait_for(moved, timeout=5, message="metrics to reflect the new client")
    except AssertionError:
        now = broker.metrics()
        raise AssertionError(
            "metrics did not move: "
            + ", ".join(f"{n}: {metric_sum(before, n)} -> {metric_sum(now, n)}"
                        for n in METRIC_NAMES)
        ) from None


def test_health_and_ready(broker):
    """/healthz and /readyz answer 200 on a running broker."""
    assert broker.http_get("/healthz")[0] == 200
    assert broker.http_get("/readyz")[0] == 200


def test_event_loop_lag_is_a_number(broker):
    """meshmq_event_loop_lag_seconds is a non-negative sample."""
    m = broker.metrics()
    lag = [v for k, v in m.items() if k.startswith("meshmq_event_loop_lag_seconds")]
    assert lag and all(v >= 0 for v in lag), lag


BAD_CONFIGS = {
    "unknown-key": ("[mqtt]\nmax_infligth = 5\n", "max_infligth"),
    "wrong-type": ('[mqtt]\nmax_inflight = "lots"\n', "max_inflight"),
    "out-of-range": ("[mqtt]\nmax_qos = 3\n", "max_qos"),
    "bad-enum": ('[mqtt]\nqueue_full_policy = "explode"\n', "queue_full_policy"),
    "unknown-section": ("[mqqt]\nmax_inflight = 5\n", "mqqt"),
    "bad-bind": ('[listener.tcp]\nbind = "not-an-address"\n', "bind"),
}


@pytest.mark.parametrize("case", list(BAD_CONFIGS))
def test_bad_config_exit_2_one_line(tmp_path, case):
    """A bad config stops start-up with exit code 2 and a one-line message naming the key (no
    traceback): typos are never silently ignored."""
    text, key = BAD_CONFIGS[case]
    admin = free_port()
    cfg = tmp_path / "bad.toml"
    cfg.write_text(
        f'[node]\ndata_dir = "{tmp_path / "data"}"\n[admin]\nbind = "127.0.0.1:{admin}"\n'
        + (text if "[listener.tcp]" in text else
           f'[listener.tcp]\nbind = "127.0.0.1:{free_port()}"\n' + text)
    )
    res = subprocess.run([sys.executable, "-m", "meshmq", "serve", "-c", str(cfg)],
                         capture_output=True, text=True, timeout=30, cwd=str(tmp_path),
                         env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)))
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == 2, f"exit {res.returncode}, stderr:\n{res.stderr}"
    assert "Traceback" not in res.stderr, res.stderr
    assert len(lines) == 1, f"expected one line, got:\n{res.stderr}"
    assert key in lines[0], f"message does not name {key!r}: {lines[0]}"


def test_bad_env_override_exit_2(tmp_path):
    """An unknown MESHMQ_ variable is a config error too (exit 2, names it)."""
    res = subprocess.run(
        [sys.executable, "-m", "meshmq", "serve"], capture_output=True, text=True, timeout=30,
        cwd=str(tmp_path),
        env=dict(os.environ, PYTHONPATH=str(REPO_ROOT), MESHMQ_MQTT__NOT_A_KEY="1",
                 MESHMQ_LISTENER__TCP__BIND=f"127.0.0.1:{free_port()}",
                 MESHMQ_ADMIN__BIND=f"127.0.0.1:{free_port()}",
                 MESHMQ_NODE__DATA_DIR=str(tmp_path / "data")),
    )
    assert res.returncode == 2, res.stderr
    assert "NOT_A_KEY" in res.stderr.upper(), res.stderr


def test_defaults_without_config(tmp_path, raw, clients):
    """`meshmq serve` with no -c runs on the built-in defaults (ports from the env overrides):
    ready, accepts MQTT, and announces the default limits (Receive Maximum 32, Topic Alias
    Maximum 10, Maximum Packet Size 1 MiB if announced)."""
    port, admin = free_port(), free_port()
    b = BrokerProc(tmp_path / "defaults", ws=False)
    b.port, b.admin_port = port, admin
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), PYTHONUNBUFFERED="1",
               MESHMQ_LISTENER__TCP__BIND=f"127.0.0.1:{port}",
               MESHMQ_ADMIN__BIND=f"127.0.0.1:{admin}",
               MESHMQ_NODE__DATA_DIR=str(tmp_path / "data"))
    log = open(b.log_path, "wb")  # noqa: SIM115
    b.proc = subprocess.Popen([sys.executable, "-m", "meshmq", "serve"], stdout=log, stderr=log,
                              stdin=subprocess.DEVNULL, cwd=str(tmp_path), env=env)
    log.close()
    try:
        b.wait_ready()
        c = raw(b, version=5)
        ack = c.connect(unique("dflt"))
        assert ack.properties.get(R.RECEIVE_MAXIMUM) == 1024
        assert ack.properties.get(R.TOPIC_ALIAS_MAXIMUM) == 10
        assert ack.properties.get(R.MAXIMUM_PACKET_SIZE, 1_048_576) == 1_048_576
        topic = unique("dflt") + "/t"
        sub = clients.connected(b, protocol=V311)
        sub.subscribe(topic, 1)
        pub = clients.connected(b, protocol=V5)
        pub.publish(topic, b"default", 1)
        assert sub.expect_message().payload == b"default"
        assert (tmp_path / "data").exists(), "data_dir from MESHMQ_NODE__DATA_DIR not created"
    finally:
        b.stop()


def test_json_log_format(start_broker):
    """log.format json: every stderr line the broker writes is one JSON object."""
    import json

    b = start_broker(log={"level": "debug", "format": "json"})
    R.RawClient(b.host, b.port).connect(unique("json"))
    time.sleep(0.3)
    b.stop()
    lines = [ln for ln in b.log_text().splitlines()
             if ln.strip() and not ln.startswith("===== start")]
    assert lines, "no log lines"
    for ln in lines:
        obj = json.loads(ln)
        assert isinstance(obj, dict)


def test_restart_keeps_port_and_serves(start_broker, clients):
    """restart(): a broker stopped with SIGTERM starts again on the same config and serves."""
    b = start_broker()
    assert b.stop() == 0
    b.start()
    c = clients.connected(b, protocol=V311)
    topic = unique("rs") + "/t"
    c.subscribe(topic, 0)
    c.publish(topic, b"again", 0)
    assert c.expect_message().payload == b"again"


def test_backlog_read_is_delivered_in_order_and_counted(broker, raw):
    """A publisher that hands the broker a backlog (here 30,000 QoS 0 publishes in one sendall,
    so each socket read holds ~1,500 packets) gets every message through in order, and the
    broker reports those reads in meshmq_long_reads_total: it wrote to the subscriber while
    still routing the read, instead of holding the first message until the read was done."""
    import threading

    topic = unique("backlog") + "/t"
    n = 30_000
    sub = raw(broker, rcvbuf=1 << 22)
    sub.connect(unique("backlog-sub"))
    sub.subscribe(topic, 0)
    pub = raw(broker)
    pub.connect(unique("backlog-pub"))
    before = broker.metric("meshmq_long_reads_total")
    burst = b"".join(R.publish(topic, b"%08d" % i) for i in range(n))
    sender = threading.Thread(target=pub.send, args=(burst,), daemon=True)
    sender.start()
    # Read raw bytes as fast as they come (parsing later), so the broker's writes never back up
    # into its QoS 0 slow-consumer drop.
    size = len(R.publish(topic, b"%08d" % 0))
    data = bytearray()
    deadline = time.monotonic() + 30
    sub.sock.settimeout(1.0)
    while len(data) < n * size and time.monotonic() < deadline:
        try:
            chunk = sub.sock.recv(1 << 20)
        except TimeoutError:
            continue
        assert chunk, "broker closed the subscriber"
        data += chunk
    sender.join(10)
    assert len(data) == n * size, f"got {len(data) // size} of {n} messages"
    payloads = [bytes(data[k + size - 8:k + size]) for k in range(0, len(data), size)]
    assert payloads == [b"%08d" % i for i in range(n)], "messages out of order or changed"
    assert broker.metric("meshmq_long_reads_total") > before, \
        "a backlog read was routed without any mid-read write"


def test_gc_startup_objects_frozen_and_pauses_timed(broker, clients):
    """Start-up objects are frozen out of the cyclic GC's reach (a full collection over them
    is a loop stall of tens of ms) and every collection's pause is timed per generation."""
    m = broker.metrics()
    assert m.get("meshmq_gc_frozen_objects", 0) > 1000, m.get("meshmq_gc_frozen_objects")
    c = clients.connected(broker, protocol=V311)
    topic = unique("gc") + "/t"
    c.subscribe(topic, 0)
    for _ in range(200):  # some allocation on the broker, so young collections run
        c.publish(topic, b"x" * 100, 0)

    def timed():
        return metric_sum(broker.metrics(), "meshmq_gc_pause_seconds_count") > 0

    wait_for(timed, timeout=10, message="a timed GC pause in meshmq_gc_pause_seconds")


def test_compiled_fast_paths_are_reported(start_broker, clients):
    """A failed build falls back to pure Python silently, so the node says which parts run
    pure Python: a gauge per part and a start-up warning; and that fallback really serves."""
    from broker.protocol import codec
    from commitlog import record

    fast = start_broker()
    assert fast.metric("meshmq_compiled_fast_path", part="codec") == float(codec.SPEEDUPS)
    assert fast.metric("meshmq_compiled_fast_path", part="commitlog") == float(record.SPEEDUPS)
    if codec.SPEEDUPS and record.SPEEDUPS:
        assert "pure-Python" not in fast.log_text()

    slow = start_broker(env={"BROKER_PURE_PYTHON": "1", "COMMITLOG_PURE_PYTHON": "1"})
    text = slow.metrics_text()
    assert 'meshmq_compiled_fast_path{part="codec"} 0.0' in text
    assert 'meshmq_compiled_fast_path{part="commitlog"} 0.0' in text
    assert "running the pure-Python codec and commitlog" in slow.log_text()
    c = clients.connected(slow, protocol=V311)
    topic = f"devices/{unique('pure')}/t"
    c.subscribe(topic, 1)
    c.publish(topic, b"slow path", 1)
    assert c.expect_message(topic=topic).payload == b"slow path"
