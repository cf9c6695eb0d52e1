"""Wires replication into a router under Raft placement (issue 24 step 3): the replica manager
(cluster/replication.py) and the follower fetchers (cluster/fetcher.py) on this router's mesh,
store and group commit, fed by the Raft placement feed; and their metrics."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)


def attach_replication(node: Any, mesh: Any, feed: Any, placer: Any) -> Any:
    """Build and start this router's ReplicaManager before the feed's first record arrives
    (``feed.start`` comes after), so every log's role is set from the first snapshot."""
    from cluster.fetcher import Fetchers
    from cluster.replication import ReplicaManager

    settings = node.config.cluster
    feed.incarnation = mesh.incarnation.hex()
    fetchers = Fetchers(mesh, node.store, node.committer, settings.replica_fetch_wait)
    manager = ReplicaManager(settings, mesh.rid, node.store, node.committer, feed,
                             placer.propose, fetchers, mesh.loop)
    mesh.replication = manager
    manager.on_inherited = lambda device, lo, hi: route_inherited(node, device, lo, hi)
    lease = getattr(mesh, "lease", None)
    if lease is not None:
        # the leader lease (cluster/lease.py): a leader cut off from the Raft majority holds its
        # high-water mark, so nothing more is acknowledged while the majority may elect another
        manager.lease_ok = lease.valid
    manager.start()
    node.metrics.add_collector(lambda: replication_metrics(manager, fetchers, node.store),
                               "replication")
    if settings.leader_affinity_stable > 0:
        attach_affinity(node, mesh, feed, placer, fetchers)
    return manager


def attach_affinity(node: Any, mesh: Any, feed: Any, placer: Any, fetchers: Any) -> Any:
    """Leadership follows the device (cluster/affinity.py): the mesh shows it every publish
    it proxies to a leader; its metrics. Closed with the replica manager (``close``)."""
    import functools

    from cluster.affinity import LeaderAffinity
    from cluster.raftplace import append_here

    affinity = LeaderAffinity(node.config.cluster, mesh.rid, feed, placer, fetchers,
                              node.store, node.router.sessions, mesh.append_at,
                              functools.partial(append_here, node.router), mesh.loop)
    mesh.affinity = affinity
    node.metrics.add_collector(lambda: affinity_metrics(affinity), "leader affinity")
    return affinity


def affinity_metrics(affinity: Any) -> Iterable[Metric]:
    """Leadership moves this router asked for and won, and what else its asks came to."""
    moves = CounterMetricFamily("meshmq_replica_leader_moves", "Device-log leadership moves "
                                "to this router that Raft committed, by reason (affinity: "
                                "the device stayed connected here for "
                                "cluster.leader_affinity_stable).", labels=["reason"])
    moves.add_metric(["affinity"], affinity.stats["moves"])
    events = CounterMetricFamily("meshmq_leader_affinity_events", "Leadership moves this "
                                 "router asked for and did not get (refused: stale epoch or "
                                 "not in the ISR; failed: no Raft answer; gave_up: not caught "
                                 "up within the drain time), publishes refused past "
                                 "cluster.placement_max_held while held for a move "
                                 "(held_full), entries dropped past "
                                 "cluster.leader_affinity_max_devices (evicted).",
                                 labels=["event"])
    for event in ("refused", "failed", "gave_up", "held_full", "evicted"):
        events.add_metric([event], affinity.stats[event])
    tracked = GaugeMetricFamily("meshmq_leader_affinity_devices", "Devices this router "
                                "proxies to another router's leadership and tracks for the "
                                "affinity rule (at most cluster.leader_affinity_max_devices).",
                                value=len(affinity.devices))
    held = GaugeMetricFamily("meshmq_leader_affinity_held", "Publishes held while their "
                             "device's leadership moves to this router.", value=affinity.held)
    return [moves, events, tracked, held]


