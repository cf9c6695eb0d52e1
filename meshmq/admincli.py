"""``meshmq clients|sessions|retained ...``: the admin API (meshmq/admin_api.py) from a shell.

What ``emqx ctl clients|subscriptions|retainer`` gives an EMQX operator: list, show, kick,
delete. Tables by default (for a person), ``--json`` for scripts (one JSON object per line
for a listing, the object itself for one item). Any node answers for the whole cluster; a
listing that misses routers names them on stderr and exits 1, as ``meshmq log list`` does.

Credentials: ``--token-file`` (a bearer token, as ``meshmq log``), or ``--user NAME`` with the
password from ``MESHMQ_ADMIN_PASSWORD`` (or a prompt): HTTP Basic with an MQTT user.
Exit codes: 0 ok, 1 failed (not found, refused, unreachable), 2 bad usage.
"""

from __future__ import annotations

import argparse
import base64
import getpass
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, TextIO

from meshmq.logcli import DEFAULT_ADMIN, LogCliError, admin_url, read_token

__all__ = ["add_admin_parsers", "run_admin"]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
HTTP_TIMEOUT_S = 30.0
PAGE = 1000

# (column title, field) per listing
_COLUMNS = {
    "clients": (("CLIENT_ID", "client_id"), ("USERNAME", "username"), ("ROUTER", "router"),
                ("ADDRESS", "address"), ("PROTOCOL", "protocol"), ("KEEPALIVE", "keepalive"),
                ("INFLIGHT", "inflight"), ("QUEUED", "queued"), ("SUBS", "subscriptions")),
    "sessions": (("CLIENT_ID", "client_id"), ("ROUTER", "router"), ("CONNECTED", "connected"),
                 ("EXPIRY", "expiry_interval"), ("EXPIRES_IN", "expires_in"),
                 ("INFLIGHT", "inflight"), ("QUEUED", "queued"), ("SUBS", "subscriptions")),
    "retained": (("TOPIC", "topic"), ("QOS", "qos"), ("BYTES", "payload_bytes")),
    "subscriptions": (("CLIENT_ID", "client_id"), ("FILTER", "filter"), ("QOS", "qos"),
                      ("ROUTER", "router")),
}


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--admin", default=DEFAULT_ADMIN, metavar="HOST:PORT",
                   help=f"admin API of any node, HOST:PORT or a URL (default {DEFAULT_ADMIN})")
    p.add_argument("--token-file", metavar="PATH",
                   help="bearer token: a file holding it, or a name:token line")
    p.add_argument("--user", metavar="NAME", help="HTTP Basic with this MQTT user; password "
                   "from MESHMQ_ADMIN_PASSWORD or a prompt")
    p.add_argument("--json", action="store_true", help="JSON output for scripts")


def add_admin_parsers(sub: Any) -> None:
    """Add ``clients``, ``sessions`` and ``retained`` to ``meshmq``'s parser."""
    clients = sub.add_parser("clients", help="list, show or kick connected clients")
    csub = clients.add_subparsers(dest="admin_command", metavar="ACTION")
    lst = csub.add_parser("list", help="connected clients, every node of the cluster")
    lst.add_argument("--prefix", help="client ids starting with this")
    lst.add_argument("--username")
    lst.add_argument("--node", help="a node id or a router id (n1/0)")
    lst.add_argument("--protocol", choices=("mqttv31", "mqttv311", "mqttv5"))
    _common(lst)
    show = csub.add_parser("show", help="one client, with its subscriptions")
    show.add_argument("client_id", metavar="CLIENT_ID")
    _common(show)
    kick = csub.add_parser("kick", help="disconnect a client (v5: DISCONNECT 0x98)")
    kick.add_argument("client_id", metavar="CLIENT_ID")
    kick.add_argument("--clean", action="store_true",
                      help="end its session too (default: a persistent session is kept)")
    _common(kick)

    sessions = sub.add_parser("sessions", help="list, show or delete sessions (offline too)")
    ssub = sessions.add_subparsers(dest="admin_command", metavar="ACTION")
    lst = ssub.add_parser("list", help="sessions, connected and offline")
    lst.add_argument("--prefix", help="client ids starting with this")
    lst.add_argument("--connected", choices=("true", "false"))
    _common(lst)
    show = ssub.add_parser("show", help="one session, with its subscriptions")
    show.add_argument("client_id", metavar="CLIENT_ID")
    _common(show)
    delete = ssub.add_parser("delete", help="end a session (and its connection)")
    delete.add_argument("client_id", metavar="CLIENT_ID")
    _common(delete)
    subs = ssub.add_parser("subscriptions", help="subscriptions by client or by filter")
    subs.add_argument("--client-id")
    subs.add_argument("--filter")
    _common(subs)

    retained = sub.add_parser("retained", help="list, get or delete retained messages")
    rsub = retained.add_subparsers(dest="admin_command", metavar="ACTION")
    lst = rsub.add_parser("list", help="retained messages whose topic matches a filter")
    lst.add_argument("--match", default="#", metavar="FILTER", help="default #")
    _common(lst)
    get = rsub.add_parser("get", help="one retained message with its payload")
    get.add_argument("topic", metavar="TOPIC")
    _common(get)
    delete = rsub.add_parser("delete", help="delete one retained message (cluster-wide)")
    delete.add_argument("topic", metavar="TOPIC")
    _common(delete)


