"""Clients, sessions, subscriptions and retained messages over the admin HTTP API (issue 27).

What an operator of a broker reaches for after the metrics: who is connected, what a session
holds, kick a client, look at and delete retained messages. EMQX's REST API
(``/api/v5/clients``, ``/subscriptions``, ``/mqtt/retainer``) and ``emqx ctl`` are the model,
as are Mosquitto's dynamic-security ``$CONTROL`` topics for the authorization (below).

Routes (admin bind, JSON; the CLI is ``meshmq clients|sessions|retained``, meshmq/admincli.py)
---------------------------------------------------------------------------------------------

``GET /api/v1/clients?prefix=&username=&node=&protocol=&after=&limit=``
    Connected clients, sorted by client id, one page: ``{"clients": [...], "next_after": id}``
    (``next_after`` absent on the last page; ``limit`` 1 to 10000, default 1000). Each:
    ``client_id, username, router, address, protocol ("mqttv31", "mqttv311", "mqttv5"),
    connected_at (unix s), keepalive, inflight, queued, subscriptions, expiry_interval``.
    ``prefix`` filters by client id prefix, ``node`` by node id or router id (``n1``,
    ``n1/0``), ``protocol`` by the names above.
``GET /api/v1/clients/{id}``; ``DELETE /api/v1/clients/{id}[?clean=true]``
    One client; kick it: v5 clients get DISCONNECT 0x98 (Administrative action), 3.x clients
    are disconnected. The will is published as for any server-side close. The session is kept
    (a persistent one stays, offline) unless ``clean=true``, which ends it with the connection.
``GET /api/v1/sessions?prefix=&connected=true|false&after=&limit=``
    Every session, offline ones too: ``connected``, ``expiry_interval`` (s, null: never),
    ``expires_in`` (s left, offline only), ``inflight``, ``queued``, ``queued_bytes``,
    ``subscriptions``, ``lagging_devices`` (logs it is fed from, broker/catchup.py).
``GET /api/v1/sessions/{id}`` (with its subscriptions); ``DELETE /api/v1/sessions/{id}``
    ends the session (and its connection, 0x98), connected or not.
``GET /api/v1/subscriptions?client_id=&filter=&after=&limit=``
    Subscriptions of one client, or every subscription to one exact filter (``$share/g/f``
    included), or all; sorted by (client id, filter), paged by ``after=<client id>``.
``GET /api/v1/retained?match=FILTER&after=&limit=``, ``GET/DELETE /api/v1/retained/{topic}``
    Retained messages whose topic the filter matches (default ``#``), sorted by topic; one
    with its payload (``payload`` as UTF-8 text or base64, ``payload_encoding`` says which);
    delete one: written to the ``#retained`` state log (a tombstone, durable before the
    answer) and cleared on every router, as an empty retained PUBLISH would be, but sent to
    no subscriber. (Implemented in meshmq/admin_retained.py; the shared helpers are in
    meshmq/adminhttp.py.)

Authentication and authorization are the fetch API's (meshmq/admin_auth.py): the same
credentials; with an ACL, the clients, sessions and subscriptions routes need ``read`` on the
topic ``$CONTROL/meshmq/clients`` (``write`` to kick or delete), as Mosquitto's dynamic
security guards its admin commands by ACL on ``$CONTROL/dynamic-security/#``; retained
messages are listed and read under the reader's ``read`` ACL per topic, deleted under its
``write`` ACL. Every action (kick, delete) is logged at INFO with the reader and its address.

In a cluster any router answers for the whole cluster, as the fetch API does: a listing asks
every peer router for the same page over the mesh (``X-Meshmq-Relayed``: each answers from its
own state) and merges them, naming routers that did not answer under ``"unreachable"``; one
client or session is looked for on every router; a kick or delete whose owner cannot be asked
is a 503 naming it, never a success. Retained messages are on every router already (the mesh
keeps them in sync), so those routes answer locally.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlencode

from aiohttp import web

from broker.port import RouterPort
from broker.protocol.reasons import Reason
from broker.session import NEVER, Session
from meshmq.admin_auth import READER_KEY
from meshmq.admin_retained import register_retained_routes
from meshmq.adminhttp import (
    API,
    CHECK_KEY,
    NAME_KEY,
    ROUTER_KEY,
    Bad,
    Check,
    allowed,
    check_params,
    flag,
    handled,
    json_response,
    page_limit,
    router_of,
    who,
)
from meshmq.fetch_api import RELAYED_HEADER, ClusterView

__all__ = ["register_admin_routes", "attach_admin_cluster", "CONTROL_TOPIC", "merge_sorted"]

log = logging.getLogger("meshmq.admin_api")

#: the ACL topic guarding the clients/sessions/subscriptions routes (read: look; write: act)
CONTROL_TOPIC = "$CONTROL/meshmq/clients"
RELAY_TIMEOUT_S = 10.0
_PROTOCOLS = {3: "mqttv31", 4: "mqttv311", 5: "mqttv5"}

_VIEW_KEY = web.AppKey("meshmq_admin_cluster", object)




def register_admin_routes(app: web.Application, router: RouterPort, name: str,
                          check: Check | None = None) -> None:
    """Add the routes of the module docstring to ``app`` (before it starts). ``name`` is this
    router's id (``n1/0``; the node id on a single node); ``check(request, topic, write)``,
    when given, is the reader's ACL decision (meshmq/admin_auth.py ``AdminAuth.may``)."""
    app[ROUTER_KEY] = router
    app[NAME_KEY] = name
    if check is not None:
        app[CHECK_KEY] = check
    app.router.add_get(API + "/clients", _clients)
    app.router.add_get(API + "/clients/{id}", _client)
    app.router.add_delete(API + "/clients/{id}", _kick)
    app.router.add_get(API + "/sessions", _sessions)
    app.router.add_get(API + "/sessions/{id}", _session)
    app.router.add_delete(API + "/sessions/{id}", _delete_session)
    app.router.add_get(API + "/subscriptions", _subscriptions)
    register_retained_routes(app)