def route_inherited(node: Any, device: str, lo: int, hi: int) -> None:
    """A new leader's inherited tail ``[lo, hi)`` is committed: route it to subscribers (local
    sessions and peer routers), as the old leader would have once its mark passed it; the
    old leader may have died between its append and that moment (a stored message missed by
    every live subscriber: found by the chaos suite's kill-leader)."""
    import logging

    from broker.devicelogs import record_message
    from broker.message import Message

    router, store = node.router, node.store
    offset = lo
    try:
        while offset < hi:
            recs = store.read(device, offset, min(hi - offset, 1000), 1 << 22)
            if not recs:
                break
            for rec in recs:
                if rec.offset >= hi:
                    return
                router.route(record_message(rec, Message))
            offset = recs[-1].offset + 1
    except Exception:  # noqa: BLE001 - the records stay readable from the log by offset
        logging.getLogger("cluster.replication").exception(
            "routing a new leader's inherited records failed", extra={"device": device,
                                                                     "from": lo, "to": hi})


def replication_metrics(manager: Any, fetchers: Any, store: Any) -> Iterable[Metric]:
    """Follower lag, ISR changes, replication bytes, under-replicated logs, acks waiting for
    replication and how long the high-water mark took to pass what was durable here."""
    stats = manager.stats
    lag = GaugeMetricFamily("meshmq_replica_follower_lag_records", "Records the device logs "
                            "this router follows are behind their leaders' durable ends "
                            "(summed; from each leader's last answer).", value=fetchers.lag())
    following = GaugeMetricFamily("meshmq_replica_logs", "Device logs this router replicates, "
                                  "by role.", labels=["role"])
    following.add_metric(["leader"], len(manager.leading))
    following.add_metric(["follower"], len(fetchers.devices))
    following.add_metric(["waiting"], len(manager.waiting))
    under = GaugeMetricFamily("meshmq_replica_under_replicated_logs", "Device logs led here "
                              "whose ISR is smaller than their replica set.",
                              value=manager.under_replicated())
    isr = CounterMetricFamily("meshmq_replica_isr_changes", "ISR changes this router's "
                              "leaders committed in Raft (cluster.replica_lag_time_max).",
                              labels=["change"])
    isr.add_metric(["shrink"], stats["isr_shrinks"])
    isr.add_metric(["expand"], stats["isr_expands"])
    nbytes = CounterMetricFamily("meshmq_replica_bytes", "Record bytes replicated: out (served "
                                 "to followers), in (fetched from leaders).",
                                 labels=["direction"])
    nbytes.add_metric(["out"], stats["bytes_out"])
    nbytes.add_metric(["in"], fetchers.stats["bytes_in"])
    truncations = CounterMetricFamily("meshmq_replica_truncations", "Diverged tails truncated "
                                      "on this router's follower logs.",
                                      value=fetchers.stats["truncations"])
    resets = CounterMetricFamily("meshmq_replica_log_start_resets", "Follower logs restarted "
                                 "empty at their leader's log start because they ended below "
                                 "it (retention or record deletion on the leader; see the "
                                 "WARNING naming the device).",
                                 value=fetchers.stats["log_start_resets"])
    failures = CounterMetricFamily("meshmq_replica_fetch_failures", "Follower fetches that "
                                   "failed or were refused (fetched again).",
                                   value=fetchers.stats["fetch_failures"])
    refused = CounterMetricFamily("meshmq_replica_acks_refused", "Publishes refused, never "
                                  "acked, because the high-water mark could not pass them "
                                  "within cluster.append_timeout (ISR below "
                                  "min_insync_replicas, followers unreachable).",
                                  value=stats["acks_refused"])
    lost = CounterMetricFamily("meshmq_replica_lost_log_refusals", "Follower fetches this "
                               "router refused as leader because the follower holds records "
                               "of its log that it lacks (its log was lost: see the ERROR).",
                               value=stats["lost_log_refusals"])
    waiting = GaugeMetricFamily("meshmq_replica_acks_waiting", "Acks (per device and batch) "
                                "waiting for their high-water mark.",
                                value=store.high_watermark_waiters)
    from cluster.replication import LATENCY_BUCKETS

    buckets, total = [], 0
    for bound, count in zip(LATENCY_BUCKETS, manager.latency_counts, strict=False):
        total += count
        buckets.append((repr(bound), total))
    total += manager.latency_counts[-1]
    buckets.append(("+Inf", total))
    latency = HistogramMetricFamily("meshmq_replica_commit_seconds", "Time from a leader's "
                                    "fsync to the high-water mark passing it (what acks=all "
                                    "adds to an ack).", buckets=buckets,
                                    sum_value=manager.latency_sum)
    return [lag, following, under, isr, nbytes, truncations, resets, failures, refused, lost,
            waiting, latency]
