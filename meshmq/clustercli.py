"""``meshmq cluster status``: a node's routers, their mesh links and a device's owner, read from
the node's admin endpoint (``GET /api/v1/cluster``, served by the supervisor).

Why from the admin endpoint and not from the config: the config says what should be; an
operator running this wants what *is* (which routers are up, which links are down and since
when, where bytes are queueing). The owner of a device is computed by the node (it has the
configured router list), so this tool needs no config file and works from any machine that can
reach the admin port, like ``meshmq log``.

Human tables by default; ``--json`` prints the endpoint's document unchanged, for scripts.
Exit codes: 0 every router and link up (and, under Raft placement, a Raft leader, every node
alive and no under-replicated, offline or lost log, no stuck reassignment), 1 something is
down or the node did not answer, 2 bad usage (the ``--admin`` address).

``meshmq cluster rebalance`` (opt-in, cluster/rebalance.py): the moves that give every node a
fair share of replicas and leaders, printed with ``--dry-run``; carried out through Raft's
compare-and-set commands otherwise, and waited for (``--timeout``) with a progress line each
time the moves' states change, the way ``kafka-reassign-partitions --verify`` is run until
done. Adding a node never moves a log by itself (placement is
state, not a hash): this is how an operator moves some onto it, when it suits them.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, TextIO

from cluster.rebalance import FAILED, FINISHED
from meshmq.logcli import LogCliError, _Http, _silence_stdout, admin_url

__all__ = ["add_cluster_parser", "run_cluster", "render_status"]

def add_cluster_parser(sub: Any) -> None:
    p = sub.add_parser("cluster", help="cluster operations (status, rebalance)",
                       description="Cluster operations against a node's admin endpoint.")
    csub = p.add_subparsers(dest="cluster_command", metavar="SUBCOMMAND")
    st = csub.add_parser(
        "status", help="routers, mesh links and device owners of a node",
        description="Show the node's routers (PID, state, restarts), every mesh link of each "
        "(state and age, RTT, messages and bytes each way, routes, queue, window) and, with "
        "--device, the router that owns a device's log.")
    st.add_argument("--admin", default="127.0.0.1:9883", metavar="HOST:PORT",
                    help="the node's admin endpoint (admin.bind; default 127.0.0.1:9883); "
                    "https://... for an HTTPS admin")
    st.add_argument("--device", metavar="D", help="also show which router owns device D's log")
    st.add_argument("--json", action="store_true", help="print the raw JSON document")
    st.add_argument("--token-file", metavar="PATH",
                    help="bearer token for a node with admin authentication (as meshmq log)")
    st.add_argument("--limit", type=int, default=20, metavar="N",
                    help="list at most N devices per log state (under-replicated, offline, "
                    "lost; the counts are always whole; default 20)")
    rb = csub.add_parser(
        "rebalance", help="move replicas and leaders so every node has a fair share",
        description="Plan (and, without --dry-run, carry out through Raft) the moves that "
        "give every node a fair share of device-log replicas and leaders. Opt-in: adding a "
        "node never moves an existing log by itself. Without --dry-run it waits (at most "
        "--timeout) until every move is done: its new replicas copied the log and joined "
        "the in-sync replicas, the old ones dropped, the planned leader leading. Exit 0: "
        "every move done (or nothing to do); 1: a move was refused or did not finish in time "
        "(or the node could not be asked); 2: bad usage.")
    rb.add_argument("--admin", default="127.0.0.1:9883", metavar="HOST:PORT",
                    help="any node's admin endpoint (default 127.0.0.1:9883)")
    rb.add_argument("--dry-run", action="store_true", help="print the moves, change nothing")
    rb.add_argument("--max-moves", type=int, default=1000, metavar="N",
                    help="change at most N logs in this run (default 1000)")
    rb.add_argument("--timeout", type=float, default=300.0, metavar="S",
                    help="without --dry-run: wait at most S seconds for the moves to finish, "
                    "printing progress (default 300); moves still copying then go on in the "
                    "background (meshmq cluster status shows them)")
    rb.add_argument("--cancel", action="store_true",
                    help="give up the moves still in progress instead (their replicas go back "
                    "to the old ones; a move already done stays): for a move stuck on a node "
                    "that will not return")
    rb.add_argument("--device", metavar="D", help="with --cancel: only device D's move")
    rb.add_argument("--json", action="store_true", help="print the raw JSON answer")
    rb.add_argument("--token-file", metavar="PATH",
                    help="bearer token for a node with admin authentication")


def _fetch(args: argparse.Namespace) -> tuple[int, Any]:
    """(HTTP status, JSON document) from the node; LogCliError when it cannot be asked."""
    http = _Http(args.admin, args.token_file)
    query: dict[str, Any] = {"limit": args.limit}
    if args.device is not None:
        query["device"] = args.device
    status, _, body = http.get("/api/v1/cluster", query)
    try:
        return status, json.loads(body)
    except ValueError:
        return status, {"error": body[:200].decode("utf-8", "replace")}


def _age(seconds: float | None) -> str:
    if seconds is None or seconds < 0:
        return "-"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def _size(n: Any) -> str:
    if not isinstance(n, int | float):
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024
    return str(n)


def _table(rows: list[tuple[str, ...]], out: TextIO) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip(), file=out)


def _normalise(doc: dict[str, Any]) -> dict[str, Any]:
    """Accept a router's own ``/api/v1/cluster`` too (one mesh status, no supervisor view)."""
    if "routers" in doc or "router" not in doc:
        return doc
    owner = doc.get("owner")
    return {"cluster": doc.get("cluster", "?"), "node": str(doc["router"]).rpartition("/")[0],
            "routers": [{"router": doc["router"], "pid": None, "state": "up", "restarts": None,
                         "up_since": None, "mesh": doc}],
            **({"owner": owner} if isinstance(owner, dict) else {})}


