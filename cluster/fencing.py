"""Fencing: an APPEND is applied only by the leader of its log, at the leader epoch it names.

A router that believes another router leads a device log, or believes an older (or newer) leader
epoch than the log's current one, has a stale view of the placement (cluster/placement.py): under
Raft (issue 24) it may be talking to a leader that was deposed. Applying its APPEND would put
records into a log that is no longer the log of record (a deposed leader's tail is truncated when
it rejoins), so an acknowledged message could vanish. The receiver checks both before it applies
anything and answers with a ``RESULT_FENCED`` outcome that the publisher's router turns into a
refusal (v5: 0x80 with this text as the reason string; 3.x: the connection closes): the client
retries, by then (Raft) against the new leader. Kafka's NOT_LEADER_OR_FOLLOWER and
FENCED_LEADER_EPOCH are the precedent; a version-2 peer says no epoch, and only the leadership is
checked for it.

Also the leader's side of divergence detection in a fetch (Kafka >= 2.7): a replica that says the
epoch of the last record it fetched learns, inside the answer, where that epoch ended here.
"""

from __future__ import annotations

from typing import Any

from broker.forwarding import OwnerNotStored
from cluster.placement import Placement


class Fenced(OwnerNotStored):
    """An APPEND refused unapplied by fencing: this router does not lead the log, or not at
    the epoch the APPEND carried. Its RESULT has status RESULT_FENCED (cluster/frames.py)."""


def append_refusal(placement: Placement, me: str, device: str, epoch: int) -> str | None:
    """Why router ``me`` must not apply an APPEND to ``device``'s log at ``epoch`` (-1: the
    sender said none, a version-2 peer), or None when it may."""
    # one lookup per APPEND on the publish path; the words only for a refusal. A "#" key (a
    # router's own state log) never comes from a peer: whoever the hash names, it is refused.
    if placement.leads(device, epoch):
        return None
    leader = placement.leader_of(device)
    if leader.router != me:
        return (f"router {me} does not lead the log of {device!r} (its leader: "
                f"{leader.router or 'unknown'}, epoch {leader.epoch}): refused, not stored "
                f"(fenced; the sender's view of the placement is stale)")
    return (f"the APPEND for {device!r} names leader epoch {epoch}, but router {me} "
            f"leads it at epoch {leader.epoch}: refused, not stored (fenced; the sender's "
            f"view of the placement is stale)")


def diverging(store: Any, device: str, offset: int, last_epoch: int) -> tuple[int, int] | None:
    """``(epoch, end offset)`` when a replica fetching ``device`` from ``offset`` whose last
    fetched record had leader epoch ``last_epoch`` holds a tail this log does not: its epoch
    ended here before ``offset`` (or is not one of this log's epochs, and the largest one below
    it ended earlier). The replica truncates to the end offset and fetches again (KIP-595).
    None when it did not diverge, or when it can not be told (``last_epoch`` -1, or the log has
    no epoch at or below it: logs under the static placement have no epochs)."""
    if last_epoch < 0:
        return None
    epoch, end = store.end_offset_for_epoch(device, last_epoch)
    if epoch < 0:
        return None
    if epoch != last_epoch or end < offset:
        return epoch, end
    return None
