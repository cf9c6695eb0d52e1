"""What the chaos suite reads about replicas (issue 24): the Raft records of every device log
(from a node's metadata process, over its local socket), every replica's log on every
router's disk (``LogStore.open`` on a stopped node's data directory), and whether this tree
has replication at all.

Kept apart from the pure rules (``replica_rules.py``) so those stay unit-testable on crafted
data, and apart from the runner so the acceptance test and the checker's unit tests dump
stores with the same code the runs use.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import tempfile
from pathlib import Path
from typing import Any

from commitlog import record
from commitlog.settings import LogSettings
from commitlog.store import LogStore

# The name of a router's commit log directory under its state directory
# (meshmq/router_proc.py router_config: <data_dir>/router-<i>/log).
ROUTER_DIR_PREFIX = "router-"
LOG_SUBDIR = "log"


def replication_missing() -> str | None:
    """None when this tree replicates device logs (followers fetch, acks wait for the ISR);
    else why the replica rules and the tests that need followers cannot apply yet.

    Detected by the config key the replication work adds (``cluster.min_insync_replicas``,
    issue 24): ``load_config`` rejects an unknown key naming it, so once the key is
    accepted nothing here has to change (the lead removes no skip)."""
    from meshmq.config import ConfigError, load_config

    with tempfile.TemporaryDirectory(prefix="meshmq-chaos-probe-") as tmp:
        path = os.path.join(tmp, "probe.toml")
        Path(path).write_text("[cluster]\nmin_insync_replicas = 2\n")
        try:
            load_config(path, {})
        except ConfigError as exc:
            if "min_insync_replicas" in str(exc) and "unknown" in str(exc):
                return ("replication is not built in this tree (cluster.min_insync_replicas "
                        "is an unknown config key): followers do not fetch yet (issue 24)")
        except Exception:  # noqa: BLE001 - any other complaint means the key itself parsed
            return None
    return None


def raft_snapshot(socket_path: str, timeout: float = 3.0) -> dict[str, Any] | None:
    """The metadata process's whole state (``{"index", "logs", "sessions"}``), read with its
    ``watch`` op (the snapshot line comes first; we close before any change), or None when
    it does not answer (a frozen or dead node)."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(socket_path)
            s.sendall(b'{"op":"watch"}\n')
            buf = b""
            while not buf.endswith(b"\n"):
                chunk = s.recv(1 << 20)
                if not chunk:
                    return None
                buf += chunk
    except OSError:
        return None
    try:
        snap = json.loads(buf.split(b"\n", 1)[0]).get("snapshot")
    except ValueError:
        return None
    return snap if isinstance(snap, dict) else None


def raft_status(socket_path: str, timeout: float = 3.0) -> dict[str, Any] | None:
    """The metadata process's view of the Raft group (leader, term, ``has_quorum``: whether
    it is connected to a majority of the voters), or None when it does not answer."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(socket_path)
            s.sendall(b'{"op":"status","id":1}\n')
            buf = b""
            while not buf.endswith(b"\n"):
                chunk = s.recv(65536)
                if not chunk:
                    return None
                buf += chunk
        st = json.loads(buf.split(b"\n", 1)[0]).get("status")
    except (OSError, ValueError):
        return None
    return st if isinstance(st, dict) else None


def newest_snapshot(socket_paths: list[str]) -> dict[str, Any] | None:
    """The snapshot with the highest applied index among the voters that answer: a voter
    that was cut off may still be behind."""
    best: dict[str, Any] | None = None
    for path in socket_paths:
        snap = raft_snapshot(path)
        if snap is not None and (best is None or snap.get("index", 0) > best.get("index", 0)):
            best = snap
    return best


def leader_counts(snapshot: dict[str, Any] | None) -> dict[str, int]:
    """How many logs each node leads (node id -> count), from a Raft snapshot."""
    counts: dict[str, int] = {}
    for rec in ((snapshot or {}).get("logs") or {}).values():
        leader = str(rec.get("leader", ""))
        node = leader.rpartition("/")[0]
        if node:
            counts[node] = counts.get(node, 0) + 1
    return counts


def dump_store(directory: str, max_records: int = 1000) -> dict[str, dict[str, Any]]:
    """Every device log of one router's store (the router must be stopped: the store takes
    its lock): ``{device: {"hw", "durable_end", "start", "epochs": [[epoch, start]],
    "records": [[offset, payload text, sha256 of the record's bytes]]}}``.

    Records are read with the replica path (``read_replica``: up to the durable end, with
    the epoch starts in place) and hashed frame by frame as encoded, so two replicas agree
    byte-for-byte exactly when their digests do. Epoch-start records are not rows: the
    epoch table is reported beside them."""
    out: dict[str, dict[str, Any]] = {}
    store = LogStore.open(directory, LogSettings(retention_ms=0))
    try:
        for key in store.keys():
            start, hw = store.log_range(key)
            rows: list[list[Any]] = []
            offset = start
            end = store.durable_end(key)
            while offset < end:
                data, nxt = store.read_replica(key, offset, max_records)
                pos = 0
                while pos < len(data):
                    rec, flags, rend = record.decode_one(data, pos)
                    if not flags & record.FLAG_CONTROL:
                        rows.append([rec.offset, rec.payload.decode("utf-8", "replace"),
                                     hashlib.sha256(data[pos:rend]).hexdigest()[:24]])
                    pos = rend
                if nxt <= offset:
                    break
                offset = nxt
            out[key] = {"hw": hw, "durable_end": end, "start": start,
                        "epochs": [list(e) for e in store.epochs(key)], "records": rows}
    finally:
        store.close()
    return out


def router_stores(node_id: str, data_dir: Path) -> dict[str, str]:
    """``{router id: its log directory}`` for every router state directory of a node."""
    out: dict[str, str] = {}
    if not data_dir.is_dir():
        return out
    for child in sorted(data_dir.iterdir()):
        name = child.name
        if name.startswith(ROUTER_DIR_PREFIX) and name[len(ROUTER_DIR_PREFIX):].isdigit():
            log_dir = child / LOG_SUBDIR
            if log_dir.is_dir():
                out[f"{node_id}/{name[len(ROUTER_DIR_PREFIX):]}"] = str(log_dir)
    return out


def dump_nodes(nodes: list[tuple[str, Path]]) -> dict[str, dict[str, dict[str, Any]]]:
    """Every replica of every router of the (stopped) nodes: ``{router id: dump_store}``."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for node_id, data_dir in nodes:
        for rid, log_dir in router_stores(node_id, data_dir).items():
            out[rid] = dump_store(log_dir)
    return out