def _awaiting(link: dict[str, Any]) -> str:
    """Publishes waiting for the peer's outcome (the peer owns their logs), and the oldest's
    age: what grows toward cluster.append_timeout while an owner is unreachable."""
    count = link.get("awaiting_outcome")
    if count is None:
        return "-"
    return f"{count} ({link.get('oldest_awaiting_s', 0):.1f}s)" if count else "0"


def render_status(doc: dict[str, Any], out: TextIO, now: float | None = None) -> bool:
    """Print the status document as tables; True when every router and link is up."""
    now = time.time() if now is None else now
    doc = _normalise(doc)
    routers = doc.get("routers", [])
    total = len(doc.get("router_ids", [])) or "?"
    print(f"cluster {doc.get('cluster')!s}  node {doc.get('node')!s}  "
          f"{doc.get('routers_per_node', len(routers))} router(s) here, {total} in the cluster",
          file=out)
    healthy = True
    rows: list[tuple[str, ...]] = [("ROUTER", "PID", "STATE", "UP FOR", "RESTARTS",
                                    "LAST EXIT", "LOCAL FILTERS")]
    for r in routers:
        up_since = r.get("up_since")
        mesh = r.get("mesh") or {}
        if r.get("state") != "up":
            healthy = False
        rows.append((str(r.get("router")), str(r.get("pid") or "-"), str(r.get("state")),
                     _age(now - up_since) if isinstance(up_since, int | float) else "-",
                     "-" if r.get("restarts") is None else str(r.get("restarts")),
                     str(r.get("last_exit") or "-"), str(mesh.get("local_filters", "-"))))
    _table(rows, out)

    links: list[tuple[str, ...]] = [("ROUTER", "PEER", "STATE", "AGE", "RTT", "MSGS OUT/IN",
                                     "BYTES OUT/IN", "ROUTES OUT/IN", "QUEUED", "WINDOW",
                                     "AWAITING (OLDEST)")]
    up = down = 0
    notes = []
    for r in routers:
        mesh = r.get("mesh")
        if not isinstance(mesh, dict):
            notes.append(f"{r.get('router')}: no mesh status ({r.get('error', 'unknown')})")
            continue
        for link in mesh.get("links", []):
            state = str(link.get("state", "?"))
            if state == "up":
                up += 1
            else:
                down += 1
            since = link.get("since")
            age = link.get("age_s")
            if age is None and isinstance(since, int | float):
                age = now - since
            rtt = link.get("rtt_ms")
            links.append((str(r.get("router")), str(link.get("peer")), state, _age(age),
                          f"{rtt:.2f}ms" if isinstance(rtt, int | float) else "-",
                          f"{link.get('msgs_out', '-')}/{link.get('msgs_in', '-')}",
                          f"{_size(link.get('bytes_out'))}/{_size(link.get('bytes_in'))}",
                          f"{link.get('routes_out', '-')}/{link.get('routes_in', '-')}",
                          str(link.get("queued", "-")), str(link.get("window", "-")),
                          _awaiting(link)))
    print(file=out)
    if len(links) > 1:
        _table(links, out)
    print(f"links: {up} up, {down} down", file=out)
    for note in notes:
        print(note, file=out)
    if down or notes:
        healthy = False
    meta = doc.get("metadata")
    if isinstance(meta, dict):
        # the node's Raft voter (cluster.placement = "raft"): who leads the group, and whether
        # this voter can say at all (an operator's first question when placement stalls)
        if meta.get("error"):
            print(f"metadata (raft {meta.get('raft')}): {meta['error']}", file=out)
            healthy = False
        else:
            leader = meta.get("leader")
            print(f"metadata: raft leader {leader or 'none (election in progress?)'}  term "
                  f"{meta.get('term')}  commit index {meta.get('commit_index')}  this voter "
                  f"{meta.get('raft')} ({meta.get('state')})  restarts {meta.get('restarts')}",
                  file=out)
            if not leader:
                healthy = False
    if not _render_raft_health(doc, out):
        healthy = False
    owner = doc.get("owner")
    if isinstance(owner, dict):
        where = "this node" if owner.get("local") else \
            f"node {str(owner.get('router')).rpartition('/')[0]}"
        # scripts read this line (issue 24): the leader, then its epoch and, under Raft
        # placement, the in-sync replicas
        isr = f", isr {','.join(owner['isr'])}" if owner.get("isr") else ""
        if owner.get("replicas"):
            isr += f", replicas {','.join(owner['replicas'])}"
        if owner.get("router") is None:  # Raft placement: not placed yet, or no leader now
            print(f"leader of device {owner.get('device')!r}: none (no log placed, or no "
                  "leader now: its first publish places it)", file=out)
        else:
            print(f"leader of device {owner.get('device')!r}: {owner.get('router')} ({where}, "
                  f"epoch {owner.get('epoch')}{isr})", file=out)
        print(f"owner of device {owner.get('device')!r}: {owner.get('router')} ({where})",
              file=out)
        lost = owner.get("lost")
        if isinstance(lost, dict):
            print(f"device {owner.get('device')!r}: LOST: {_lost_text(lost)}", file=out)
            healthy = False
    return healthy


