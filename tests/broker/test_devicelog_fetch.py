"""The fetch API on the admin port and the ``meshmq log`` commands, against a running broker.

``GET /api/v1/logs``, ``/api/v1/logs/{device}`` and ``/api/v1/logs/{device}/records`` (fetch
format, decoded with ``commitlog.fetch.decode_fetch_response``): ranges, limits, paging with
``X-Meshmq-Next-Offset``, the 400/404/416 errors; ``meshmq log list``/``tail``/``inspect``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from helpers.broker import REPO_ROOT
from helpers.clients import unique
from helpers.devicelog import (
    RETENTION_CONFIG,
    BrokerGroup,
    Publisher,
    fetch_all,
    fetch_records,
    http_get,
    log_dir,
    log_list,
    retained_log,
)

from commitlog.fetch import decode_fetch_meta, decode_fetch_response
from commitlog.record import encoded_size
from commitlog.store import LogStore

pytestmark = pytest.mark.timeout(90)

N1, N2 = 25, 7
SENSOR_TOPICS = ["sensors/a", "sensors/b/c", "sensors/a"]


def _payload(device: str, i: int) -> bytes:
    return f"{device}-msg-{i:05d}".encode()


def _populate(broker) -> None:
    pub = Publisher(broker.host, broker.port, unique("fetchpub"), window=8)
    try:
        acks = pub.publish_all([("devices/f1/t", _payload("f1", i)) for i in range(N1)])
        assert [(a.device, a.offset) for a in acks] == [("f1", i) for i in range(N1)]
        acks = pub.publish_all([("devices/f2/x", _payload("f2", i)) for i in range(N2)])
        assert [(a.device, a.offset) for a in acks] == [("f2", i) for i in range(N2)]
        acks = pub.publish_all([(t, f"s{i}".encode()) for i, t in enumerate(SENSOR_TOPICS)])
        assert [(a.device, a.offset) for a in acks] == [("sensors", i) for i in range(3)]
    finally:
        pub.close()


@pytest.fixture(scope="module")
def fbroker(tmp_path_factory):
    group = BrokerGroup()
    try:  # (stopped also when the start or _populate fails: no broker left running)
        proc = group.start(tmp_path_factory.mktemp("fetch"))
        _populate(proc)
        yield proc
    finally:
        group.stop_all()


def _cli(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MESHMQ_")}
    env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-m", "meshmq", *args], capture_output=True,
                          text=True, timeout=timeout, env=env, cwd=str(REPO_ROOT))


# --------------------------------------------------------------------------------------------
# list / info
# --------------------------------------------------------------------------------------------


def test_list_logs(fbroker):
    resp = http_get(fbroker, "/api/v1/logs")
    assert resp.status == 200
    assert resp.content_type == "application/json", resp.headers
    doc = resp.json()
    assert sorted(doc["logs"], key=lambda e: e["device"]) == [
        {"device": "f1", "log_start": 0, "high_watermark": N1, "start": 0, "end": N1},
        {"device": "f2", "log_start": 0, "high_watermark": N2, "start": 0, "end": N2},
        {"device": "sensors", "log_start": 0, "high_watermark": 3, "start": 0, "end": 3},
    ], doc


def test_log_info(fbroker):
    resp = http_get(fbroker, "/api/v1/logs/f1")
    assert resp.status == 200 and resp.content_type == "application/json", resp
    doc = resp.json()
    assert {k: doc.get(k) for k in ("device", "start", "end")} == {
        "device": "f1", "start": 0, "end": N1}, doc


@pytest.mark.parametrize("path", ["/api/v1/logs/nope", "/api/v1/logs/nope/records",
                                  "/api/v1/logs/nope/records?offset=0"])
def test_unknown_device_is_404_json(fbroker, path):
    resp = http_get(fbroker, path)
    assert resp.status == 404, (resp.status, resp.body[:200])
    assert resp.content_type == "application/json", resp.headers
    doc = resp.json()
    assert "nope" in json.dumps(doc), f"404 body does not name the device: {doc}"


# --------------------------------------------------------------------------------------------
# records
# --------------------------------------------------------------------------------------------


def _check_f1(recs, offsets):
    assert [r.offset for r in recs] == list(offsets)
    for r in recs:
        assert (r.key, r.topic, bytes(r.payload)) == ("f1", "devices/f1/t",
                                                      _payload("f1", r.offset)), r
        assert r.attrs & 0x03 == 1, f"QoS bits of attrs: {r.attrs}"


def test_records_default_returns_the_whole_small_log(fbroker):
    resp, recs = fetch_records(fbroker, "f1")
    _check_f1(recs, range(N1))
    assert (resp.headers["x-meshmq-start"], resp.headers["x-meshmq-end"],
            resp.headers["x-meshmq-next-offset"]) == ("0", str(N1), str(N1))
    meta = decode_fetch_meta(resp.body)
    assert (meta.record_count, meta.log_start, meta.high_watermark) == (N1, 0, N1)
    ts = [r.timestamp_us for r in recs]
    assert ts == sorted(ts), "timestamps of one device log never go back"


def test_records_max_records_and_offset(fbroker):
    resp, recs = fetch_records(fbroker, "f1", offset=0, max_records=10)
    _check_f1(recs, range(10))
    assert resp.headers["x-meshmq-next-offset"] == "10"
    resp, recs = fetch_records(fbroker, "f1", offset=20, max_records=1000)
    _check_f1(recs, range(20, N1))
    assert resp.headers["x-meshmq-next-offset"] == str(N1)
    resp, recs = fetch_records(fbroker, "f1", offset=13, max_records=1)
    _check_f1(recs, [13])
    assert resp.headers["x-meshmq-next-offset"] == "14"


def test_records_max_bytes(fbroker):
    _, one = fetch_records(fbroker, "f1", offset=0, max_records=1)
    size = encoded_size(one[0])
    for budget, expect in ((3 * size, 3), (3 * size + size // 2, 3), (4 * size - 1, 3),
                           (4 * size, 4)):
        resp, recs = fetch_records(fbroker, "f1", offset=5, max_bytes=budget)
        _check_f1(recs, range(5, 5 + expect))
        assert resp.headers["x-meshmq-next-offset"] == str(5 + expect), (budget, resp.headers)


def test_offset_equal_to_end_is_empty_200(fbroker):
    resp, recs = fetch_records(fbroker, "f1", offset=N1)
    assert recs == []
    assert len(resp.body) == 24, "an empty fetch response is the 24-byte header only"
    assert resp.headers["x-meshmq-next-offset"] == str(N1)
    assert resp.headers["x-meshmq-end"] == str(N1)


@pytest.mark.parametrize("offset", [N1 + 1, N1 + 1000])
def test_offset_beyond_end_is_416(fbroker, offset):
    resp = http_get(fbroker, f"/api/v1/logs/f1/records?offset={offset}")
    assert resp.status == 416, (resp.status, resp.body[:200])
    text = resp.body.decode("utf-8", "replace")
    assert str(offset) in text, f"416 body does not name the offset: {text}"
    assert str(N1) in text, f"416 body does not name the end of the log: {text}"


@pytest.mark.parametrize("query,param", [
    ("offset=abc", "offset"),
    ("offset=-1", "offset"),
    ("offset=", "offset"),
    ("max_records=abc", "max_records"),
    ("max_records=0", "max_records"),
    ("max_records=-5", "max_records"),
    ("max_bytes=x", "max_bytes"),
    ("max_bytes=0", "max_bytes"),
    ("timestamp_us=soon", "timestamp_us"),
])
def test_bad_parameter_is_400_naming_it(fbroker, query, param):
    resp = http_get(fbroker, f"/api/v1/logs/f1/records?{query}")
    assert resp.status == 400, (query, resp.status, resp.body[:200])
    assert resp.content_type == "application/json", resp.headers
    doc = resp.json()
    assert param in json.dumps(doc), f"400 body does not name {param!r}: {doc}"


def test_timestamp_lookup(fbroker):
    _, recs = fetch_records(fbroker, "f1")
    target = recs[10].timestamp_us
    expected = min(r.offset for r in recs if r.timestamp_us >= target)
    resp, got = fetch_records(fbroker, "f1", timestamp_us=target)
    _check_f1(got, range(expected, N1))
    resp, got = fetch_records(fbroker, "f1", timestamp_us=0)
    _check_f1(got, range(N1))
    resp, got = fetch_records(fbroker, "f1", timestamp_us=recs[-1].timestamp_us + 1)
    assert got == [] and resp.headers["x-meshmq-next-offset"] == str(N1)


@pytest.mark.parametrize("params", [{"max_records": 4}, {"max_records": 1},
                                    {"max_bytes": 100}])
def test_paging_with_next_offset_reads_the_whole_log(fbroker, params):
    out = []
    offset = 0
    for _ in range(200):
        resp, recs = fetch_records(fbroker, "f1", offset=offset, **params)
        out.extend(recs)
        nxt = int(resp.headers["x-meshmq-next-offset"])
        if nxt == N1:
            break
        assert recs and nxt == recs[-1].offset + 1, (offset, nxt, [r.offset for r in recs])
        offset = nxt
    _check_f1(out, range(N1))


def test_other_devices_and_first_level_log(fbroker):
    recs = fetch_all(fbroker, "f2", page=3)
    assert [(r.offset, r.key, r.topic, bytes(r.payload)) for r in recs] == [
        (i, "f2", "devices/f2/x", _payload("f2", i)) for i in range(N2)]
    resp, recs = fetch_records(fbroker, "sensors")
    assert [(r.offset, r.key, r.topic, bytes(r.payload)) for r in recs] == [
        (i, "sensors", t, f"s{i}".encode()) for i, t in enumerate(SENSOR_TOPICS)]
    # The body decodes as a whole with every CRC checked.
    assert len(decode_fetch_response(resp.body)) == 3


def test_offset_below_retained_start_is_416(tmp_path):
    group = BrokerGroup()
    try:
        broker = group.start(tmp_path, commitlog=RETENTION_CONFIG)
        start, end, payloads = retained_log(broker, "ret")
        resp = http_get(broker, "/api/v1/logs/ret/records?offset=0")
        assert resp.status == 416, (resp.status, resp.body[:200])
        text = resp.body.decode("utf-8", "replace")
        assert str(start) in text, f"416 body does not name the log start {start}: {text}"
        resp = http_get(broker, "/api/v1/logs/ret")
        assert resp.status == 200
        assert {k: resp.json()[k] for k in ("start", "end")} == {"start": start, "end": end}
        recs = fetch_all(broker, "ret", page=7)
        assert [(r.offset, bytes(r.payload)) for r in recs] == [
            (i, payloads[i]) for i in range(start, end)]
        resp, recs = fetch_records(broker, "ret")  # no offset: from the start
        assert recs[0].offset == start and resp.headers["x-meshmq-start"] == str(start)
    finally:
        group.stop_all()


# --------------------------------------------------------------------------------------------
# meshmq log list / tail
# --------------------------------------------------------------------------------------------


def _admin(broker) -> str:
    return f"{broker.host}:{broker.admin_port}"


def test_cli_log_list(fbroker):
    res = _cli("log", "list", "--admin", _admin(fbroker))
    assert res.returncode == 0, (res.returncode, res.stdout, res.stderr)
    lines = res.stdout.splitlines()
    for device, end in (("f1", N1), ("f2", N2), ("sensors", 3)):
        hits = [ln for ln in lines if device in ln.split()]
        assert len(hits) == 1, f"log list: {device!r} not on exactly one line:\n{res.stdout}"
        assert str(end) in hits[0].split(), f"log list: {device!r} line lacks end {end}: " \
                                            f"{hits[0]!r}"


def test_cli_log_tail_from_0_prints_every_record_in_order(fbroker):
    res = _cli("log", "tail", "f1", "--from", "0", "--admin", _admin(fbroker))
    assert res.returncode == 0, (res.returncode, res.stdout, res.stderr)
    out = res.stdout
    positions = [out.find(_payload("f1", i).decode()) for i in range(N1)]
    assert -1 not in positions, f"records missing from log tail output:\n{out}"
    assert positions == sorted(positions), f"log tail output not in offset order:\n{out}"
    lines = [ln for ln in out.splitlines() if "f1-msg-" in ln]
    assert len(lines) == N1, f"expected one line per record:\n{out}"


def test_cli_log_tail_from_n(fbroker):
    res = _cli("log", "tail", "f1", "--from", "20", "--admin", _admin(fbroker))
    assert res.returncode == 0, (res.returncode, res.stdout, res.stderr)
    lines = [ln for ln in res.stdout.splitlines() if "f1-msg-" in ln]
    assert len(lines) == N1 - 20, res.stdout
    for i, ln in zip(range(20, N1), lines, strict=True):
        assert _payload("f1", i).decode() in ln, (i, ln)


def test_cli_log_list_unreachable_admin_fails(fbroker):
    # A port nobody listens on: the command must fail, not print an empty list.
    from helpers.broker import free_port

    res = _cli("log", "list", "--admin", f"127.0.0.1:{free_port()}")
    assert res.returncode != 0, (res.stdout, res.stderr)


# --------------------------------------------------------------------------------------------
# meshmq log inspect after a clean stop
# --------------------------------------------------------------------------------------------


def test_cli_log_inspect_after_clean_stop(tmp_path):
    group = BrokerGroup()
    try:
        broker = group.start(tmp_path)
        _populate(broker)
        assert log_list(broker) == {"f1": (0, N1), "f2": (0, N2), "sensors": (0, 3)}
        code = broker.stop()
        assert code == 0, f"broker exited with {code}:\n{broker.log_tail(30)}"
    finally:
        group.stop_all()
    res = _cli("log", "inspect", str(log_dir(broker)))
    assert res.returncode == 0, (res.returncode, res.stdout, res.stderr)
    out = res.stdout + res.stderr
    for device in ("f1", "f2", "sensors"):
        assert device in out, f"inspect does not mention {device!r}:\n{out}"


def test_commitlog_dir_setting_places_the_store(tmp_path):
    """``[commitlog] dir`` moves the store out of ``<data_dir>/log``."""
    custom = tmp_path / "custom-log"
    group = BrokerGroup()
    try:
        broker = group.start(tmp_path, commitlog={"dir": str(custom)})
        pub = Publisher(broker.host, broker.port, unique("dirpub"))
        try:
            acks = pub.publish_all([("devices/cd/t", _payload("cd", i)) for i in range(3)])
        finally:
            pub.close()
        assert [(a.device, a.offset) for a in acks] == [("cd", 0), ("cd", 1), ("cd", 2)]
        assert broker.stop() == 0
    finally:
        group.stop_all()
    assert not (log_dir(broker)).exists() or not any(log_dir(broker).glob("*.log")), \
        "segments written under <data_dir>/log although commitlog.dir is set"
    store = LogStore.open(str(custom))
    try:
        assert [(r.offset, bytes(r.payload)) for r in store.iter_records("cd", 0)] == [
            (i, _payload("cd", i)) for i in range(3)]
    finally:
        store.close()
