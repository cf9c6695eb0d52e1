"""A run of QoS 0 publishes on one topic, routed once: a room of the router.

Why: a device that publishes fast sends one topic over and over, so one socket read holds a run
of PUBLISH packets that differ only in payload. Per message, ``_on_publish`` -> ``route`` ->
``deliver`` -> ``_write_qos0`` repeats the same checks, the same trie lookup and the same
per-subscriber decisions: ~450 bytecode instructions a message, which made the QoS 0 path 1.6
us a message against Mosquitto's 2.5 on a box with cheap system calls (issue 25). rumqttd's
router moves whole batches between its connections and its scheduler for the same reason.
Here the decisions are made once per run (``_run_plan``) and the run is written to each
subscriber in one call (``Connection.write_run``): what stays per message is the encode
(shared by every subscriber of one protocol level) and a list append.

Only the plain case takes this room: QoS 0, not retained, no properties, one topic; no ACL, no
device log, no shared group (here or, in a cluster, on a peer), no offset replay, no outbound
alias or v5 subscription identifier, no session with two matching filters. In a cluster the run
is then forwarded as one too (``Forwarder.forward_run``: each peer's link gets its entries in
order, after local delivery, as ``route`` forwards each message). Anything else answers "no
plan" and the run goes packet by packet through ``_on_publish``, which stays the reference:
what a run writes, counts and drops is what that path would, in the same order per
subscriber (tests/broker/test_publish_run.py compares the two on the wire).
``PublishRunRoom`` is a mixin of ``Router`` (its methods run with the router as ``self``).
"""

from __future__ import annotations

from typing import Any

from broker.connection import Connection
from broker.protocol import codec
from broker.protocol.codec import publish_packet0
from broker.protocol.packets import PacketType, Publish
from broker.stats import DropReason

# The longest run routed in one go: the dispatch loop checks its 2 ms flush clock between runs
# (router.py FLUSH_AFTER_S), so this bounds how long a subscriber waits behind one run.
RUN_MAX = 64
_PUBLISH = PacketType.PUBLISH
# After a look that found no run (the next packet is another topic), the next this many packets
# go one by one without looking: a stream of alternating topics pays for a look once in 8
# packets, not on each (costguard's qos0mix: +90 instructions a message when looking on each).
NO_RUN_SKIP = 8


def run_end(packets: list[Any], start: int, stop: int, qos: int, topic: str) -> int:
    """Where the run from ``packets[start]`` ends: the index (from ``start + 1``, at most
    ``stop``) of the first packet that is not a plain publish on ``topic`` at ``qos`` (the
    Publish class, not retained, not DUP, no properties). The scan of both kinds of run
    (``_publish_run``, loggedrun.py ``_logged_run``), in one C call where the codec is
    compiled (``publish_run_end``: it was a Python step a packet)."""
    compiled = codec.c_publish_run_end  # (looked up here: tests switch it off)
    if compiled is not None:
        end = compiled(packets, start, stop, qos, topic)
        if end is not None:
            return end
    return py_run_end(packets, start, stop, qos, topic)


def py_run_end(packets: list[Any], start: int, stop: int, qos: int, topic: str) -> int:
    """``run_end`` in Python: the reference of ``_speedups.publish_run_end``."""
    end = start + 1
    stop = min(len(packets), stop)
    while end < stop:
        p = packets[end]
        if p.__class__ is not Publish or p.qos != qos or p.retain or p.dup \
                or p.properties is not None or p.topic != topic:
            break
        end += 1
    return end