def _lost_text(lost: dict[str, Any]) -> str:
    return (f"acknowledged up to offset {lost.get('floor')}, its leader "
            f"{lost.get('leader')} came back with {lost.get('end')} records and no replica "
            "holds the rest; publishes are refused. Restore that node's data directory from a "
            "backup (then restart it)")


def _render_raft_health(doc: dict[str, Any], out: TextIO) -> bool:
    """Node liveness and the device logs' states (cluster/loghealth.py); True when every
    node is alive and no log is under-replicated, offline or lost."""
    nodes = doc.get("node_liveness")
    logs = doc.get("logs")
    if not isinstance(nodes, list) or not isinstance(logs, dict):
        return True
    healthy = True
    words = []
    for n in nodes:
        state = {True: "alive", False: "DOWN", None: "unknown"}[n.get("alive")]
        if n.get("alive") is not True:
            healthy = False
        words.append(f"{n.get('id')} {state}" + (" (raft leader)" if n.get("raft_leader")
                                                   else ""))
    print("nodes: " + ", ".join(words), file=out)
    print(f"logs: {logs.get('logs')} placed, "
          f"{logs['under_replicated']['count']} under-replicated, "
          f"{logs['offline']['count']} offline, {logs['lost']['count']} lost"
          + ("" if logs.get("liveness_known") else
             " (node liveness unknown: offline not counted)"), file=out)
    for key, label, what in (
            ("under_replicated", "under-replicated", "a follower is behind or down: bring its "
             "node back; writes continue while the ISR has min_insync_replicas members"),
            ("offline", "offline", "no live leader: publishes are refused until leadership "
             "moves to an in-sync replica or the leader's node returns"),
            ("lost", "LOST", "every replica lost acknowledged records: restore the leader "
             "node's data directory from a backup; `--device D` says how far")):
        state = logs[key]
        if state["count"]:
            healthy = False
            more = state["count"] - len(state["devices"])
            print(f"{label} logs ({what}): " + ", ".join(state["devices"])
                  + (f" and {more} more (--limit)" if more > 0 else ""), file=out)
    moving, stuck = logs.get("reassigning"), logs.get("reassign_stuck")
    if isinstance(moving, dict) and moving.get("count"):
        # a rebalance in progress is not a fault (exit 0); one waiting on a dead node is
        more = moving["count"] - len(moving["devices"])
        print("reassigning logs (meshmq cluster rebalance: new replicas catching up): "
              + ", ".join(moving["devices"]) + (f" and {more} more (--limit)" if more > 0
                                                else ""), file=out)
    if isinstance(stuck, dict) and stuck.get("count"):
        healthy = False
        more = stuck["count"] - len(stuck["devices"])
        print("STUCK reassignments (a replica being added is on a node that is down: the "
              "move finishes when it returns and catches up; the log keeps its old replicas "
              "meanwhile; or give it up: meshmq cluster rebalance --cancel): "
              + ", ".join(stuck["devices"])
              + (f" and {more} more (--limit)" if more > 0 else ""), file=out)
    return healthy