def attach_admin_cluster(app: web.Application, view: ClusterView) -> None:
    """Make these routes answer for the whole cluster (meshmq/cluster_wiring.py)."""
    if ROUTER_KEY in app:
        app[_VIEW_KEY] = view


# ------------------------------------------------------------------ helpers






def _control(request: web.Request, write: bool) -> None:
    if not allowed(request, CONTROL_TOPIC, write):
        what = "write" if write else "read"
        raise Bad(403, f"not authorised: the ACL must grant {what} on {CONTROL_TOPIC} to "
                   f"{request.get(READER_KEY)!r} for this route")












def _view(request: web.Request) -> ClusterView | None:
    if RELAYED_HEADER in request.headers:
        return None  # a peer's part: this router's own state only
    return request.app.get(_VIEW_KEY)




def merge_sorted(pages: list[tuple[list[dict[str, Any]], bool]], key: Callable[[dict], Any],
                 limit: int) -> tuple[list[dict[str, Any]], bool]:
    """Merge sorted pages of the same request from several routers: the first ``limit`` in
    ``key`` order and whether more follow. Exact: a router with more had returned ``limit``
    entries, all at or before its unreturned ones, so nothing unreturned precedes the cut."""
    rows = sorted((r for page, _ in pages for r in page), key=key)
    more = len(rows) > limit or any(m for _, m in pages)
    return rows[:limit], more


def _page(rows: list[dict[str, Any]], key: str, after: str | None, limit: int,
          ) -> tuple[list[dict[str, Any]], bool]:
    rows = sorted((r for r in rows if after is None or r[key] > after), key=lambda r: r[key])
    return rows[:limit], len(rows) > limit


# ------------------------------------------------------------------ what a router holds


def _protocol(level: int) -> str:
    return _PROTOCOLS.get(level, str(level))


def _expiry(session: Session) -> int | None:
    return None if session.expiry_interval == NEVER else session.expiry_interval


def _connected(session: Session) -> Any:
    """The session's live connection (None while offline)."""
    conn = session.conn
    return conn if conn is not None and not conn.closing else None


def _client_row(name: str, session: Session, conn: Any) -> dict[str, Any]:
    now_wall, now = time.time(), time.monotonic()
    return {"client_id": session.client_id, "username": conn.username, "router": name,
            "address": conn.peer, "protocol": _protocol(conn.level),
            "connected_at": round(now_wall - (now - conn.accepted_at), 3),
            "keepalive": conn.keepalive, "inflight": len(session.inflight),
            "queued": len(session.queue), "subscriptions": len(session.subscriptions),
            "expiry_interval": _expiry(session)}


