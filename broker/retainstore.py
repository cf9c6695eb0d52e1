"""Retained messages kept across restarts: a compacted state log keyed by topic.

Every retained PUBLISH (and every retained will) appends its message to the ``#retained`` state
log in the same loop tick as its device record (``DeviceLogs.append``), so both are written and
fsynced together and the publisher's PUBACK/PUBREC, held until that fsync, means "retained, and
kept". A retained publish on an *unlogged* topic (``$`` topics, ``log = false`` rules) takes the
same held path with the state record alone (``devicelogs.RETAIN_ONLY``), which is why such a
publish is acknowledged after an fsync when persistence is on. An empty payload deletes the
retained message [MQTT-3.3.1-6] and is the log's tombstone. The message is a copy, not an offset
into its device log: retention may delete the device record while the retained message must
stay until replaced (Mosquitto keeps it forever too).

In a cluster every router keeps the whole retained set, and a change learned from a peer router
(a RETAIN or RETAIN_SYNC entry) is written here too, by ``RemotePublishes.retain_from_peer``
through the same ``write`` and the same group commit, with the link's ACK to the peer held
until it is durable (cluster/retainsync.py). A router restarted while its peers are down
therefore comes back with every retained message it knew, whoever set it.

Not kept: the broker's own ``$SYS/`` status topics (republished every ``mqtt.sys_interval``).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator

from broker.devicelogs import headers_from_properties, record_message
from broker.message import Message
from broker.retained import RetainedStore
from broker.statelog import Item, StateLog
from commitlog.groupcommit import GroupCommitter
from commitlog.record import ATTR_RETAIN

log = logging.getLogger("broker.retainstore")

RETAINED_KEY = "#retained"
_SYS = "$SYS/"


def _remaining_expiry(msg: Message) -> int | None:
    """Seconds of message expiry left, counted from now (the record's timestamp)."""
    if msg.expiry_at is None:
        return None
    return max(1, math.ceil(msg.expiry_at - time.monotonic()))


def _item(topic: str, msg: Message) -> Item:
    expiry = _remaining_expiry(msg)
    headers = (headers_from_properties(msg.properties, expiry)
               if msg.properties or expiry is not None else None)
    return topic, msg.qos | ATTR_RETAIN, headers, msg.payload


class RetainPersistence:
    """Writes retained changes to the state log, restores them, and compacts the log."""

    def __init__(self, committer: GroupCommitter, retained: RetainedStore) -> None:
        self.log = StateLog(committer, RETAINED_KEY)
        self.retained = retained
        self.restored = 0
        self.expired = 0

    @staticmethod
    def keeps(topic: str) -> bool:
        """Whether a retained change on ``topic`` is written here: never for ``$SYS/`` (the
        broker republishes its own; a client's is kept in memory only). A publish whose change
        is not written has nothing to wait for (``DeviceLogs.key_for``)."""
        return not topic.startswith(_SYS)

    def write(self, msg: Message) -> None:
        """A retained publish (empty payload: a delete) joins this tick's batch; raises
        LogWriteError while the log cannot write (the publish is then refused)."""
        if not self.keeps(msg.topic):
            return
        name, attrs, headers, payload = _item(msg.topic, msg)
        self.log.append(name, payload, attrs, headers)

    def restore(self) -> int:
        """Load the retained messages at start-up (before any client connects)."""
        latest, _ = self.log.replay()
        now = time.monotonic()
        for topic, rec in latest.items():
            msg = record_message(rec, Message)
            msg.device, msg.offset = None, -1  # a copy, not a position in a device log
            if msg.expired(now):
                self.expired += 1
                continue
            self.retained.set(topic, msg)
            self.restored += 1
        return self.restored

    def maintain(self) -> None:
        """Periodic: compact when the log has grown past its live state (statelog.py)."""
        if self.log.needs_compaction():
            self.log.compact(self._snapshot())

    def _snapshot(self) -> Iterator[Item]:
        now = time.monotonic()
        for topic, msg in self.retained.items():
            if not topic.startswith(_SYS) and not msg.expired(now):
                yield _item(topic, msg)