def run_cluster(args: argparse.Namespace, out: TextIO | None = None,
                err: TextIO | None = None) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    command = getattr(args, "cluster_command", None)
    if command not in ("status", "rebalance"):
        print("usage: meshmq cluster status [--admin HOST:PORT] [--device D] [--limit N] "
              "[--json]\n       meshmq cluster rebalance [--admin HOST:PORT] [--dry-run] "
              "[--max-moves N] [--timeout S] [--json]\n       meshmq cluster rebalance "
              "--cancel [--device D] [--admin HOST:PORT]", file=err)
        return 2
    if command == "rebalance":
        return run_rebalance(args, out, err)
    try:
        admin_url(args.admin)
    except LogCliError as exc:
        print(f"meshmq cluster status: {exc}", file=err)
        return 2
    try:
        status, doc = _fetch(args)
    except LogCliError as exc:
        print(f"meshmq cluster status: {exc}", file=err)
        return 1
    if status == 404:
        print(f"meshmq cluster status: {args.admin} is not a cluster node (no [cluster] in its "
              "config, or an older meshmq)", file=err)
        return 1
    if status != 200 or not isinstance(doc, dict):
        reason = doc.get("error") if isinstance(doc, dict) else None
        print(f"meshmq cluster status: {args.admin} answered HTTP {status}"
              + (f": {reason}" if reason else ""), file=err)
        return 1
    try:
        if args.json:
            json.dump(doc, out, indent=2)
            print(file=out)
            routers = _normalise(doc).get("routers", [])
            quiet = _Discard()
            healthy = all(r.get("state") == "up" for r in routers) \
                and _render_raft_health(doc, quiet)
            return 0 if healthy else 1
        return 0 if render_status(doc, out) else 1
    except BrokenPipeError:  # `meshmq cluster status | head`: the reader left, not an error
        _silence_stdout()
        return 0