def _session_row(name: str, session: Session) -> dict[str, Any]:
    conn = _connected(session)
    expires_in = None
    if conn is None and session.expires_at is not None:
        expires_in = max(0, round(session.expires_at - time.monotonic(), 1))
    return {"client_id": session.client_id, "router": name, "connected": conn is not None,
            "username": session.username, "protocol": _protocol(session.level),
            "expiry_interval": _expiry(session), "expires_in": expires_in,
            "inflight": len(session.inflight), "queued": len(session.queue),
            "queued_bytes": session.queue.nbytes, "subscriptions": len(session.subscriptions),
            "lagging_devices": len(session.lag)}


def _sub_row(name: str, session: Session, key: str, sub: Any) -> dict[str, Any]:
    return {"client_id": session.client_id, "router": name, "filter": key, "qos": sub.qos,
            "no_local": sub.no_local, "retain_as_published": sub.retain_as_published,
            "retain_handling": sub.retain_handling, "subscription_id": sub.sub_id,
            "share_group": sub.group, "replay": sub.replay is not None}


def _node_matches(name: str, node: str) -> bool:
    return name == node or name.partition("/")[0] == node


# ------------------------------------------------------------------ gathering from peers


async def _gather(request: web.Request, path: str, params: Mapping[str, str],
                  ) -> list[tuple[str, int, Any]]:
    """``(router, status, JSON or error text)`` of the same GET at every peer router."""
    view = _view(request)
    if view is None:
        return []
    peers = view.peers()
    full = path + ("?" + urlencode(params) if params else "")
    headers = [(k, v) for k, v in request.headers.items() if k.lower() == "authorization"]
    answers = await asyncio.gather(*(_ask(view, p, request.method, full, headers)
                                     for p in peers))
    return [(p, status, doc) for p, (status, doc) in zip(peers, answers, strict=True)]


async def _ask(view: ClusterView, router: str, method: str, path: str,
               headers: list[tuple[str, str]]) -> tuple[int, Any]:
    try:
        status, _ctype, _h, body = await view.relay(router, method, path, headers, b"",
                                                    RELAY_TIMEOUT_S)
    except Exception as exc:  # noqa: BLE001 - one peer's failure is reported, not raised
        return 502, f"relaying to router {router} failed: {exc!r}"
    try:
        doc = json.loads(body)
    except ValueError:
        return (status if status != 200 else 502), body.decode("utf-8", "replace")[:300]
    return status, doc


def _why(status: int, doc: Any) -> str:
    if isinstance(doc, dict):
        return f"HTTP {status}: {doc.get('error', doc)}"
    return f"HTTP {status}: {doc}"


async def _listing(request: web.Request, field: str, rows: list[dict[str, Any]], more: bool,
                   params: dict[str, str], limit: int, key: Callable[[dict], Any],
                   ) -> web.Response:
    """This router's page merged with every peer's (``merge_sorted``)."""
    pages = [(rows, more)]
    unreachable: dict[str, str] = {}
    for peer, status, doc in await _gather(request, request.rel_url.raw_path, params):
        if status == 200 and isinstance(doc, dict) and isinstance(doc.get(field), list):
            pages.append((doc[field], "next_after" in doc))
        elif status in (401, 403, 400):
            raise Bad(status, f"router {peer}: {_why(status, doc)}", router=peer)
        else:
            unreachable[peer] = _why(status, doc)
    out, more = merge_sorted(pages, key, limit)
    body: dict[str, Any] = {field: out}
    if more and out:
        body["next_after"] = out[-1]["client_id"]
    if unreachable:
        log.warning("admin API: %s listing misses routers that did not answer: %s", field,
                    unreachable)
        body["unreachable"] = unreachable
    return json_response(200, body)


async def _one(request: web.Request, local: dict[str, Any] | None, what: str,
               ident: str) -> web.Response:
    """The local answer, else the first peer's 200; 404 only when every router said so."""
    if local is not None:
        return json_response(200, local)
    unreachable: dict[str, str] = {}
    found: list[dict[str, Any]] = []
    for peer, status, doc in await _gather(request, request.rel_url.raw_path,
                                           dict(request.query)):
        if status == 200 and isinstance(doc, dict):
            found.append(doc)
        elif status in (401, 403):
            raise Bad(status, f"router {peer}: {_why(status, doc)}", router=peer)
        elif status != 404:
            unreachable[peer] = _why(status, doc)
    if found:
        return json_response(200, found[0])
    if unreachable:
        # not found where we could look: it may be at a router that did not answer
        raise Bad(503, f"{what} {ident!r} not found on the routers that answered; these did "
                   f"not: {unreachable}", unreachable=unreachable)
    raise Bad(404, f"no {what} {ident!r}")