class PublishRunRoom:
    """Runs of plain QoS 0 publishes (a mixin of ``Router``; see the module docstring)."""

    def _publish_run(self, conn: Connection, packets: list[Any], start: int) -> int:
        """Route ``packets[start:end]``, a run of plain QoS 0 publishes on one topic, and return
        ``end``; or return ``-end`` when the run must go packet by packet (no plan), so the
        caller does not look for a run again before ``end`` (after a run of one: before
        ``start + NO_RUN_SKIP``)."""
        first = packets[start]
        if first.retain or first.properties is not None:
            return -(start + 1)  # (its QoS is 0: the dispatch loop looked)
        topic = first.topic
        end = run_end(packets, start, start + RUN_MAX, 0, topic)
        if end - start < 2:
            return -(start + NO_RUN_SKIP)
        plan = self._run_plan(conn.client_id, topic)
        if plan is None:
            return -end
        run = packets[start:end]
        n = end - start
        stats = self.stats
        stats.packets_in[_PUBLISH] += n - 1  # the first was counted by the dispatch loop
        if conn.session is None:
            return end  # not connected yet: ``_on_publish`` ignores each
        stats.messages_in += n
        stats.messages_in_qos[0] += n
        if plan:
            self._write_run(plan, topic, run)
        forwarder = self.forwarder
        if forwarder is not None:  # after local delivery, as ``route`` forwards
            forwarder.forward_run(topic, [p.payload for p in run], conn.client_id)
        return end

    def route_run(self, msgs: list[Any]) -> bool:
        """Route messages a peer router forwarded (``route(msg, forward=False)`` for each), a
        run of plain QoS 0 ones on one topic from one origin, as one: what the receiving end
        of a crossing does with a frame's run of plain DELIVERs (cluster/mesh.py
        ``on_deliveries``). False, with nothing done, when the run's plan refuses it (the
        caller routes each)."""
        if self._acl is not None:
            return False
        first = msgs[0]
        plan = self._run_plan(first.origin, first.topic, False)
        if plan is None:
            return False
        if plan:
            self._write_run(plan, first.topic, msgs)
        return True

    def _write_run(self, plan: list[tuple[Connection, int, bool]], topic: str,
                   run: list[Any]) -> None:
        """Each planned connection is written the run (publishes or messages: their
        ``payload``), encoded once per protocol level."""
        stats = self.stats
        plain = plain5 = None
        written = 0
        for tconn, limit, v5 in plan:
            if v5:
                if plain5 is None:
                    plain5 = [publish_packet0(topic, p.payload, False, None, 5) for p in run]
                datas = plain5
            else:
                if plain is None:
                    encode = codec.c_publish_packet  # (looked up here: tests switch it off)
                    plain = ([encode(topic, p.payload, 0x30, True) for p in run]
                             if encode is not None else
                             [publish_packet0(topic, p.payload, False, None, 4) for p in run])
                datas = plain
            if limit and max(map(len, datas)) > limit:
                # some are too large for this client ("treated as if sent", [MQTT-3.1.2-25]):
                # one by one in deliver's order, congestion before size, so each drop has
                # the reason the per-packet path gives it (rare: no run's cost to save)
                written += self._write_one_by_one(tconn, datas, limit)
                continue
            took = tconn.write_run(datas, sum(map(len, datas)))
            if took < len(datas):
                stats.dropped(DropReason.SLOW_CONSUMER, len(datas) - took)
            written += took
        if written:
            stats.packets_out[_PUBLISH] += written
            stats.messages_out += written
            stats.messages_out_qos[0] += written

    def _write_one_by_one(self, tconn: Connection, datas: list[bytes], limit: int) -> int:
        """``deliver`` -> ``_write_qos0`` for each of a run's packets; returns how many were
        written."""
        slow = large = taken = 0
        for data in datas:
            if tconn.congested:
                slow += 1
            elif len(data) > limit:
                large += 1
            else:
                tconn.write(data)
                taken += 1
        if slow:
            self.stats.dropped(DropReason.SLOW_CONSUMER, slow)
        if large:
            self.stats.dropped(DropReason.TOO_LARGE, large)
        return taken

    def _run_plan(self, origin: str | None, topic: str, local: bool = True
                  ) -> list[tuple[Connection, int, bool]] | None:
        """Every connection a plain QoS 0 message on ``topic`` from client ``origin`` is
        written to, as (connection, its session's Maximum Packet Size or 0, v5): what
        ``_on_publish`` and ``route`` decide for each message of the run, decided once. None
        when some part of that path is not the plain one (see the module docstring): the
        caller then takes it. (An ACL rules runs out before this is called.) ``local``: a
        publish here; else a peer's DELIVER, for which ``route`` checks no topic depth and no
        log, and picks no shared-group member (the first router to route it did)."""
        if local:
            forwarder = self.forwarder
            if forwarder is not None and not forwarder.plain_runs():
                return None
            if topic.count("/") >= self.mqtt.max_topic_levels:
                return None
            logs = self.logs
            if logs is not None and logs.key_for(topic, False) is not None:
                return None
        match = self.trie.match(topic)
        if local and match.groups:
            return None
        subs = match.subs
        sessions = self.sessions
        plan = []
        seen = set() if len(subs) > 1 else None
        for cid, sub in subs:
            if sub.replay is not None:
                return None
            if seen is not None:
                if cid in seen:
                    return None  # overlapping filters: route merges them
                seen.add(cid)
            if sub.no_local and cid == origin:
                continue
            session = sessions[cid]
            tconn = session.conn
            if tconn is None:
                continue  # QoS 0 is not queued for an offline session (deliver)
            v5 = tconn.level == 5
            if tconn.out_aliases is not None or (v5 and sub.sub_id):
                return None
            plan.append((tconn, session.max_packet_size or 0, v5))
        return plan