class _Discard:
    """A TextIO that drops what is written (the health verdict without its text)."""

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass


def _post(http: _Http, path: str, query: dict[str, Any],
          body: bytes = b"") -> tuple[int, Any]:
    url = f"{http.base}{path}?{urllib.parse.urlencode(query)}"
    headers = dict(http.headers)
    if body:
        headers["Content-Type"] = "application/json"
    req = urllib.request.Request(url, data=body, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            status, body = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        status, body = exc.code, exc.read()
    except (urllib.error.URLError, OSError) as exc:
        raise LogCliError(f"cannot reach the admin API at {http.base} "
                          f"({getattr(exc, 'reason', exc)})") from None
    try:
        return status, json.loads(body)
    except ValueError:
        return status, {"error": body[:200].decode("utf-8", "replace")}


def run_rebalance(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Exit 0: planned (dry run), or every move done; 1: a move was refused or did not
    finish within ``--timeout``, or the node could not be asked; 2: bad usage."""
    if args.cancel:
        return _cancel(args, out, err)
    if args.device is not None:
        print("meshmq cluster rebalance: --device goes with --cancel", file=err)
        return 2
    if args.max_moves < 1:
        print("meshmq cluster rebalance: --max-moves must be at least 1", file=err)
        return 2
    if not args.timeout > 0:
        print("meshmq cluster rebalance: --timeout must be above 0", file=err)
        return 2
    try:
        http = _Http(args.admin, args.token_file)
        query: dict[str, Any] = {"max_moves": args.max_moves}
        if args.dry_run:
            query["dry_run"] = 1
        status, doc = _post(http, "/api/v1/cluster/rebalance", query)
    except LogCliError as exc:
        print(f"meshmq cluster rebalance: {exc}", file=err)
        return 1
    if not isinstance(doc, dict) or "moves" not in doc:
        reason = doc.get("error") if isinstance(doc, dict) else None
        print(f"meshmq cluster rebalance: {args.admin} answered HTTP {status}"
              + (f": {reason}" if reason else ""), file=err)
        return 1
    if args.json:
        json.dump(doc, out, indent=2)
        print(file=out)
    else:
        for m in doc["moves"]:
            print(f"move {m['device']!r}: leader {m['leader']} -> {m['new_leader']}, replicas "
                  f"{','.join(m['replicas'])} -> {','.join(m['new_replicas'])}", file=out)
        verb = "would move" if doc.get("dry_run") else "moves"
        print(f"{len(doc['moves'])} of {doc.get('logs')} logs {verb}"
              + (" (nothing to do: every node holds and leads a fair share)"
                 if not doc["moves"] else ""), file=out)
    if status != 200:
        print(f"meshmq cluster rebalance: {doc.get('error', f'HTTP {status}')}", file=err)
        return 1
    if doc.get("dry_run"):
        return 0
    # refused: a compare-and-set computed from a record that changed since the plan. An
    # unknown outcome (applied None) and a deferred leader move are read back while waiting
    failed = {r["device"] for r in doc.get("results") or ()
              if r.get("applied") is False and not r.get("deferred")}
    for r in doc.get("results") or ():
        if r["device"] in failed:
            print(f"meshmq cluster rebalance: {r['device']!r} not moved: "
                  f"{r.get('why') or 'its record changed since the plan (run it again)'}",
                  file=err)
    waiting = [m for m in doc["moves"] if m["device"] not in failed]
    if not waiting:
        return 1 if failed else 0
    try:
        # progress lines to stderr under --json: stdout stays one JSON document
        finished = _wait_moves(http, waiting, args.timeout, err if args.json else out, err)
    except LogCliError as exc:
        print(f"meshmq cluster rebalance: {exc}", file=err)
        return 1
    return 0 if finished and not failed else 1


def _cancel(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """``--cancel``: exit 0 when every move in progress was given up (or none was), 1 when
    one was refused (completed meanwhile: run status) or the node could not be asked."""
    if args.dry_run:
        print("meshmq cluster rebalance: --cancel changes placement; it has no --dry-run",
              file=err)
        return 2
    query: dict[str, Any] = {} if args.device is None else {"device": args.device}
    try:
        status, doc = _post(_Http(args.admin, args.token_file),
                            "/api/v1/cluster/rebalance/cancel", query)
    except LogCliError as exc:
        print(f"meshmq cluster rebalance --cancel: {exc}", file=err)
        return 1
    if status != 200 or not isinstance(doc, dict) or "cancelled" not in doc:
        reason = doc.get("error") if isinstance(doc, dict) else None
        print(f"meshmq cluster rebalance --cancel: {args.admin} answered HTTP {status}"
              + (f": {reason}" if reason else ""), file=err)
        return 1
    if args.json:
        json.dump(doc, out, indent=2)
        print(file=out)
    failed = 0
    for r in doc["cancelled"]:
        if r.get("applied"):
            if not args.json:
                rec = r.get("record") or {}
                print(f"cancelled the move of {r['device']!r}: replicas back to "
                      f"{','.join(rec.get('replicas', []))}", file=out)
            continue
        failed += 1
        why = r.get("why") or "its record changed (the move completed, or another began)"
        print(f"meshmq cluster rebalance --cancel: {r['device']!r} not cancelled: {why}",
              file=err)
    if not args.json:
        print(f"{len(doc['cancelled']) - failed} moves cancelled"
              + ("" if doc["cancelled"] else " (none in progress)"), file=out)
    return 1 if failed else 0


POLL_S = 0.5  # between progress reads while the moves copy


def _wait_moves(http: _Http, moves: list[dict[str, Any]], timeout: float, out: TextIO,
                err: TextIO) -> bool:
    """Poll the node until every move is done, cannot finish, or ``timeout`` passed, printing
    a line whenever the counts change. True when every move is done."""
    started = time.monotonic()
    deadline = started + timeout
    body = json.dumps({"moves": [{k: m[k] for k in ("device", "new_leader", "new_replicas")}
                                 for m in moves]}).encode()
    last = None
    states: list[dict[str, Any]] = []
    while True:
        try:
            status, doc = _post(http, "/api/v1/cluster/rebalance/progress", {}, body)
            if status != 200 or not isinstance(doc, dict) or "moves" not in doc:
                reason = doc.get("error") if isinstance(doc, dict) else None
                raise LogCliError(f"progress: {http.base} answered HTTP {status}"
                                  + (f": {reason}" if reason else ""))
        except LogCliError as exc:
            # the moves go on in Raft whatever this poll met (a node restarting, a busy
            # admin): asked again until the deadline, then reported
            if time.monotonic() >= deadline:
                raise
            print(f"meshmq cluster rebalance: {exc}; asking again", file=err)
            time.sleep(POLL_S)
            continue
        states = doc["moves"]
        counts: dict[str, int] = {}
        for st in states:
            counts[st["state"]] = counts.get(st["state"], 0) + 1
        line = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
        if line != last:
            print(f"progress: {line} (of {len(states)}, "
                  f"{time.monotonic() - started:.0f}s)", file=out)
            out.flush()
            last = line
        if all(st["state"] in FINISHED + FAILED for st in states):
            break
        if time.monotonic() >= deadline:
            break
        time.sleep(POLL_S)
    ok = True
    for st in states:
        if st["state"] in FINISHED:
            continue
        ok = False
        if st["state"] in FAILED:
            why = st.get("why") or st["state"]
        else:
            why = (f"not finished within --timeout {timeout:g} s ({st['state']}"
                   + (f": waiting for {', '.join(st['waiting'])}" if st.get("waiting") else "")
                   + "); it goes on in the background: see meshmq cluster status")
        print(f"meshmq cluster rebalance: {st['device']!r} not moved: {why}", file=err)
    if ok:
        print(f"every move done ({len(states)})", file=out)
    return ok
