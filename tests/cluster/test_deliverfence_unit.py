"""The delivery fence's decisions (cluster/deliverfence.py), without sockets: which DELIVERs
pass, which a deposed leader's are dropped, and when the sessions read a log back."""

from __future__ import annotations

from cluster.deliverfence import DeliverFence


class _Logs:
    """The placement's epochs (-1: no record yet) and the reads the fence starts."""

    def __init__(self) -> None:
        self.epochs: dict[str, int] = {}
        self.moved: list[set[str]] = []
        self.soon: list = []

    def fence(self) -> DeliverFence:
        return DeliverFence(lambda d: self.epochs.get(d, -1), self._moved, self.soon.append)

    def _moved(self, devices) -> int:
        self.moved.append(set(devices))
        return len(self.moved[-1])

    def run_soon(self) -> None:
        while self.soon:
            self.soon.pop(0)()


def test_the_current_epoch_passes_an_older_one_is_dropped() -> None:
    logs = _Logs()
    fence = logs.fence()
    logs.epochs["d"] = 3
    assert fence.admit("d", 3, "b/0") and fence.admit("d", -1, "b/0")  # -1: a protocol 2/3 peer
    assert not fence.admit("d", 2, "b/0") and fence.fenced == 1
    assert logs.moved == []


def test_a_newer_delivery_reads_back_before_it_passes_and_fences_the_old_leader() -> None:
    """Epoch 0 is a real epoch (a log's first leader): its DELIVERs are fenced too."""
    logs = _Logs()
    fence = logs.fence()
    logs.epochs["d"] = 0
    assert fence.admit("d", 1, "b/0")  # the new leader's first DELIVER, before Raft's record
    assert logs.moved == [{"d"}]
    assert fence.leader_ahead("d") == "b/0"  # reads (and publishes) go to it meanwhile
    assert not fence.admit("d", 0, "b/0")  # the old leader's, late
    assert fence.admit("d", 1, "b/0") and logs.moved == [{"d"}]  # one read per rise
    # Raft's record arrives with the epoch the DELIVER brought: nothing more to read
    fence.on_record("d", {"epoch": 1})
    logs.epochs["d"] = 1
    logs.run_soon()
    assert logs.moved == [{"d"}] and fence.leader_ahead("d") is None


def test_raft_records_read_back_in_one_batch_and_only_when_the_epoch_rises() -> None:
    logs = _Logs()
    fence = logs.fence()
    logs.epochs.update({"a": 2, "b": 5})
    fence.on_record("a", {"epoch": 3})
    fence.on_record("b", {"epoch": 6})
    fence.on_record("c", {"epoch": 0})  # a new log: no earlier leader routed here
    fence.on_record("b", {"epoch": 5, "isr_version": 9})  # an ISR change, same epoch
    assert len(logs.soon) == 1  # one pass scheduled for the batch
    logs.epochs.update({"a": 3, "b": 6, "c": 0})  # the placement takes the records
    logs.run_soon()
    assert logs.moved == [{"a", "b"}]
    assert not fence.admit("a", 2, "b/0") and fence.admit("a", 3, "b/0")


def test_a_log_new_here_sets_no_read() -> None:
    logs = _Logs()
    fence = logs.fence()
    assert all(fence.admit("new", e, "b/0") for e in (0, 0, -1))
    assert logs.moved == []
    # Raft's record has not reached this router, its DELIVERs have: the newest one counts
    assert fence.admit("late", 2, "b/0") and not fence.admit("late", 1, "b/0")
    assert logs.moved == [] and fence.leader_ahead("late") is None  # Raft places it
