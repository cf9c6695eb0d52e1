"""Who may read device logs over the admin HTTP server (issue 11, item 7).

The fetch API serves every device's stored messages. On loopback that still means any local user;
bound wider, any network peer. So when the node authenticates MQTT clients (``auth.password_file``)
or an operator gives ``admin.token_file``, every admin route except the probes and the metrics
(``/metrics``, ``/healthz``, ``/readyz``: what Prometheus and Kubernetes call without credentials,
and what holds no message data) needs credentials, and a reader sees only the device logs the MQTT
read ACL lets it subscribe to:

* ``Authorization: Basic`` with a user of the MQTT password file (the same scrypt check, on the
  same kind of gate as MQTT logins: bounded concurrency and a lockout after repeated failures per
  address and username, see ``broker/authgate.py``). A verified pair is remembered for
  ``_CACHE_S`` so a poller (Spark, ``meshmq log tail --follow``) does not pay scrypt per request;
  SIGHUP forgets them.
* ``Authorization: Bearer <token>``, tokens from ``admin.token_file``: one ``name:token`` per line
  (``#`` comments); ``name`` is the identity the ACL sees, like a username. Tokens suit programs
  (Kubernetes secrets, Spark jobs), as Prometheus' and EMQX's HTTP APIs use bearer tokens/keys.

The ACL decision per device: a reader may read device ``d``'s log when it may subscribe (read) to
one of the filters that store into that log: each logged ``[[commitlog.rules]]`` filter with
``{device}`` = ``d`` (``devices/d/#`` by default) or ``d/#`` (first-level topic groups). The HTTP
reader has no client id, so ACL ``%c`` patterns do not apply to it. Refusals: 401 with a
``WWW-Authenticate`` challenge (no or bad credentials), 403 (ACL), 429 (locked out).

Precedent: Mosquitto's HTTP API plugin and EMQX's REST API both require credentials; EMQX applies
its authorization to the data it serves. Kafka applies topic READ ACLs to fetch requests.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import json
import logging
import time
from collections.abc import Awaitable, Callable

from aiohttp import web

from broker.auth import Authenticator
from broker.authgate import THROTTLED, PasswordCheckGate
from broker.logrules import LogRules

log = logging.getLogger("meshmq.admin_auth")

#: routes served without credentials: probes and metrics carry no message data
OPEN_PATHS = frozenset(("/metrics", "/healthz", "/readyz"))
_CACHE_S = 60.0  # how long a verified Basic pair is remembered
_CACHE_MAX = 1024
_CHALLENGE = 'Basic realm="meshmq", charset="UTF-8", Bearer realm="meshmq"'
READER_KEY = "meshmq_reader"  # request key: the authenticated name (None = auth is off)


class TokenFileError(ValueError):
    """A token file that cannot be used; ``str()`` says which line and why."""


def load_tokens(path: str) -> dict[str, str]:
    """``{token: name}`` from a file of ``name:token`` lines (``#`` comments, blank lines)."""
    tokens: dict[str, str] = {}
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            text = line.strip()
            if not text or text.startswith("#"):
                continue
            name, sep, token = text.partition(":")
            if not sep or not name or len(token) < 16:
                raise TokenFileError(f"{path}:{n}: expected name:token with a token of at least "
                                     f"16 characters")
            tokens[token] = name
    return tokens


class AdminAuth:
    """Authenticates admin requests and decides which device logs a reader may see."""

    def __init__(self, loop: asyncio.AbstractEventLoop, authenticator: Authenticator | None,
                 token_file: str | None, rules: LogRules | None, *, max_failures: int,
                 failure_window: float, max_address_failures: int | None = None) -> None:
        self._auth = authenticator
        self._token_file = token_file
        self._tokens = load_tokens(token_file) if token_file else {}
        self._rules = rules or LogRules()
        self._acl = authenticator if authenticator is not None and authenticator.acl_enabled \
            else None
        self._gate = PasswordCheckGate(loop, authenticator.authenticate, max_concurrent=1,
                                       max_failures=max_failures,
                                       failure_window=failure_window,
                                       max_address_failures=max_address_failures) \
            if authenticator is not None and authenticator.uses_passwords else None
        self._verified: dict[tuple[str, bytes], float] = {}

    def reload(self) -> None:
        """SIGHUP: re-read the token file (a broken one keeps the old tokens) and forget
        verified passwords."""
        self._verified.clear()
        if self._token_file:
            try:
                self._tokens = load_tokens(self._token_file)
            except (OSError, TokenFileError) as exc:
                log.error("SIGHUP: admin.token_file not reloaded, keeping the old tokens: %s",
                          exc)

    def close(self) -> None:
        if self._gate is not None:
            self._gate.close()

    # -- aiohttp ------------------------------------------------------------------------------
    @web.middleware
    async def middleware(self, request: web.Request,
                         handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                         ) -> web.StreamResponse:
        if request.path in OPEN_PATHS:
            return await handler(request)
        refused = await self.refusal(request)
        return refused if refused is not None else await handler(request)

    async def refusal(self, request: web.Request) -> web.Response | None:
        """Authenticate ``request``: None when it may go on (the reader's name is then in
        ``request[READER_KEY]``), else the 401 or 429 to answer. The middleware's check, for
        a server that guards only some routes itself (the node admin's ``/api/v1/cluster``)."""
        status, name = await self._identify(request)
        if status != 200:
            log.info("admin request refused (HTTP %d)", status,
                     extra={"peer": request.remote, "path": request.path, "reader": name})
            headers = {"WWW-Authenticate": _CHALLENGE} if status == 401 else None
            why = {401: "credentials required (HTTP Basic with an MQTT user, or a bearer token)",
                   429: "too many failed logins from this address or for this user; retry "
                        "later"}[status]
            return _error(status, why, headers)
        request[READER_KEY] = name
        return None

    def may_read(self, request: web.Request, device: str) -> bool:
        """The read ACL for ``device``'s log (True when the ACL is off)."""
        acl = self._acl
        if acl is None:
            return True
        name = request.get(READER_KEY)
        return any(acl.can_subscribe(name, "", flt) for flt in self._rules.filters_for(device))

    def may(self, request: web.Request, topic: str, write: bool) -> bool:
        """The MQTT ACL of the request's reader for one topic: ``read`` (as a SUBSCRIBE to
        it) or ``write`` (as a PUBLISH). The admin routes of meshmq/admin_api.py use it for
        retained topics and for their ``$CONTROL/meshmq/clients`` guard. True without an ACL."""
        acl = self._acl
        if acl is None:
            return True
        name = request.get(READER_KEY)
        if write:
            return acl.can_publish(name, "", topic)
        return acl.can_subscribe(name, "", topic)

    # -- credentials --------------------------------------------------------------------------
    async def _identify(self, request: web.Request) -> tuple[int, str | None]:
        header = request.headers.get("Authorization", "")
        scheme, _, value = header.partition(" ")
        scheme = scheme.lower()
        value = value.strip()
        if scheme == "bearer" and value:
            for token, name in self._tokens.items():
                if hmac.compare_digest(token.encode(), value.encode()):
                    return 200, name
            return 401, None
        if scheme == "basic" and value and self._gate is not None:
            try:
                user, sep, password = base64.b64decode(value, validate=True).decode().partition(
                    ":")
            except (binascii.Error, UnicodeDecodeError):
                return 401, None
            if not sep or not user:
                return 401, None
            return await self._check_password(request.remote or "?", user, password.encode())
        return 401, None

    async def _check_password(self, address: str, user: str, password: bytes
                              ) -> tuple[int, str | None]:
        key = (user, hashlib.sha256(password).digest())
        now = time.monotonic()
        seen = self._verified.get(key)
        if seen is not None and now - seen < _CACHE_S:
            return 200, user
        assert self._gate is not None
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[int] = loop.create_future()
        code = self._gate.submit(address, user, password,
                                 lambda c: fut.done() or fut.set_result(c), lambda: True)
        if code is None:
            code = await fut
        if code == THROTTLED:
            return 429, user
        if code != 0:
            return 401, user
        if len(self._verified) >= _CACHE_MAX:
            self._verified.clear()
        self._verified[key] = now
        return 200, user


def _error(status: int, why: str, headers: dict[str, str] | None) -> web.Response:
    return web.Response(status=status, content_type="application/json",
                        text=json.dumps({"error": why}), headers=headers)
