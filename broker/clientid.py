"""Which client ids a user may take: ``auth.clientid_rule`` and the same-user takeover rule.

A client id names a session, and a session holds a device's subscriptions, queue and replay
position. Without a binding, any authenticated user could connect as ``bobdev``, kick Bob off
(v5 0x8E) and receive what was queued for him (issue 11). The rule is checked at CONNECT, after
the password:

* ``any``: no binding (the MQTT default; fine without authentication or with trusted users).
* ``username``: the client id must equal the username (Mosquitto's ``use_username_as_clientid``
  makes the same binding by replacing the id; here a client sending an empty id is given its
  username, and any other id is refused, so a misconfigured device fails loudly).
* ``pattern``: the client id must match ``auth.clientid_pattern``, where ``%u`` is the username
  and ``*`` any run of characters (Mosquitto's ACL ``%u`` substitution, EMQX's client-id/username
  check), e.g. ``"%u-*"`` lets alice use ``alice-sensor1``.

Refusal: CONNACK 0x85 (Client Identifier not valid: "a valid string but not allowed by the
Server", 5.0 3.2.2.2), 3.1.1 return code 2 (Identifier rejected), the spec's code for exactly
this. Independently of the rule, when passwords are checked a session is taken over or resumed
only by the user that owns it: another user gets 0x87 Not authorized (3.1.1: 5), because the id
itself may be fine; what is refused is this user's access to someone else's session.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from enum import StrEnum
from typing import Any

CLIENT_IDENTIFIER_NOT_VALID = 0x85
NOT_AUTHORIZED = 0x87


class ClientIdRule(StrEnum):
    ANY = "any"
    USERNAME = "username"
    PATTERN = "pattern"


USERNAME_TOKEN = "%u"


class ClientIdPolicy:
    """The compiled ``auth.clientid_rule`` / ``auth.clientid_pattern`` pair."""

    def __init__(self, rule: ClientIdRule | str = ClientIdRule.ANY, pattern: str = "%u") -> None:
        self.rule = ClientIdRule(rule)
        self.pattern = pattern
        # "%u-*" -> ("", "-", "*") pieces; the username is escaped per check, never compiled in
        self._parts = [re.escape(p).replace(r"\*", ".*") for p in pattern.split(USERNAME_TOKEN)]

    @property
    def binds(self) -> bool:
        return self.rule is not ClientIdRule.ANY

    def default_id(self, username: str | None) -> str | None:
        """The id given to a client that sent an empty one, when the rule names it."""
        if self.rule is ClientIdRule.USERNAME and username:
            return username
        return None

    def refusal(self, client_id: str, username: str | None) -> str | None:
        """Why ``username`` may not use ``client_id`` (a CONNACK reason string), or None."""
        rule = self.rule
        if rule is ClientIdRule.ANY:
            return None
        if not username:
            return f"clientid_rule {rule.value!r} needs a username to bind the client id to"
        if rule is ClientIdRule.USERNAME:
            if client_id == username:
                return None
            return "the client id must equal the username (auth.clientid_rule = \"username\")"
        regex = re.escape(username).join(self._parts)
        if re.fullmatch(regex, client_id, re.DOTALL):
            return None
        return (f"the client id must match {self.pattern!r} with %u = the username "
                f"(auth.clientid_pattern)")


    def connect_refusal(self, client_id: str, username: str | None,
                        sessions: Mapping[str, Any], owners: bool) -> tuple[int, str] | None:
        """(CONNACK reason, reason string) refusing this CONNECT, or None.

        The rule first (0x85); then, when ``owners`` (passwords are checked, so usernames mean
        something), an existing session, live or offline, taken only by its own user (0x87).
        """
        why = self.refusal(client_id, username)
        if why is not None:
            return CLIENT_IDENTIFIER_NOT_VALID, why
        if owners:
            session = sessions.get(client_id)
            if session is not None and session.username != username:
                return NOT_AUTHORIZED, "the client id's session belongs to another user"
        return None
