"""Client authentication (password file) and authorisation (Mosquitto-style ACL file).

Why these formats:

* **Passwords** are salted scrypt hashes (``hashlib.scrypt``, n=2**14, r=8, p=1, 16-byte salt,
  32-byte key): memory-hard, in the standard library, and ~50 ms per check, which makes an
  offline guess expensive. One line per user::

      alice:$scrypt$n=16384,r=8,p=1$<salt base64>$<hash base64>

  The parameters travel with each hash, so they can be raised later without invalidating old
  lines. Mosquitto 2.x ``$7$`` lines (PBKDF2-SHA512, written by ``mosquitto_passwd``) are also
  accepted so an existing password file can be moved over as is; new hashes are always scrypt.
  Because a check costs ~50 ms of CPU, ``Authenticator.authenticate`` is a plain function the
  broker runs in an executor, never on the event loop.

* **ACLs** use Mosquitto's ``acl_file`` format, which operators already know::

      # before any `user` line: rules for anonymous clients
      topic read public/#
      user alice                 # rules for username "alice"
      topic readwrite alice/#
      client sensor-7            # meshmq extension: rules for client id "sensor-7"
      topic write sensors/7/#
      pattern write devices/%c/# # for everyone; %u = username, %c = client id
      pattern deny devices/%c/admin/#

  Access is ``read``, ``write``, ``readwrite`` (the default when omitted) or ``deny``. The topic is
  the rest of the line and may contain spaces; to keep typos loud, a second word that is not an
  access keyword is an error unless ``readwrite`` is written out. ``user`` and ``client`` sections
  both apply when a client matches both. ``pattern`` lines apply to every client wherever they
  appear. As in Mosquitto, a pattern is skipped for a client whose username/client id (whichever
  the pattern uses) contains ``+``, ``#`` or ``/``, so that client id ``#`` or ``a/b`` cannot
  widen ``devices/%c/#`` to someone else's tree; and a pattern using ``%u`` never applies to an
  anonymous client.

  Decisions: with no ACL file everything is allowed; with one, anything not granted is denied,
  and a matching ``deny`` beats any grant. PUBLISH needs ``write`` on the topic. SUBSCRIBE to a
  filter needs one ``read`` rule whose filter *covers* it (every topic the subscription could
  match is matched by the rule; Mosquitto's rule) and no ``deny`` rule covering it. A deny that
  only overlaps the filter (``deny a/secret`` vs a subscription to ``a/#``) does not refuse the
  SUBSCRIBE; the broker calls ``can_deliver`` per message, as Mosquitto does, so the secret topic
  is never delivered. Wildcards in a rule never match topics starting with ``$`` at the first
  level (MQTT-4.7.2-1): ``$SYS/...`` needs a rule that names ``$SYS``.

This module is in the broker room: it imports nothing from ``meshmq``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
import os
import re
import secrets
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field

from broker.settings import AuthSettings

__all__ = [
    "CONNACK_OK", "BAD_USERNAME_OR_PASSWORD", "NOT_AUTHORIZED",
    "AuthFileError", "AclRule", "AclRules", "Authenticator",
    "hash_password", "verify_password", "load_passwords", "load_acl", "parse_acl",
    "write_password", "delete_user", "topic_matches", "filter_covers",
]

log = logging.getLogger("broker.auth")

# MQTT v5 CONNACK reason codes (v3.1.1 maps 0x86 -> 4, 0x87 -> 5).
CONNACK_OK = 0x00
BAD_USERNAME_OR_PASSWORD = 0x86
NOT_AUTHORIZED = 0x87

SCRYPT_N = 2**14
SCRYPT_R = 8
SCRYPT_P = 1
SALT_BYTES = 16
HASH_BYTES = 32
# Caps on parameters read from a file, so a crafted line cannot make one check take minutes or GBs.
_MAX_SCRYPT_N = 2**20
_MAX_SCRYPT_R = 32
_MAX_SCRYPT_P = 16
_MAX_PBKDF2_ITERATIONS = 10_000_000

_SCRYPT_RE = re.compile(
    r"^\$scrypt\$n=(\d+),r=(\d+),p=(\d+)\$([A-Za-z0-9+/=]+)\$([A-Za-z0-9+/=]+)$")
_MOSQ7_RE = re.compile(r"^\$7\$(\d+)\$([A-Za-z0-9+/=]+)\$([A-Za-z0-9+/=]+)$")

# Bound on the per-(username, client_id, topic) decision caches; oldest entries go first.
DECISION_CACHE_SIZE = 65_536
# Topics longer than this are decided without caching: a client publishing to many distinct
# 64 KiB topic names must not turn the cache into gigabytes.
CACHE_MAX_TOPIC_LENGTH = 512


class AuthFileError(ValueError):
    """A password or ACL file cannot be used. ``str()`` is one line with path and line number."""

    def __init__(self, path: str, detail: str, line: int | None = None) -> None:
        self.path = path
        self.detail = detail
        self.line = line
        self.where = f"{path}:{line}" if line is not None else path
        super().__init__(f"{self.where}: {detail}")


# --------------------------------------------------------------------------------------------
# Password hashes


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text, validate=True)


def hash_password(password: str) -> str:
    """Return ``$scrypt$n=16384,r=8,p=1$<salt>$<hash>`` for ``password`` with a fresh salt."""
    salt = secrets.token_bytes(SALT_BYTES)
    digest = _scrypt(password.encode("utf-8"), salt, SCRYPT_N, SCRYPT_R, SCRYPT_P, HASH_BYTES)
    return f"$scrypt$n={SCRYPT_N},r={SCRYPT_R},p={SCRYPT_P}${_b64(salt)}${_b64(digest)}"


def _scrypt(password: bytes, salt: bytes, n: int, r: int, p: int, dklen: int) -> bytes:
    # OpenSSL's default maxmem (32 MiB) is just above n=2**14, r=8; allow what the params need.
    return hashlib.scrypt(password, salt=salt, n=n, r=r, p=p, dklen=dklen,
                          maxmem=128 * r * (n + p + 2) + 1024 * 1024)


@dataclass(frozen=True, slots=True)
class _Hash:
    """A parsed hash line; ``check`` is the slow part and runs off the event loop."""

    scheme: str  # "scrypt" or "pbkdf2-sha512" (Mosquitto $7$)
    salt: bytes
    digest: bytes
    n: int = 0
    r: int = 0
    p: int = 0
    iterations: int = 0

    def compute(self, password: bytes) -> bytes:
        if self.scheme == "scrypt":
            return _scrypt(password, self.salt, self.n, self.r, self.p, len(self.digest))
        return hashlib.pbkdf2_hmac("sha512", password, self.salt, self.iterations,
                                   len(self.digest))

    def check(self, password: bytes) -> bool:
        return hmac.compare_digest(self.compute(password), self.digest)


def _parse_hash(text: str) -> _Hash:
    """Parse one stored hash or raise ``ValueError`` saying what is accepted."""
    m = _SCRYPT_RE.match(text)
    if m:
        n, r, p = int(m.group(1)), int(m.group(2)), int(m.group(3))
        if n < 2 or n & (n - 1) or n > _MAX_SCRYPT_N or not 1 <= r <= _MAX_SCRYPT_R \
                or not 1 <= p <= _MAX_SCRYPT_P:
            raise ValueError(f"scrypt parameters out of range (n a power of 2 <= {_MAX_SCRYPT_N},"
                             f" r <= {_MAX_SCRYPT_R}, p <= {_MAX_SCRYPT_P})")
        try:
            salt, digest = _unb64(m.group(4)), _unb64(m.group(5))
        except binascii.Error:
            raise ValueError("bad base64 in salt or hash") from None
        if not salt or len(digest) < 16:
            raise ValueError("salt or hash too short")
        return _Hash("scrypt", salt, digest, n=n, r=r, p=p)
    m = _MOSQ7_RE.match(text)
    if m:
        iterations = int(m.group(1))
        if not 1 <= iterations <= _MAX_PBKDF2_ITERATIONS:
            raise ValueError("PBKDF2 iteration count out of range")
        try:
            salt, digest = _unb64(m.group(2)), _unb64(m.group(3))
        except binascii.Error:
            raise ValueError("bad base64 in salt or hash") from None
        if not salt or len(digest) < 16:
            raise ValueError("salt or hash too short")
        return _Hash("pbkdf2-sha512", salt, digest, iterations=iterations)
    raise ValueError("expected user:$scrypt$n=...,r=...,p=...$<salt>$<hash> "
                     "(or a Mosquitto $7$ hash); write lines with `meshmq passwd`")


def verify_password(stored: str, password: str | bytes) -> bool:
    """Check ``password`` against one stored hash string (constant-time compare)."""
    pw = password.encode("utf-8") if isinstance(password, str) else password
    return _parse_hash(stored).check(pw)


def _check_username(user: str) -> None:
    if not user or ":" in user or any(ord(c) < 32 or ord(c) == 127 for c in user):
        raise ValueError("username must be non-empty, without ':' or control characters")
    if user != user.strip() or user.startswith("#"):
        raise ValueError("username must not start with '#' or have surrounding spaces")


def load_passwords(path: str, warn: bool = True) -> dict[str, _Hash]:
    """Parse a password file into ``{username: hash}``; raise ``AuthFileError`` with the line."""
    try:
        with open(path, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        detail = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise AuthFileError(path, f"cannot read password file: {detail}") from None
    users: dict[str, _Hash] = {}
    legacy = 0
    for no, line in enumerate(lines, 1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        user, sep, stored = text.partition(":")
        if not sep or not user:
            raise AuthFileError(path, "expected user:hash", no)
        if user in users:
            raise AuthFileError(path, f"user {user!r} appears twice", no)
        try:
            users[user] = _parse_hash(stored)
        except ValueError as exc:
            raise AuthFileError(path, str(exc), no) from None
        legacy += users[user].scheme != "scrypt"
    if legacy and warn:  # config validation reads it first, before logging is set up
        log.warning("password file has Mosquitto $7$ hashes; re-hash them with `meshmq passwd`",
                    extra={"path": path, "users": legacy})
    return users


def _edit_password_file(path: str, user: str, new_line: str | None) -> bool:
    """Replace (or drop, when ``new_line`` is None) ``user``'s line, atomically.

    Writes a temporary file next to ``path`` and renames it over, so a crash never leaves a
    half-written file that would lock everybody out. A new file gets mode 0600 (hashes are
    secrets); an existing file keeps its mode. Returns whether the user was present.
    """
    try:
        with open(path, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
        mode = os.stat(path).st_mode & 0o777
    except FileNotFoundError:
        lines, mode = [], 0o600
    found = False
    out: list[str] = []
    for line in lines:
        if line.strip().partition(":")[0] == user and not line.strip().startswith("#"):
            found = True
            if new_line is not None:
                out.append(new_line)
                new_line = None
            continue
        out.append(line)
    if new_line is not None:
        out.append(new_line)
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".meshmq-passwd-", dir=directory)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write("".join(f"{line}\n" for line in out))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return found


def write_password(path: str, user: str, password: str) -> None:
    """Add or replace ``user`` in the password file at ``path`` (created with mode 0600)."""
    _check_username(user)
    if not password:
        raise ValueError("password must not be empty")
    if "\n" in password or "\r" in password:
        raise ValueError("password must not contain a line break")
    _edit_password_file(path, user, f"{user}:{hash_password(password)}")


def delete_user(path: str, user: str) -> None:
    """Remove ``user`` from the password file; ``KeyError`` if absent (so typos are noticed)."""
    if not os.path.exists(path):
        raise FileNotFoundError(path)
    if not _edit_password_file(path, user, None):
        raise KeyError(user)


# --------------------------------------------------------------------------------------------
# Topic matching


def topic_matches(rule: str, topic: str) -> bool:
    """Whether topic name ``topic`` matches filter ``rule`` (``+``/``#`` semantics, ``$`` rule)."""
    return filter_covers(rule, topic)


def filter_covers(rule: str, sub_filter: str) -> bool:
    """Whether every topic matching ``sub_filter`` also matches ``rule``.

    For a plain topic name this is ordinary matching. ``#`` in the rule covers the rest
    (including the parent level: ``a/#`` covers ``a``); ``+`` in the rule covers any single level
    including ``+`` in the filter; a ``#`` or ``+`` in the filter needs the same or a wider
    wildcard in the rule. A first-level wildcard never covers a ``$`` topic (MQTT-4.7.2-1).
    """
    r = rule.split("/")
    f = sub_filter.split("/")
    if f[0].startswith("$") and r[0] in ("+", "#"):
        return False
    i = 0
    while True:
        if i < len(r) and r[i] == "#":
            return True
        if i >= len(r) or i >= len(f):
            return i >= len(r) and i >= len(f)
        rp, fp = r[i], f[i]
        if fp == "#":
            return False  # the rule is not '#' here (checked above)
        if rp == "+":
            pass
        elif fp == "+" or rp != fp:
            return False
        i += 1


# --------------------------------------------------------------------------------------------
# ACL rules

READ = 1
WRITE = 2
_ACCESS = {"read": READ, "write": WRITE, "readwrite": READ | WRITE, "deny": 0}


@dataclass(frozen=True, slots=True)
class AclRule:
    """One ``topic``/``pattern`` line. ``access`` is READ|WRITE bits, or 0 for deny."""

    topic: str
    access: int
    line: int = 0

    @property
    def deny(self) -> bool:
        return self.access == 0


@dataclass(slots=True)
class AclRules:
    """A parsed ACL file: anonymous rules, per-user, per-client, and patterns for everyone."""

    anonymous: list[AclRule] = field(default_factory=list)
    users: dict[str, list[AclRule]] = field(default_factory=dict)
    clients: dict[str, list[AclRule]] = field(default_factory=dict)
    patterns: list[AclRule] = field(default_factory=list)

    def rules_for(self, username: str | None, client_id: str) -> list[AclRule]:
        """Every rule that applies to this client, patterns already substituted."""
        rules: list[AclRule] = []
        if username is None:
            rules.extend(self.anonymous)
        else:
            rules.extend(self.users.get(username, ()))
        rules.extend(self.clients.get(client_id, ()))
        for pat in self.patterns:
            topic = pat.topic
            if "%u" in topic:
                if username is None or not _safe_substitute(username):
                    continue
                topic = topic.replace("%u", username)
            if "%c" in topic:
                if not _safe_substitute(client_id):
                    continue
                topic = topic.replace("%c", client_id)
            rules.append(AclRule(topic, pat.access, pat.line))
        return rules


def _safe_substitute(value: str) -> bool:
    return bool(value) and not any(c in value for c in "+#/")


def _valid_filter(topic: str) -> bool:
    if not topic or "\x00" in topic:
        return False
    levels = topic.split("/")
    for i, level in enumerate(levels):
        if "#" in level and (level != "#" or i != len(levels) - 1):
            return False
        if "+" in level and level != "+":
            return False
    return True


def parse_acl(text: str, path: str = "<acl>") -> AclRules:
    """Parse Mosquitto-format ACL text (plus ``client`` sections); ``AuthFileError`` on errors."""
    rules = AclRules()
    current: list[AclRule] = rules.anonymous
    for no, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        word, _, rest = stripped.partition(" ")
        rest = rest.strip()
        if word in ("user", "client"):
            if not rest:
                raise AuthFileError(path, f"`{word}` needs a name", no)
            table = rules.users if word == "user" else rules.clients
            current = table.setdefault(rest, [])
        elif word in ("topic", "pattern"):
            access_word, _, topic = rest.partition(" ")
            topic = topic.strip()
            if access_word in _ACCESS and topic:
                access = _ACCESS[access_word]
            elif not topic:
                access, topic = READ | WRITE, access_word
            else:
                raise AuthFileError(
                    path, f"unknown access {access_word!r}; allowed: read, write, readwrite, "
                    "deny (write `readwrite` before a topic containing spaces)", no)
            if not _valid_filter(topic):
                raise AuthFileError(path, f"invalid topic filter {topic!r}", no)
            rule = AclRule(topic, access, no)
            if word == "pattern":
                rules.patterns.append(rule)
            else:
                current.append(rule)
        else:
            raise AuthFileError(path, f"unknown directive {word!r}; allowed: user, client, "
                                "topic, pattern", no)
    return rules


def load_acl(path: str) -> AclRules:
    """Read and parse an ACL file; ``AuthFileError`` names the path and line on problems."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        detail = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise AuthFileError(path, f"cannot read ACL file: {detail}") from None
    return parse_acl(text, path)


def _decide_topic(rules: Iterable[AclRule], topic: str, need: int) -> bool:
    granted = False
    for rule in rules:
        if rule.deny:
            if filter_covers(rule.topic, topic):
                return False
        elif not granted and rule.access & need and filter_covers(rule.topic, topic):
            granted = True
    return granted


# --------------------------------------------------------------------------------------------
# Authenticator


class Authenticator:
    """Answers "may this client connect / publish / subscribe / receive this?".

    The publish and delivery checks are on the broker's hot path, so their decisions are cached
    per ``(username, client_id, topic)`` in bounded dicts (oldest evicted first) that ``reload``
    clears. The caches are only touched from the event-loop thread; ``authenticate`` runs in an
    executor thread and only reads the password table, which ``reload`` replaces whole.
    """

    def __init__(self, settings: AuthSettings) -> None:
        self._settings = settings
        self._passwords: dict[str, _Hash] | None = None
        self._acl: AclRules | None = None
        self._publish_cache: dict[tuple[str | None, str, str], bool] = {}
        self._deliver_cache: dict[tuple[str | None, str, str], bool] = {}
        # Unknown users still pay for one hash, so response time does not reveal who exists.
        self._dummy = _parse_hash(
            f"$scrypt$n={SCRYPT_N},r={SCRYPT_R},p={SCRYPT_P}${_b64(bytes(SALT_BYTES))}"
            f"${_b64(bytes(HASH_BYTES))}")
        self._passwords, self._acl = self._load(settings)

    @staticmethod
    def _load(settings: AuthSettings) -> tuple[dict[str, _Hash] | None, AclRules | None]:
        passwords = load_passwords(settings.password_file) if settings.password_file else None
        acl = load_acl(settings.acl_file) if settings.acl_file else None
        return passwords, acl

    @property
    def settings(self) -> AuthSettings:
        return self._settings

    @property
    def uses_passwords(self) -> bool:
        """True when ``authenticate`` hashes (the broker should then call it in an executor)."""
        return self._passwords is not None

    @property
    def acl_enabled(self) -> bool:
        """False means every topic check is True; the broker may skip calling them."""
        return self._acl is not None

    def reload(self, settings: AuthSettings | None = None) -> bool:
        """Re-read the password and ACL files (SIGHUP); optionally switch to new settings.

        If a file is missing or broken, the old rules stay in force and the error is logged:
        a typo while editing the ACL must not lock everyone out of a running broker, nor open it.
        Returns whether the new rules were applied.
        """
        new_settings = settings or self._settings
        try:
            passwords, acl = self._load(new_settings)
        except AuthFileError as exc:
            log.error("auth reload failed; keeping the previous rules: %s", exc,
                      extra={"path": exc.path, "line": exc.line})
            return False
        self._settings = new_settings
        self._passwords, self._acl = passwords, acl
        self._publish_cache.clear()
        self._deliver_cache.clear()
        log.info("auth rules reloaded", extra={
            "users": len(passwords) if passwords is not None else None,
            "acl": new_settings.acl_file})
        return True

    def authenticate(self, username: str | None, password: bytes | None) -> int:
        """Return a v5 CONNACK reason code: 0 ok, 0x86 bad user/password, 0x87 not authorized.

        ``username=None`` is an anonymous client: allowed only with ``allow_anonymous``. With no
        password file a username is accepted as given (an identity for ACL ``%u``), as in
        Mosquitto. Slow (~50 ms, scrypt) when a password file is used: call it in an executor.
        """
        passwords = self._passwords
        if username is None:
            return CONNACK_OK if self._settings.allow_anonymous else NOT_AUTHORIZED
        if passwords is None:
            return CONNACK_OK if self._settings.allow_anonymous else NOT_AUTHORIZED
        stored = passwords.get(username)
        if stored is None or password is None:
            self._dummy.check(password or b"")
            return BAD_USERNAME_OR_PASSWORD
        return CONNACK_OK if stored.check(password) else BAD_USERNAME_OR_PASSWORD

    def can_publish(self, username: str | None, client_id: str, topic: str) -> bool:
        """Whether this client may PUBLISH to ``topic`` (needs ``write``; ``deny`` wins)."""
        acl = self._acl
        if acl is None:
            return True
        return self._cached(self._publish_cache, acl, username, client_id, topic, WRITE)

    def can_deliver(self, username: str | None, client_id: str, topic: str) -> bool:
        """Whether a message on ``topic`` may be delivered to this client (``read``).

        Needed per message only because a SUBSCRIBE to ``a/#`` is allowed while ``a/secret`` is
        denied; skip it when ``acl_enabled`` is False.
        """
        acl = self._acl
        if acl is None:
            return True
        return self._cached(self._deliver_cache, acl, username, client_id, topic, READ)

    def can_subscribe(self, username: str | None, client_id: str, topic_filter: str) -> bool:
        """Whether SUBSCRIBE to ``topic_filter`` is allowed: a ``read`` rule covers the filter
        and no ``deny`` rule does. Shared subscriptions are checked on their topic filter part.
        """
        acl = self._acl
        if acl is None:
            return True
        topic_filter = _strip_share(topic_filter)
        return _decide_topic(acl.rules_for(username, client_id), topic_filter, READ)

    @staticmethod
    def _cached(cache: dict[tuple[str | None, str, str], bool], acl: AclRules,
                username: str | None, client_id: str, topic: str, need: int) -> bool:
        if len(topic) > CACHE_MAX_TOPIC_LENGTH:
            return _decide_topic(acl.rules_for(username, client_id), topic, need)
        key = (username, client_id, topic)
        decision = cache.get(key)
        if decision is None:
            decision = _decide_topic(acl.rules_for(username, client_id), topic, need)
            if len(cache) >= DECISION_CACHE_SIZE:
                del cache[next(iter(cache))]
            cache[key] = decision
        return decision


def _strip_share(topic_filter: str) -> str:
    """``$share/group/a/b`` -> ``a/b``: the ACL is about the topics, not the group name."""
    if topic_filter.startswith("$share/"):
        parts = topic_filter.split("/", 2)
        if len(parts) == 3:
            return parts[2]
    return topic_filter
