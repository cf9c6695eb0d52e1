"""A run of QoS 1 publishes on one device topic, stored once: a room of the router.

Why: a device that publishes QoS 1 fast pipelines one topic (paho's max_inflight, MQTT.js, a
gateway), so one socket read holds a run of PUBLISH packets that differ only in packet id and
payload. Per message, ``_on_publish`` -> ``_append`` -> ``DeviceLogs.append`` repeats the same
checks (QoS and depth allowed, the topic's log, the write gate, the log's owner) and builds the
same record header: ~320 bytecode instructions a message before the record reaches the store,
a third of the logged QoS 1 path (issue 25: 1.24x Mosquitto where 2x is asked). Kafka's
producer sends a record batch for the same reason: the broker validates and appends the batch,
not each record. Here the checks are made once per run and ``DeviceLogs.append_run`` appends
the run's records into the same group commit: what stays per message is the message object,
the compiled append and the entry that settles it.

What it does not change: every record is its own (offset, timestamp, publisher), the run is
settled exactly as the per-packet path settles it (``IngestRoom._on_durable``: routed and acked
in log order once the high-water mark passes it, the acks to one publisher in one write), and
a failed append refuses what it did not store, one message at a time.

Only the plain case takes this room: QoS 1, not retained, not DUP (a resend is looked up in the
log first, broker/pubdedupe.py), no properties, one topic, a log this router leads, the write
gate open with nothing held behind it, no ACL. Anything else answers "no plan" and the run goes
packet by packet through ``_on_publish``, which stays the reference (tests/broker/
test_logged_run.py compares the two). ``LoggedRunRoom`` is a mixin of ``Router``.
"""

from __future__ import annotations

from typing import Any

from broker.connection import Connection
from broker.ingest import HELD_LIMIT, PAUSE_MIN_UNSETTLED
from broker.message import new_message
from broker.protocol.packets import PacketType, Publish
from broker.pubdedupe import publisher_id
from broker.publishrun import NO_RUN_SKIP, RUN_MAX
from commitlog.store import LogWriteError

_PUBLISH = PacketType.PUBLISH


class LoggedRunRoom:
    """Runs of plain QoS 1 publishes to a device log (a mixin of ``Router``; see the module
    docstring)."""

    def _logged_run(self, conn: Connection, packets: list[Any], start: int) -> int:
        """Store ``packets[start:end]``, a run of plain QoS 1 publishes on one logged topic,
        and return ``end``; or ``-end`` when they must go packet by packet (``_publish_run``'s
        contract, broker/publishrun.py)."""
        first = packets[start]
        if first.retain or first.dup or first.properties is not None:
            return -(start + 1)  # (its QoS is 1: the dispatch loop looked)
        topic = first.topic
        end = start + 1
        stop = min(len(packets), start + RUN_MAX)
        while end < stop:
            p = packets[end]
            if p.__class__ is not Publish or p.qos != 1 or p.retain or p.dup \
                    or p.properties is not None or p.topic != topic:
                break
            end += 1
        if end - start < 2:
            return -(start + NO_RUN_SKIP)
        key = self._logged_run_plan(conn, topic)
        if key is None:
            return -end
        run = packets[start:end]
        n = end - start
        stats = self.stats
        stats.packets_in[_PUBLISH] += n - 1  # the first was counted by the dispatch loop
        stats.messages_in += n
        stats.messages_in_qos[1] += n
        if conn.level == 5:  # as _on_publish counts each (freed by its PUBACK)
            conn.inbound_unacked += n
        client_id = conn.client_id
        msgs = [new_message(topic, p.payload, 1, False, None, None, client_id) for p in run]
        pids = [p.packet_id for p in run]
        logs = self.logs
        if logs.dedupe is not None:  # who published each, kept in its record (pubdedupe.py)
            session = conn.session
            for msg, pid in zip(msgs, pids, strict=True):
                msg.publisher = publisher_id(session, pid)
        try:
            logs.append_run(key, msgs, conn, pids)
        except LogWriteError as err:
            self._logged_run_failed(logs, key, msgs, conn, run, err)
            return end
        conn.unsettled += n
        if logs.held > HELD_LIMIT and conn.unsettled >= PAUSE_MIN_UNSETTLED \
                and conn not in self._paused_publishers:
            conn.transport.pause_reading()  # (as _append: the rest of this read goes on)
            self._paused_publishers.add(conn)
        return end

    def _logged_run_plan(self, conn: Connection, topic: str) -> str | None:
        """The device log a plain QoS 1 publish on ``topic`` from ``conn`` is appended to
        here, with every check ``_on_publish`` makes on it passed; None when some part of that
        path is not the plain one (the caller then takes it). (An ACL rules runs out before
        this is called.)"""
        if conn.session is None:
            return None
        mqtt = self.mqtt
        if mqtt.max_qos < 1 or topic.count("/") >= mqtt.max_topic_levels:
            return None
        logs = self.logs
        if logs is None:
            return None
        key = logs.key_for(topic, False)
        if key is None:
            return None
        gate = self.write_gate
        if gate is not None and (gate() is not None or self.gate_held.items):
            return None  # held or refused (broker/gatehold.py): each, as _gated decides
        forwarder = self.forwarder
        if forwarder is not None and forwarder.owner_of(key) is not None:
            return None  # another router leads the log: an APPEND each (forwarding.py)
        return key

    def _logged_run_failed(self, logs: Any, key: str, msgs: list[Any], conn: Connection,
                           run: list[Publish], err: LogWriteError) -> None:
        """``append_run`` stored a prefix of the run, then could not store the next: that
        prefix is settled as usual, the one that failed is refused, and each after it takes
        ``_append`` (stored if the log takes it now, else refused), as packet by packet."""
        stored = 0
        while stored < len(msgs) and msgs[stored].offset >= 0:
            stored += 1
        conn.unsettled += stored
        self.not_stored(conn, run[stored].packet_id, 1, err)
        for msg, pkt in zip(msgs[stored + 1:], run[stored + 1:], strict=True):
            if conn.closing:  # a 3.x publisher is closed, not refused: the dispatch loop stops
                return
            self._append(logs, key, msg, conn, pkt, None)
