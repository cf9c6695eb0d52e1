"""Where each session is in each device log: the position a gap is closed from.

A logged message is in its device log before anyone sees it, so a session never needs the
broker to have *pushed* it a message: it needs to know how far it has got. Kafka's consumers
work this way (a committed offset per partition; whatever happens to brokers and connections,
the consumer resumes reading from its offset), and pushing alone loses messages whenever the
push path breaks, which in a cluster it does (issue 28):

- an owner router restarted and stored its first link's resent APPENDs before the other peers'
  links (and routes) were back: what it routed meanwhile reached no subscriber there;
- a subscriber's router crashed after its link acknowledged DELIVERs that no session checkpoint
  covered yet;
- a session moved to another router while messages were on their way to the old one.

So every session keeps ``Session.positions``: per device, the offset after the last logged QoS>0
message handed to it (into its window or queue; a QoS 1/2 delivery, so what a restart must give
again). The router sets it on every such delivery, live or read from a log, local or remote
(one dict store). A position is used whenever the push path may have lost something:

- **a link to a device log's owner comes up** (``owner_back``: a restarted owner, a link that
  timed out, a cut that healed): every session with a position in a log that router owns falls
  behind on it from there (``LogCatchUp``), reading back over the link what it did not get.
  The read goes out after this link's full route set (``MeshLink.established`` writes routes
  before requests), so the owner routes here everything it stores after answering: the
  catch-up cursor's seam (broker/catchup.py) gives each message once.
- **a restart of the session's router**: positions are checkpointed with the session
  (``broker/sessionstore.py``, "behind"), every ``mqtt.persistence_interval``; a restored
  session reads every log from its checkpointed position, so what arrived after the last
  checkpoint is read again (QoS 1 duplicates, never a loss).
- **a session move** (takeover at another router): the exported session carries its
  positions, and the new router reads each log from there, so what went to the old router
  during the move is read back.

Gap detection on each live DELIVER (an offset that skips ahead) is deliberately not done: a
session whose filters match some topics of a device log sees offsets skip for every topic it
does not match, and reading each skip back would turn every other topic into a read (the
README's "Not yet" list keeps this caveat for drops of a full link while both ends stay up).

Not covered: a device new to a session has no position until its first delivery, so (for
another router's log) its first messages are not read again if this router is killed before
the next checkpoint records the position (what a restarted owner routed before it knew this
router's routes is sent here by the owner itself once it does: ``cluster/routegap.py``);
positions are not pruned on UNSUBSCRIBE (a stale one costs a read that delivers nothing). A
link-up walks every position once (one cached owner lookup each, synchronously).

Memory: a position is a dict entry per device a session has been delivered from, bounded by
``mqtt.max_lagging_devices`` (the bound on a session's catch-up cursors, which positions become).
Past it the oldest position is forgotten, counted in ``meshmq_limit_hits_total`` (limit
``max_lagging_devices``) and logged: that device then resumes as before positions existed (the
checkpoint's resume time for a local log, live delivery only for a remote one).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from broker.limits import LimitLog

if TYPE_CHECKING:
    from broker.catchup import LogCatchUp
    from broker.replay import Replays
    from broker.session import Session
    from broker.stats import BrokerStats

log = logging.getLogger("broker.positions")


class DeliveredPositions:
    """Bounds the sessions' positions and turns them back into log reads when needed."""

    def __init__(self, sessions: dict[str, Session], catchup: LogCatchUp | None,
                 replays: Replays, stats: BrokerStats, max_devices: int) -> None:
        self._sessions = sessions
        self._catchup = catchup
        self._replays = replays
        self.max_devices = max_devices
        self._limit = LimitLog(stats)

    def full(self, session: Session) -> None:
        """``session`` holds ``max_devices`` positions and gets a new device: forget the
        oldest (dict order: the device whose position was first set)."""
        positions = session.positions
        device = next(iter(positions))
        del positions[device]
        self._limit.hit("max_lagging_devices",
                        "a session's log positions are full (mqtt.max_lagging_devices): its "
                        "oldest position is forgotten; a restart, move or owner outage may "
                        "miss messages of that device. Raise the limit, or narrow the "
                        "session's filters", client_id=session.client_id, device=device)

    def logs_moved(self, devices: Iterable[str]) -> int:
        """Those device logs have a new leader epoch (another router leads them, or the same
        one again after a failover): every session with a position in one reads it back from
        there, and every live replay cursor on one from where it is. The old leader may have
        routed records whose DELIVERs never arrived (it died with them queued) or arrive late
        (it was frozen): those are dropped (cluster/deliverfence.py) and read instead, in log
        order, the catch-up cursor's seam handing each record once. One pass over the
        sessions however many logs moved (a failover moves all of a node's logs at once).
        Returns how many reads were started."""
        catchup = self._catchup
        if catchup is None:
            return 0
        moved = devices if isinstance(devices, (set, frozenset)) else set(devices)
        if not moved:
            return 0
        started = self._replays.devices_moved(moved)
        for session in list(self._sessions.values()):
            positions = session.positions
            if not positions:
                continue
            mine = [(d, positions[d]) for d in moved if d in positions] \
                if len(moved) < len(positions) else \
                [(d, o) for d, o in positions.items() if d in moved]
            for device, offset in mine:
                catchup.restore(session, device, offset)
            if mine:
                started += len(mine)
                catchup.pump(session)
        if started:  # one line per failover (a batch); a single log's move at debug level
            log.log(logging.INFO if len(moved) > 1 else logging.DEBUG,
                    "device logs moved to another leader epoch: %d session log positions and "
                    "replay cursors read back from their new leaders", started,
                    extra={"logs": len(moved)})
        return started

    def owner_back(self, owner: str, owner_of: Callable[[str], str | None]) -> int:
        """The link to router ``owner`` came up (again): every session with a position in a
        log it owns reads that log back from its position, and every live replay cursor on
        such a log from where it is (nothing new: the cursor goes live at once). Returns how
        many reads were started."""
        catchup = self._catchup
        if catchup is None:
            return 0
        # Offset subscriptions hold no position (a replay delivery is not one): their live
        # cursors on that router's logs read back from where they are (broker/replay.py).
        started = self._replays.owner_back(owner)
        # Synchronous on purpose: a position read after this link's first DELIVER could already
        # have moved past what was lost. The cost is one (cached) owner lookup per position.
        owners: dict[str, str | None] = {}
        for session in list(self._sessions.values()):
            if not session.positions:
                continue
            mine = []
            for device, offset in session.positions.items():
                at = owners.get(device, "")
                if at == "":
                    at = owners[device] = owner_of(device)
                if at == owner:
                    mine.append((device, offset))
            for device, offset in mine:
                catchup.restore(session, device, offset)
            if mine:
                started += len(mine)
                catchup.pump(session)
        if started:
            log.info("link to owner router %s up: %d session log positions read back from it",
                     owner, started, extra={"peer": owner})
        return started