# ------------------------------------------------------------------ clients


@handled
async def _clients(request: web.Request) -> web.Response:
    params = check_params(request, ("prefix", "username", "node", "protocol", "after", "limit"))
    _control(request, write=False)
    limit = page_limit(params)
    name = request.app[NAME_KEY]
    prefix, user = params.get("prefix", ""), params.get("username")
    node, proto = params.get("node"), params.get("protocol")
    if proto is not None and proto not in _PROTOCOLS.values():
        raise Bad(400, f"protocol must be one of {', '.join(_PROTOCOLS.values())}, got "
                   f"{proto!r}", parameter="protocol")
    rows = []
    if node is None or _node_matches(name, node):
        for session in list(router_of(request).sessions.values()):
            conn = _connected(session)
            if conn is None or not session.client_id.startswith(prefix):
                continue
            if user is not None and conn.username != user:
                continue
            if proto is not None and _protocol(conn.level) != proto:
                continue
            rows.append(_client_row(name, session, conn))
    page, more = _page(rows, "client_id", params.get("after"), limit)
    return await _listing(request, "clients", page, more, params, limit,
                          lambda r: r["client_id"])


def _local_session(request: web.Request) -> Session | None:
    return router_of(request).sessions.get(request.match_info["id"])


@handled
async def _client(request: web.Request) -> web.Response:
    check_params(request, ())
    _control(request, write=False)
    session = _local_session(request)
    conn = _connected(session) if session is not None else None
    local = None
    if conn is not None:
        local = _client_row(request.app[NAME_KEY], session, conn)
        local["subscription_list"] = [_sub_row(request.app[NAME_KEY], session, k, s)
                                      for k, s in sorted(session.subscriptions.items())]
    return await _one(request, local, "connected client", request.match_info["id"])


@handled
async def _kick(request: web.Request) -> web.Response:
    params = check_params(request, ("clean",))
    _control(request, write=True)
    clean = bool(flag(params, "clean"))
    session = _local_session(request)
    conn = _connected(session) if session is not None else None
    if conn is None:
        return await _act_elsewhere(request, "connected client", clean)
    name = request.app[NAME_KEY]
    cid = session.client_id
    log.info("admin: kicking client %r (%s)%s", cid, conn.peer,
             ", ending its session" if clean else ", its session kept", extra={
                 **who(request), "client_id": cid, "clean": clean})
    _close(router_of(request), session, conn, clean, request)
    return json_response(200, {"client_id": cid, "router": name, "kicked": True,
                       "session_ended": clean or session.expiry_interval == 0})


def _close(router: Any, session: Session, conn: Any, clean: bool,
           request: web.Request) -> None:
    """Disconnect ``conn`` with 0x98; with ``clean``, its session ends with the connection
    (expiry 0: the router's own close path ends it, persistence included)."""
    if clean:
        session.expiry_interval = 0
    conn.close_reason = f"kicked by an administrator ({request.get(READER_KEY) or 'admin API'})"
    conn.close(Reason.ADMINISTRATIVE_ACTION)
    router.flush_writes()


async def _act_elsewhere(request: web.Request, what: str, clean: bool) -> web.Response:
    """A kick or delete for a client this router does not hold: done at the router that
    does. An unknown outcome is never a success: a router that did not answer makes a 503."""
    ident = request.match_info["id"]
    done: list[dict[str, Any]] = []
    unreachable: dict[str, str] = {}
    for peer, status, doc in await _gather(request, request.rel_url.raw_path,
                                           dict(request.query)):
        if status == 200 and isinstance(doc, dict):
            done.append(doc)
        elif status in (401, 403):
            raise Bad(status, f"router {peer}: {_why(status, doc)}", router=peer)
        elif status != 404:
            unreachable[peer] = _why(status, doc)
    if done:
        log.info("admin: %s %r %s at router %s", what, ident,
                 "deleted" if what == "session" else "kicked",
                 ", ".join(str(d.get("router")) for d in done),
                 extra={**who(request), "client_id": ident, "clean": clean})
        return json_response(200, done[0])
    if unreachable:
        raise Bad(503, f"{what} {ident!r} not found on the routers that answered; not done: "
                   f"these did not answer: {unreachable}", unreachable=unreachable)
    raise Bad(404, f"no {what} {ident!r}")


