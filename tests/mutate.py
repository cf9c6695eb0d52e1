"""Plant known bugs one at a time in a copy of the tree and check the tests catch each one.

    .venv/bin/python tests/mutate.py                 # every mutation, a table at the end
    .venv/bin/python tests/mutate.py no-fsync acl    # only those whose name contains a word
    .venv/bin/python tests/mutate.py --list          # what each plants and which tests run

Why a script of our own rather than mutmut: the bugs that matter here are a handful of specific,
known ways to break the promise (ack before fsync, no fsync, an ACL check skipped...), each
caught by a few slow tests with real broker processes; random operator mutations over the whole
tree would take hours on 2 cores and mostly hit code whose tests are unit tests. This is the
"known mutants" discipline of Jepsen-style work: every guard is shown to fail when the thing it
guards is broken. Run it before resolving any issue that touches the ack path, and add a line
here with every new guard test.

Each mutation is an exact text replacement that must match exactly once (so a refactor that
moves the code makes the script fail loudly instead of silently planting nothing). The tree is
copied to a temporary directory (tracked and untracked files, and the compiled extensions
built in place; never .venv, .git or caches): the working tree is never touched. In the copy
the named tests run with this interpreter (``-x``); a non-zero exit with failed tests is
"caught", exit 0 is "NOT CAUGHT", anything else (collection error, no tests) is "error".
A mutation of a C source (the ``_speedups.c`` fast paths) rebuilds the copy's extensions
(``setup.py build_ext --inplace --force``) before its tests run; a plant that does not
compile is "error". Exit status: 0 when every mutation was caught, 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SKIP = {".venv", ".git", "__pycache__", ".pytest_cache", ".hypothesis", ".ruff_cache",
        "build", "dist", ".mypy_cache"}


@dataclass(frozen=True)
class Mutation:
    name: str
    what: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]


MUTATIONS: tuple[Mutation, ...] = (
    Mutation(
        "no-fsync", "commitlog/store.py _fsync: os.fsync(fd) replaced by pass (nothing synced)",
        "commitlog/store.py",
        '        """The one place data fsyncs happen (a seam for fault-injection tests)."""\n'
        "        os.fsync(fd)\n",
        '        """The one place data fsyncs happen (a seam for fault-injection tests)."""\n'
        "        pass\n",
        ("tests/broker/test_powerloss.py::test_power_cut_keeps_every_acknowledged_publish[2-cuts]",),
    ),
    Mutation(
        "ack-before-fsync",
        "broker/devicelogs.py _seal: route and ack at once instead of when the device's "
        "high-water mark passes",
        "broker/devicelogs.py",
        "                committer.when_high_watermark(key, group[-1][2].offset, passed)\n",
        "                passed(None)\n",
        ("tests/broker/test_powerloss.py::test_power_cut_keeps_every_acknowledged_publish[2-cuts]",),
    ),
    Mutation(
        "no-acl-read-check", "broker/delivery.py deliver: the ACL read check skipped",
        "broker/delivery.py",
        "        if acl is not None and not self._allowed(\n"
        '                "deliver", acl.can_deliver(',
        "        if False and acl is not None and not self._allowed(\n"
        '                "deliver", acl.can_deliver(',
        ("tests/broker/test_acl_delivery.py",),
    ),
    Mutation(
        "qos-not-downgraded",
        "broker/delivery.py deliver: delivered at the publish QoS, not min(publish, granted)",
        "broker/delivery.py",
        "        qos = msg.qos if msg.qos < granted else granted  # [MQTT-3.3.5-1]\n",
        "        qos = msg.qos\n",
        ("tests/broker/test_publish_qos.py", "tests/broker/test_subscribe.py"),
    ),
    Mutation(
        "keepalive-factor", "broker/sessionend.py _sweep: keepalive factor 1.5 -> 3",
        "broker/sessionend.py",
        "now - conn.last_rx > conn.keepalive * 1.5 \\\n",
        "now - conn.last_rx > conn.keepalive * 3 \\\n",
        ("tests/broker/test_connect.py",),
    ),
    Mutation(
        "takeover-reason-code",
        "broker/handle_connect.py takeover: old connection closed with 0x00, not 0x8E Session "
        "taken over",
        "broker/handle_connect.py",
        "            old.close(Reason.SESSION_TAKEN_OVER)\n",
        "            old.close(Reason.NORMAL_DISCONNECTION)\n",
        ("tests/broker/test_sessions.py",),
    ),
    Mutation(
        "torn-tail-not-truncated",
        "commitlog/store.py recovery: a torn tail is logged but not truncated from the file",
        "commitlog/store.py",
        "                os.truncate(seg.path, cut - seg.base)\n",
        "                pass\n",
        ("tests/commitlog/test_commitlog_store.py", "tests/commitlog/test_commitlog_crash.py"),
    ),
    Mutation(
        "replay-seam-live-check",
        "broker/cursors.py LogCursor.accept_live: live messages taken while still replaying",
        "broker/cursors.py",
        "        if self.live and msg.offset >= self.next:\n",
        "        if msg.offset >= self.next:\n",
        ("tests/broker/test_devicelog_replay.py",),
    ),
    Mutation(
        "not-stored-acked-ok",
        "broker/ingest.py _not_stored: a v5 QoS 1 publish the log failed to store gets PUBACK 0",
        "broker/ingest.py",
        "                conn.send(PubAck(packet_id, Reason.UNSPECIFIED_ERROR, why))\n",
        "                conn.send(PubAck(packet_id, Reason.SUCCESS, why))\n",
        ("tests/broker/test_log_write_failure.py",),
    ),
    Mutation(
        "v311-not-stored-kept-open",
        "broker/ingest.py _not_stored: a 3.1.1 client whose publish was not stored is not closed",
        "broker/ingest.py",
        "            conn.close()  # 3.x has no negative PUBACK",
        "            pass  # 3.x has no negative PUBACK",
        ("tests/broker/test_log_write_failure.py",),
    ),
    Mutation(
        "disconnect-expiry-ignored",
        "broker/handle_connect.py DISCONNECT: the Session Expiry Interval it carries is ignored",
        "broker/handle_connect.py",
        "                session.expiry_interval = expiry\n",
        "                pass\n",
        ("tests/broker/test_session_edges.py",),
    ),
    Mutation(
        "disconnect-expiry-after-zero-allowed",
        "broker/handle_connect.py DISCONNECT: expiry set after CONNECT's 0 accepted "
        "[MQTT-3.14.2-2]",
        "broker/handle_connect.py",
        "                if session.expiry_interval == 0 and expiry != 0:\n",
        "                if False:\n",
        ("tests/broker/test_session_edges.py",),
    ),
    Mutation(
        "takeover-will-dropped",
        "broker/handle_connect.py takeover: the old connection's will is dropped, not published",
        "broker/handle_connect.py",
        "                self.publish_will(old.will)\n            old.will = None\n",
        "                pass\n            old.will = None\n",
        ("tests/broker/test_session_edges.py",),
    ),
    Mutation(
        "takeover-will-ignores-delay",
        "broker/handle_connect.py takeover: the will is published even when the session continues "
        "inside its will delay",
        "broker/handle_connect.py",
        "if old.will is not None and (old.will_delay == 0 or ends):",
        "if old.will is not None:",
        ("tests/broker/test_session_edges.py",),
    ),
    Mutation(
        "pubrec-error-ignored",
        "broker/handle_acks.py _on_pubrec: a subscriber's PUBREC >= 0x80 answered with PUBREL",
        "broker/handle_acks.py",
        "        if pkt.reason_code >= 0x80:  # the subscriber refused it: the flow ends here\n",
        "        if False:\n",
        ("tests/broker/test_session_edges.py",),
    ),
    Mutation(
        "rollback-under-running-fsync",
        "commitlog/groupcommit.py _fail: rolls back at once, under the fsync still in flight",
        "commitlog/groupcommit.py",
        "        if not self._syncing:\n            self._rollback()\n",
        "        if True:\n            self._rollback()\n",
        ("tests/commitlog/test_commitlog_groupcommit.py",),
    ),
    Mutation(
        "raising-callback-unguarded",
        "commitlog/groupcommit.py _call: a raising durability callback is not contained",
        "commitlog/groupcommit.py",
        "        try:\n            cb(exc)\n        except Exception:\n"
        '            log.exception("commitlog: a durability callback raised")\n',
        "        cb(exc)\n",
        ("tests/commitlog/test_commitlog_groupcommit.py",),
    ),
    Mutation(
        "segment-gap-not-detected",
        "commitlog/store.py _recover: segments after a gap are kept as if contiguous",
        "commitlog/store.py",
        "            if segs[i].base != segs[i - 1].end:\n",
        "            if False:\n",
        ("tests/commitlog/test_commitlog_recovery_gap.py",),
    ),
    Mutation(
        "shared-offline-not-redistributed",
        "broker/sessionend.py _connection_closed: a shared member going offline (session kept) "
        "keeps its unacked shares",
        "broker/sessionend.py",
        "        self.shared.redispatch(session)\n        if session.expiry_interval != NEVER:",
        "        if session.expiry_interval != NEVER:",
        ("tests/broker/test_shared.py",),
    ),
    Mutation(
        "shared-unsubscribe-not-redistributed",
        "broker/handle_subscribe.py UNSUBSCRIBE: a member leaving the group keeps its unacked "
        "shares",
        "broker/handle_subscribe.py",
        "                self.shared.redispatch(session, only_group=sub)\n",
        "                pass\n",
        ("tests/broker/test_shared.py",),
    ),
    Mutation(
        "replay-stalls-at-window-1",
        "broker/delivery.py _window_freed: replay resumed only while len(queue) < window // 2 "
        "(the bug found with Receive Maximum 1)",
        "broker/delivery.py",
        "len(session.queue) < max(1, session.window // 2):",
        "len(session.queue) < session.window // 2:",
        ("tests/broker/test_devicelog_replay_window.py",),
    ),
    Mutation(
        "retention-skip-not-counted",
        "broker/cursors.py LogSource: offsets skipped after retention not counted as expired",
        "broker/cursors.py",
        "        self.stats.dropped(DropReason.EXPIRED, max(0, start - c.next))\n",
        "        pass\n",
        ("tests/broker/test_devicelog_replay_window.py",),
    ),
    Mutation(
        "auth-failure-not-counted",
        "broker/handle_connect.py finish_connect: a refused login not counted in auth_failures",
        "broker/handle_connect.py",
        "        if auth_code:\n            self.stats.auth_failures += 1\n",
        "        if auth_code:\n            pass\n",
        ("tests/broker/test_auth_acl.py::test_auth_failures_counted_and_logged",),
    ),
    Mutation(
        "short-session-ended-at-once",
        "broker/sessionend.py _connection_closed: a session with expiry 1 s ended at the "
        "disconnect",
        "broker/sessionend.py",
        "        if session.expiry_interval == 0:\n            self.end_session(session)\n",
        "        if session.expiry_interval <= 1:\n            self.end_session(session)\n",
        ("tests/broker/test_sessions.py::test_v5_session_expiry_kept_then_expired",),
    ),
    Mutation(
        "cpuidle-info-empty", "bench/hosttune.py cpuidle_info: reports nothing",
        "bench/hosttune.py",
        "    info: dict = {}\n    for key, path in",
        "    info: dict = {}\n    return info\n    for key, path in",
        ("tests/bench/test_hosttune.py",),
    ),
    Mutation(
        "invalid-shared-filter-ignored",
        "broker/handle_subscribe.py SUBSCRIBE: an invalid v5 filter gets no SUBACK at all "
        "(ignored)",
        "broker/handle_subscribe.py",
        "                codes.append(Reason.TOPIC_FILTER_INVALID)\n                continue\n",
        "                return\n",
        ("tests/broker/test_shared.py::test_invalid_shared_filter_refused",),
    ),
    # -- issue 13: retained messages and persistent sessions survive restarts ------------------
    Mutation(
        "retained-not-persisted",
        "broker/devicelogs.py append: a retained publish's state record is never written",
        "broker/devicelogs.py",
        "            self.retain_log.write(msg)  # same tick, same fsync",
        "            pass  # same tick, same fsync",
        ("tests/broker/test_persistence.py::test_issue_scenario_retained_and_queued_survive",),
    ),
    Mutation(
        "peer-retained-not-persisted",
        "broker/forwarding.py retain_from_peer: a retained change learned from a peer router "
        "is kept in memory only (the mqtt.persistence switch ignored for it)",
        "broker/forwarding.py",
        "        persist = logs.retain_log if logs is not None else None\n",
        "        persist = None\n",
        ("tests/cluster/test_retained_from_peers.py::"
         "test_retained_learned_from_a_peer_survives_a_restart_without_peers",),
    ),
    Mutation(
        "resync-undoes-clear",
        "cluster/retainsync.py on_sync: a peer's RETAIN_SYNC is taken even for a topic cleared "
        "here while apart from it",
        "cluster/retainsync.py",
        "        if router.remote.cleared_since(msg.topic, self.apart_since[link.peer]):\n",
        "        if False:\n",
        ("tests/cluster/test_retained_from_peers.py::"
         "test_a_resync_does_not_bring_back_a_message_cleared_while_apart",),
    ),
    Mutation(
        "peer-retained-acked-before-stored",
        "cluster/retainsync.py on_retain: the link ACK of a peer's retained change is not held "
        "until its state record is durable",
        "cluster/retainsync.py",
        "        slot = link.inbound.hold(seq)\n",
        "        slot = [seq, True]\n",
        ("tests/cluster/test_retainsync_unit.py::"
         "test_the_link_ack_waits_until_the_change_is_stored",),
    ),
    Mutation(
        "qos2-receive-state-not-persisted",
        "broker/sessionstore.py _encode: the QoS 2 packet ids received are not in the record",
        "broker/sessionstore.py",
        '"qos2": [pid for pid, acked in s.incoming_qos2.items() if acked],',
        '"qos2": [],',
        ("tests/broker/test_persistence.py::test_inflight_redelivered_with_dup_and_qos2_receive_state",),
    ),
    Mutation(
        "inflight-not-restored",
        "broker/sessionstore.py _restore_one: the QoS 1/2 window is not restored",
        "broker/sessionstore.py",
        "                s.own_inflight()[pid] = d\n",
        "                pass\n",
        ("tests/broker/test_persistence.py::test_inflight_redelivered_with_dup_and_qos2_receive_state",),
    ),
    Mutation(
        "ack-before-state-stored",
        "broker/sessionstore.py stored: SUBACK/PUBREC/PUBCOMP sent before the record is durable",
        "broker/sessionstore.py",
        "        self._waiters.append((session.conn, then, args))\n",
        "        then(*args)\n",
        ("tests/broker/test_persistence.py::test_nothing_acknowledged_before_the_state_is_stored",),
    ),
    Mutation(
        "suback-not-stored",
        "broker/sessionstore.py stored: the acknowledgement is sent and nothing is written for it "
        "(the subscription waits for the next checkpoint)",
        "broker/sessionstore.py",
        "        self._mark(session.client_id)\n"
        "        self._waiters.append((session.conn, then, args))\n",
        "        then(*args)\n",
        ("tests/broker/test_persistence.py::test_subscription_acked_right_before_kill9_is_kept",),
    ),
    Mutation(
        "retained-unlogged-acked-unstored",
        "broker/devicelogs.py key_for: a retained publish on an unlogged topic acked at once",
        "broker/devicelogs.py",
        "        if key is None and retain and self.retain_log is not None \\\n",
        "        if False \\\n",
        ("tests/broker/test_persistence.py::test_nothing_acknowledged_before_the_state_is_stored",),
    ),
    Mutation(
        "replayed-device-read-twice",
        "broker/sessionstore.py _devices_for: a device read by an offset subscription also gets "
        "a catch-up cursor at restore (delivered twice)",
        "broker/sessionstore.py",
        "        return devices, replayed - devices\n",
        "        return devices | replayed, set()\n",
        ("tests/broker/test_persistence.py::test_offset_subscription_resumes_where_it_was",),
    ),
    Mutation(
        "expiry-counted-from-restart",
        "broker/sessionstore.py restore: session expiry counted from the restart, not from "
        "when the session went offline",
        "broker/sessionstore.py",
        "                since = offline if offline is not None else last_alive\n",
        "                since = now\n",
        ("tests/broker/test_persistence.py::test_session_expiry_counts_the_time_the_broker_was_down",),
    ),
    Mutation(
        # (was "corrupt-state-record-aborts-restore", planting a raise in the except branch of
        # the read loop: since the store salvages corrupt records itself, no exception reaches
        # that branch, so the plant changed nothing and was NOT CAUGHT; the loss is now
        # counted from the store's lost ranges, and that count is what this guards)
        "corrupt-state-record-uncounted",
        "broker/statelog.py replay: records the store salvaged past are not counted (the "
        "restore line says corrupt_records=0 while a session fell back)",
        "broker/statelog.py",
        "        self.corrupt += sum(hi - lo for lo, hi in store.lost_ranges(self.key, start, "
        "end))\n",
        "        pass\n",
        ("tests/broker/test_persistence.py::test_corrupt_session_record_costs_only_that_session",),
    ),
    Mutation(
        "corrupt-record-truncates-the-log",
        "commitlog/store.py recovery: a corrupt record is treated as a torn tail (everything "
        "after it, other sessions' records included, is cut)",
        "commitlog/store.py",
        "                    q = _q.next_valid_record(data, p)\n",
        "                    q = -1\n",
        ("tests/broker/test_persistence.py::test_corrupt_session_record_costs_only_that_session[kill9]",),
    ),
    Mutation(
        "persistence-switch-ignored",
        "meshmq/node.py: mqtt.persistence = false still restores and persists",
        "meshmq/node.py",
        "        if not mqtt.persistence:\n",
        "        if False:\n",
        ("tests/broker/test_persistence.py::test_persistence_off_keeps_nothing",),
    ),
    Mutation(
        "compaction-start-not-moved",
        "broker/statelog.py compact: the snapshot is written but the log's start never moves",
        "broker/statelog.py",
        "            self.store.advance_start(self.key, first)\n",
        "            pass\n",
        ("tests/broker/test_statelog.py",),
    ),
    Mutation(
        "state-logs-listed",
        "commitlog/store.py keys: internal state logs listed as device logs",
        "commitlog/store.py",
        "        return [k for k in self._devices if not k.startswith(INTERNAL_PREFIX)]\n",
        "        return list(self._devices)\n",
        ("tests/commitlog/test_commitlog_internal_keys.py",),
    ),
    Mutation(
        "retention-deletes-state",
        "commitlog/store.py retention: age retention moves a state log's start like a device's",
        "commitlog/store.py",
        " and not dev.key.startswith(INTERNAL_PREFIX):",
        ":",
        ("tests/commitlog/test_commitlog_internal_keys.py",),
    ),
)


def _more_mutations() -> tuple[Mutation, ...]:
    """Guards kept in modules of their own, ``tests/mutations_*.py`` (the cluster node's
    operations side, the mesh's faults, the chaos checker, ...), so that work going on side by
    side does not fight over one tuple. Each module has one function taking this file's
    ``Mutation`` class (no import cycle) and returning its mutations; loaded by path so
    ``python -m tests.mutate`` works too."""
    import importlib.util

    found: list[Mutation] = []
    for path in sorted(Path(__file__).resolve().parent.glob("mutations_*.py")):
        spec = importlib.util.spec_from_file_location(path.stem, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        builders = [getattr(module, n) for n in dir(module) if n.endswith("_mutations")
                    and callable(getattr(module, n))]
        assert len(builders) == 1, f"{path.name}: one *_mutations(Mutation) function expected"
        found.extend(builders[0](Mutation))
    return tuple(found)


MUTATIONS += _more_mutations()


def copy_tree(dest: Path) -> None:
    """The working tree as it is now (uncommitted edits included), without venv/git/caches."""
    def ignore(directory: str, names: list[str]) -> set[str]:
        return {n for n in names if n in SKIP or n.endswith(".pyc")}
    shutil.copytree(ROOT, dest, ignore=ignore, symlinks=True)


def plant(tree: Path, m: Mutation) -> None:
    path = tree / m.path
    text = path.read_text()
    count = text.count(m.old)
    if count != 1:
        raise SystemExit(f"mutation {m.name}: the text to replace occurs {count} times in "
                         f"{m.path} (expected once); update tests/mutate.py")
    path.write_text(text.replace(m.old, m.new))


def run_one(m: Mutation, timeout: float) -> tuple[str, str, float]:
    with tempfile.TemporaryDirectory(prefix=f"meshmq-mutant-{m.name}-") as tmp:
        tree = Path(tmp) / "tree"
        copy_tree(tree)
        plant(tree, m)
        env = {k: v for k, v in os.environ.items() if not k.startswith("MESHMQ_")}
        env["PYTHONPATH"] = str(tree)
        env.pop("TEST_SOAK", None)
        if m.path.endswith(".c"):
            # the copy carries the .so files built from the unplanted source: rebuild them
            # from the planted one, or the plant would never run (it was how C plants were
            # made by hand until this)
            built = subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace",
                                    "-q", "--force"], cwd=tree, env=env, capture_output=True,
                                   text=True, timeout=600)
            if built.returncode != 0:
                why = (built.stderr.strip().splitlines() or [""])[-1]
                return "error", f"the planted C did not build: {why[:160]}", 0.0
        cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
               "-o", "addopts=--import-mode=importlib", *m.tests]
        t0 = time.monotonic()
        try:
            res = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True,
                                 timeout=timeout)
        except subprocess.TimeoutExpired:
            return "error", f"timed out after {timeout:.0f} s", time.monotonic() - t0
        took = time.monotonic() - t0
        tail = [ln for ln in res.stdout.splitlines() if ln.strip()][-1:] or [""]
        summary = tail[0]
        if res.returncode == 0:
            return "NOT CAUGHT", summary, took
        if res.returncode == 1 and re.search(r"\d+ failed", summary):
            first = next((ln for ln in res.stdout.splitlines() if ln.startswith("FAILED")), "")
            return "caught", first[:160] or summary, took
        return "error", f"pytest exit {res.returncode}: {summary}", took


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("only", nargs="*", help="run the mutations whose name contains any of these")
    ap.add_argument("--list", action="store_true", help="list the mutations and exit")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per mutation")
    args = ap.parse_args(argv)
    chosen = [m for m in MUTATIONS if not args.only or any(w in m.name for w in args.only)]
    if args.list:
        for m in chosen:
            print(f"{m.name}: {m.what}\n    tests: {' '.join(m.tests)}")
        return 0
    rows = []
    for m in chosen:
        print(f"-- {m.name}: {m.what}", flush=True)
        verdict, detail, took = run_one(m, args.timeout)
        print(f"   {verdict} ({took:.0f} s) {detail}", flush=True)
        rows.append((m, verdict, took))
    print("\n| planted bug | tests | result | time |\n|---|---|---|---|")
    for m, verdict, took in rows:
        print(f"| `{m.name}`: {m.what} | {', '.join(t.split('/')[-1] for t in m.tests)} "
              f"| {verdict} | {took:.0f} s |")
    return 0 if all(v == "caught" for _, v, _ in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