class _Api:
    def __init__(self, args: argparse.Namespace) -> None:
        self.base = admin_url(args.admin)
        self.headers: dict[str, str] = {}
        if args.token_file:
            self.headers["Authorization"] = "Bearer " + read_token(args.token_file)
        elif args.user:
            password = os.environ.get("MESHMQ_ADMIN_PASSWORD")
            if password is None:
                password = getpass.getpass(f"Password for {args.user}: ")
            pair = base64.b64encode(f"{args.user}:{password}".encode()).decode()
            self.headers["Authorization"] = "Basic " + pair

    def call(self, method: str, path: str, query: dict[str, str] | None = None,
             ) -> tuple[int, dict[str, Any]]:
        url = self.base + path
        if query:
            url += "?" + urllib.parse.urlencode(query)
        req = urllib.request.Request(url, headers=self.headers, method=method)
        try:
            with urllib.request.urlopen(req, timeout=HTTP_TIMEOUT_S) as resp:
                status, body = resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            status, body = exc.code, exc.read()
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise LogCliError(f"cannot reach the admin API at {self.base} ({reason}): is "
                              "`meshmq serve` running? set --admin HOST:PORT") from None
        try:
            doc = json.loads(body)
        except ValueError:
            raise LogCliError(f"{url}: HTTP {status}, not a JSON answer") from None
        if status == 401:
            raise LogCliError("HTTP 401: the node wants credentials: --token-file PATH or "
                              "--user NAME (an MQTT user of auth.password_file)")
        if status != 200:
            raise LogCliError(f"HTTP {status}: {doc.get('error', doc)}")
        return status, doc


def _path(kind: str, ident: str) -> str:
    return f"/api/v1/{kind}/" + urllib.parse.quote(ident, safe="/" if kind == "retained"
                                                    else "")


def run_admin(args: argparse.Namespace, out: TextIO | None = None,
              err: TextIO | None = None) -> int:
    """Run a parsed ``meshmq clients|sessions|retained ...``; returns the exit code."""
    out = out or sys.stdout
    err = err or sys.stderr
    cmd, action = args.command, getattr(args, "admin_command", None)
    if action is None:
        print(f"usage: meshmq {cmd} ACTION ... (see meshmq {cmd} --help)", file=err)
        return EXIT_USAGE
    try:
        api = _Api(args)
        if action == "list" or action == "subscriptions":
            return _list(api, args, cmd, action, out, err)
        kind = {"clients": "clients", "sessions": "sessions", "retained": "retained"}[cmd]
        ident = args.topic if cmd == "retained" else args.client_id
        if action in ("show", "get"):
            _, doc = api.call("GET", _path(kind, ident))
            _print_one(doc, args.json, out)
            return EXIT_OK
        query = {"clean": "true"} if action == "kick" and args.clean else None
        _, doc = api.call("DELETE", _path(kind, ident), query)
        if args.json:
            print(json.dumps(doc), file=out)
        else:
            what = {"kick": "kicked", "delete": "deleted"}[action]
            where = f" at router {doc['router']}" if doc.get("router") else ""
            extra = " (session ended)" if doc.get("session_ended") and action == "kick" else ""
            print(f"{ident}: {what}{where}{extra}", file=out)
        return EXIT_OK
    except LogCliError as exc:
        print(f"meshmq {cmd} {action}: {exc}", file=err)
        return EXIT_FAILED


def _list(api: _Api, args: argparse.Namespace, cmd: str, action: str, out: TextIO,
          err: TextIO) -> int:
    if action == "subscriptions":
        field, path = "subscriptions", "/api/v1/subscriptions"
        query = {k: v for k, v in (("client_id", args.client_id), ("filter", args.filter))
                 if v is not None}
    elif cmd == "retained":
        field, path, query = "retained", "/api/v1/retained", {"match": args.match}
    else:
        field, path = cmd, f"/api/v1/{cmd}"
        names = ("prefix", "username", "node", "protocol") if cmd == "clients" else \
            ("prefix", "connected")
        query = {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}
    rows: list[dict[str, Any]] = []
    unreachable: dict[str, str] = {}
    after: str | None = None
    while True:  # every page
        q = {**query, "limit": str(PAGE), **({"after": after} if after is not None else {})}
        _, doc = api.call("GET", path, q)
        rows += doc.get(field, [])
        unreachable.update(doc.get("unreachable") or {})
        after = doc.get("next_after")
        if after is None:
            break
    if args.json:
        for row in rows:
            print(json.dumps(row), file=out)
    else:
        _table(rows, _COLUMNS[field], out)
    if unreachable:
        print(f"meshmq {cmd} {action}: incomplete, these routers did not answer: "
              + "; ".join(f"{k}: {v}" for k, v in unreachable.items()), file=err)
        return EXIT_FAILED
    return EXIT_OK


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def _table(rows: list[dict[str, Any]], columns: tuple[tuple[str, str], ...],
           out: TextIO) -> None:
    cells = [[_cell(r.get(f)) for _, f in columns] for r in rows]
    heads = [h for h, _ in columns]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, h in enumerate(heads)]
    for line in [heads, *cells]:
        print("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip(),
              file=out)


def _print_one(doc: dict[str, Any], as_json: bool, out: TextIO) -> None:
    if as_json:
        print(json.dumps(doc), file=out)
        return
    subs = doc.pop("subscription_list", None)
    width = max(len(k) for k in doc) if doc else 0
    for key, value in doc.items():
        shown = json.dumps(value) if isinstance(value, dict | list) else _cell(value)
        print(f"{key:<{width}}  {shown}", file=out)
    if subs is not None:
        print("", file=out)
        _table(subs, _COLUMNS["subscriptions"], out)
