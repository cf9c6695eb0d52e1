"""Retained messages over the admin API (issue 27): list by filter, get one with its payload,
delete one. The routes are described in meshmq/admin_api.py's docstring (one contract for the
operator); this module is their implementation.

Every router holds the whole retained set (the mesh keeps it in sync, cluster/retainsync.py),
so these routes answer at the router asked, in a cluster too. A delete is what an empty
retained PUBLISH does, minus the delivery: its tombstone is written to the ``#retained`` state
log and durable before the answer (a delete the operator saw succeed does not come back after
a kill -9), then the message is cleared here and on every peer (``RouterPort.retain``).
EMQX's ``DELETE /mqtt/retainer/message/{topic}`` is the precedent.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from typing import Any
from urllib.parse import quote

from aiohttp import web

from broker.message import Message
from commitlog.store import LogWriteError
from meshmq.adminhttp import (
    API,
    Bad,
    allowed,
    check_params,
    handled,
    json_response,
    page_limit,
    router_of,
    who,
)

__all__ = ["register_retained_routes", "retained_path"]

log = logging.getLogger("meshmq.admin_api")  # one logger for every admin action


def register_retained_routes(app: web.Application) -> None:
    app.router.add_get(API + "/retained", _retained_list)
    app.router.add_get(API + "/retained/{topic:.+}", _retained_get)
    app.router.add_delete(API + "/retained/{topic:.+}", _retained_delete)



def _payload(payload: bytes) -> tuple[str, str]:
    try:
        text = payload.decode("utf-8")
        if text.isprintable():
            return text, "utf-8"
    except UnicodeDecodeError:
        pass
    return base64.b64encode(payload).decode(), "base64"


def _retained_row(topic: str, msg: Any, with_payload: bool) -> dict[str, Any]:
    row: dict[str, Any] = {"topic": topic, "qos": msg.qos, "payload_bytes": len(msg.payload),
                           "expires_in": (msg.remaining_expiry() or None)}
    if with_payload:
        row["payload"], row["payload_encoding"] = _payload(bytes(msg.payload))
        props = msg.properties or {}
        user = props.get(0x26)  # v5 User Property pairs, as the publisher sent them
        if user:
            row["user_properties"] = [list(p) for p in user]
    return row


def _valid_filter(flt: str) -> bool:
    levels = flt.split("/")
    for i, level in enumerate(levels):
        if "#" in level and (level != "#" or i != len(levels) - 1):
            return False
        if "+" in level and level != "+":
            return False
    return bool(flt)


@handled
async def _retained_list(request: web.Request) -> web.Response:
    params = check_params(request, ("match", "after", "limit"))
    limit = page_limit(params)
    flt = params.get("match", "#")
    if not _valid_filter(flt):
        raise Bad(400, f"match must be an MQTT topic filter, got {flt!r}", parameter="match")
    after = params.get("after")
    store = router_of(request).retained
    now = time.monotonic()
    rows = []
    for topic, msg in store.items():
        if after is not None and topic <= after:
            continue
        if msg.expired(now) or not _matches(flt, topic) or not allowed(request, topic, False):
            continue
        rows.append(_retained_row(topic, msg, False))
    rows.sort(key=lambda r: r["topic"])
    body: dict[str, Any] = {"retained": rows[:limit]}
    if len(rows) > limit:
        body["next_after"] = rows[limit - 1]["topic"]
    return json_response(200, body)


def _matches(flt: str, topic: str) -> bool:
    """MQTT matching, ``$`` topics only for filters that name them [MQTT-4.7.2-1]."""
    f, t = flt.split("/"), topic.split("/")
    if topic.startswith("$") and f[0] in ("+", "#"):
        return False
    for i, level in enumerate(f):
        if level == "#":
            return True
        if i >= len(t) or (level != "+" and level != t[i]):
            return False
    return len(f) == len(t)


def _retained_topic(request: web.Request, write: bool) -> str:
    topic = request.match_info["topic"]
    if "+" in topic or "#" in topic:
        raise Bad(400, f"{topic!r} is a filter: name one topic (list with ?match=)",
                   parameter="topic")
    if not allowed(request, topic, write):
        raise Bad(403, f"not authorised to {'write' if write else 'read'} {topic!r}")
    return topic


@handled
async def _retained_get(request: web.Request) -> web.Response:
    check_params(request, ())
    topic = _retained_topic(request, False)
    found = router_of(request).retained.match(topic)  # one topic: a walk, expired ones dropped
    if not found:
        raise Bad(404, f"no retained message on {topic!r}")
    msg = found[0]
    return json_response(200, _retained_row(topic, msg, True))


@handled
async def _retained_delete(request: web.Request) -> web.Response:
    check_params(request, ())
    topic = _retained_topic(request, True)
    router = router_of(request)
    if not router.retained.match(topic):
        raise Bad(404, f"no retained message on {topic!r}")
    clear = Message(topic, b"", 0, True, None, None, None)
    logs = router.logs
    persist = logs.retain_log if logs is not None else None
    if persist is not None and persist.keeps(topic):
        # the tombstone is stored before the answer, as an empty retained PUBLISH's PUBACK
        # waits for it: a delete the operator saw succeed does not come back at a restart
        try:
            persist.write(clear)
        except LogWriteError as err:
            raise Bad(503, f"the #retained state log cannot write: {err}") from None
        loop = asyncio.get_running_loop()
        stored: asyncio.Future[BaseException | None] = loop.create_future()
        persist.log.committer.when_durable(
            lambda exc: stored.done() or stored.set_result(exc))
        exc = await stored
        if exc is not None:
            raise Bad(503, f"the delete was not stored (#retained state log: {exc})")
    router.retain(clear)  # cleared here and on every peer router (cluster/retainsync.py)
    log.info("admin: deleted the retained message on %r", topic,
             extra={**who(request), "topic": topic})
    return json_response(200, {"topic": topic, "deleted": True})


def retained_path(topic: str) -> str:
    """The URL path of one retained topic (for the CLI)."""
    return f"{API}/retained/{quote(topic, safe='/')}"
