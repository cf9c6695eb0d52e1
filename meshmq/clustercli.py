"""``meshmq cluster status``: a node's routers, their mesh links and a device's owner, read from
the node's admin endpoint (``GET /api/v1/cluster``, served by the supervisor).

Why from the admin endpoint and not from the config: the config says what should be; an
operator running this wants what *is* (which routers are up, which links are down and since
when, where bytes are queueing). The owner of a device is computed by the node (it has the
configured router list), so this tool needs no config file and works from any machine that can
reach the admin port, like ``meshmq log``.

Human tables by default; ``--json`` prints the endpoint's document unchanged, for scripts.
Exit codes: 0 every router and link up, 1 something is down or the node did not answer, 2 bad
usage (the ``--admin`` address).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, TextIO

from meshmq.logcli import LogCliError, _Http, _silence_stdout, admin_url

__all__ = ["add_cluster_parser", "run_cluster", "render_status"]

def add_cluster_parser(sub: Any) -> None:
    p = sub.add_parser("cluster", help="cluster operations (status)",
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


def _fetch(args: argparse.Namespace) -> tuple[int, Any]:
    """(HTTP status, JSON document) from the node; LogCliError when it cannot be asked."""
    http = _Http(args.admin, args.token_file)
    status, _, body = http.get("/api/v1/cluster",
                               {"device": args.device} if args.device is not None else None)
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
    owner = doc.get("owner")
    if isinstance(owner, dict):
        where = "this node" if owner.get("local") else \
            f"node {str(owner.get('router')).rpartition('/')[0]}"
        # scripts read this line (issue 24): the leader, then its epoch and, under Raft
        # placement, the in-sync replicas
        isr = f", isr {','.join(owner['isr'])}" if owner.get("isr") else ""
        if owner.get("router") is None:  # Raft placement: not placed yet, or no leader now
            print(f"leader of device {owner.get('device')!r}: none (no log placed, or no "
                  "leader now: its first publish places it)", file=out)
        else:
            print(f"leader of device {owner.get('device')!r}: {owner.get('router')} ({where}, "
                  f"epoch {owner.get('epoch')}{isr})", file=out)
        print(f"owner of device {owner.get('device')!r}: {owner.get('router')} ({where})",
              file=out)
    return healthy


def run_cluster(args: argparse.Namespace, out: TextIO | None = None,
                err: TextIO | None = None) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    if getattr(args, "cluster_command", None) != "status":
        print("usage: meshmq cluster status [--admin HOST:PORT] [--device D] [--json]", file=err)
        return 2
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
            return 0 if all(r.get("state") == "up" for r in routers) else 1
        return 0 if render_status(doc, out) else 1
    except BrokenPipeError:  # `meshmq cluster status | head`: the reader left, not an error
        _silence_stdout()
        return 0
