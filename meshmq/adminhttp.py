"""What the admin routes of meshmq/admin_api.py (clients, sessions, subscriptions) and
meshmq/admin_retained.py (retained messages) share: the app keys they find the router and the
reader's ACL under, JSON errors, query parameters and paging bounds. Kept apart so each route
module stays one subject without reaching into the other's private names.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web

from meshmq.admin_auth import READER_KEY
from meshmq.fetch_api import RELAYED_HEADER

__all__ = ["API", "DEFAULT_PAGE", "MAX_PAGE", "ROUTER_KEY", "NAME_KEY", "CHECK_KEY", "Check",
           "Bad", "json_response", "allowed", "who", "check_params", "page_limit", "flag",
           "router_of", "handled"]

API = "/api/v1"
DEFAULT_PAGE = 1000
MAX_PAGE = 10_000

# (request, topic, write) -> allowed: the reader's MQTT ACL (AdminAuth.may); absent: no ACL
Check = Callable[[web.Request, str, bool], bool]
ROUTER_KEY = web.AppKey("meshmq_admin_router", object)  # the router (broker/port.py)
NAME_KEY = web.AppKey("meshmq_admin_name", str)  # this router's id ("n1/0"; the node id)
CHECK_KEY = web.AppKey("meshmq_admin_check", object)


class Bad(Exception):
    """A request the route refuses: rendered as ``{"error": ..., **extra}`` with ``status``."""

    def __init__(self, status: int, message: str, **extra: object) -> None:
        super().__init__(message)
        self.status = status
        self.body = {"error": message, **extra}


def json_response(status: int, body: Mapping[str, object]) -> web.Response:
    return web.Response(status=status, content_type="application/json", text=json.dumps(body))


def allowed(request: web.Request, topic: str, write: bool) -> bool:
    """The reader's ACL for ``topic`` (``write``: publish, else subscribe); True without."""
    check = request.app.get(CHECK_KEY)
    return check is None or check(request, topic, write)


def who(request: web.Request) -> dict[str, object]:
    """Who asked, for the INFO line of an action."""
    return {"admin_user": request.get(READER_KEY), "peer": request.remote,
            "relayed": RELAYED_HEADER in request.headers}


def check_params(request: web.Request, known: tuple[str, ...]) -> dict[str, str]:
    """The query, refused with 400 naming an unknown or repeated parameter."""
    query = request.query
    for key in query:
        if key not in known:
            raise Bad(400, f"unknown parameter {key!r}; allowed: {', '.join(known) or 'none'}",
                      parameter=key)
        if len(query.getall(key)) > 1:
            raise Bad(400, f"parameter {key!r} given twice", parameter=key)
    return dict(query)


def page_limit(params: Mapping[str, str]) -> int:
    text = params.get("limit")
    if text is None:
        return DEFAULT_PAGE
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= MAX_PAGE:
        raise Bad(400, f"limit must be an integer between 1 and {MAX_PAGE}, got {text!r}",
                  parameter="limit")
    return int(text)


def flag(params: Mapping[str, str], name: str) -> bool | None:
    text = params.get(name)
    if text is None:
        return None
    if text.lower() in ("true", "1", "yes"):
        return True
    if text.lower() in ("false", "0", "no"):
        return False
    raise Bad(400, f"{name} must be true or false, got {text!r}", parameter=name)


def router_of(request: web.Request) -> Any:
    return request.app[ROUTER_KEY]


Handler = Callable[[web.Request], Awaitable[web.Response]]


def handled(fn: Handler) -> Handler:
    """A route whose ``Bad`` becomes its JSON answer."""
    async def run(request: web.Request) -> web.Response:
        try:
            return await fn(request)
        except Bad as bad:
            return json_response(bad.status, bad.body)
    run.__name__ = fn.__name__
    run.__doc__ = fn.__doc__
    return run