# ------------------------------------------------------------------ sessions


@handled
async def _sessions(request: web.Request) -> web.Response:
    params = check_params(request, ("prefix", "connected", "after", "limit"))
    _control(request, write=False)
    limit = page_limit(params)
    connected = flag(params, "connected")
    prefix = params.get("prefix", "")
    name = request.app[NAME_KEY]
    rows = []
    for session in list(router_of(request).sessions.values()):
        if not session.client_id.startswith(prefix):
            continue
        row = _session_row(name, session)
        if connected is None or row["connected"] == connected:
            rows.append(row)
    page, more = _page(rows, "client_id", params.get("after"), limit)
    return await _listing(request, "sessions", page, more, params, limit,
                          lambda r: r["client_id"])


@handled
async def _session(request: web.Request) -> web.Response:
    check_params(request, ())
    _control(request, write=False)
    session = _local_session(request)
    local = None
    if session is not None:
        name = request.app[NAME_KEY]
        local = _session_row(name, session)
        local["subscription_list"] = [_sub_row(name, session, k, s)
                                      for k, s in sorted(session.subscriptions.items())]
        local["lag"] = {d: c.next for d, c in session.lag.items()}
    return await _one(request, local, "session", request.match_info["id"])


@handled
async def _delete_session(request: web.Request) -> web.Response:
    check_params(request, ())
    _control(request, write=True)
    session = _local_session(request)
    if session is None:
        return await _act_elsewhere(request, "session", True)
    router = router_of(request)
    conn = _connected(session)
    cid = session.client_id
    log.info("admin: deleting session %r (%s)", cid,
             "connected: closing it with 0x98" if conn is not None else "offline", extra={
                 **who(request), "client_id": cid})
    if conn is not None:
        _close(router, session, conn, True, request)
    else:
        router.end_session(session)
        router.flush_writes()
    return json_response(200, {"client_id": cid, "router": request.app[NAME_KEY], "deleted": True})


# ------------------------------------------------------------------ subscriptions


@handled
async def _subscriptions(request: web.Request) -> web.Response:
    params = check_params(request, ("client_id", "filter", "after", "limit"))
    _control(request, write=False)
    limit = page_limit(params)
    name = request.app[NAME_KEY]
    cid, flt = params.get("client_id"), params.get("filter")
    sessions = router_of(request).sessions
    chosen = [sessions[cid]] if cid is not None and cid in sessions else \
        [] if cid is not None else list(sessions.values())
    rows = []
    after = params.get("after")
    for session in chosen:
        if after is not None and session.client_id <= after:
            continue
        for key, sub in sorted(session.subscriptions.items()):
            if flt is None or key == flt:
                rows.append(_sub_row(name, session, key, sub))
    # paged by client: a client's subscriptions are never split over two pages
    rows.sort(key=lambda r: (r["client_id"], r["filter"]))
    page: list[dict[str, Any]] = []
    clients: set[str] = set()
    more = False
    for r in rows:
        if r["client_id"] not in clients and len(clients) >= limit:
            more = True
            break
        clients.add(r["client_id"])
        page.append(r)
    pages = [(page, more)]
    unreachable: dict[str, str] = {}
    for peer, status, doc in await _gather(request, request.rel_url.raw_path, params):
        if status == 200 and isinstance(doc, dict) and isinstance(doc.get("subscriptions"),
                                                                  list):
            pages.append((doc["subscriptions"], "next_after" in doc))
        elif status in (401, 403, 400):
            raise Bad(status, f"router {peer}: {_why(status, doc)}", router=peer)
        else:
            unreachable[peer] = _why(status, doc)
    merged = sorted((r for p, _ in pages for r in p),
                    key=lambda r: (r["client_id"], r["filter"]))
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    more = any(m for _, m in pages)
    for r in merged:
        if r["client_id"] not in seen and len(seen) >= limit:
            more = True
            break
        seen.add(r["client_id"])
        out.append(r)
    body: dict[str, Any] = {"subscriptions": out}
    if more and out:
        body["next_after"] = out[-1]["client_id"]
    if unreachable:
        body["unreachable"] = unreachable
    return json_response(200, body)
