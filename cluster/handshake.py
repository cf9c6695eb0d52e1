"""The link handshake as two sans-I/O state machines: frames in, frames out, a verdict.

Dialer (the lower router id)                 Acceptor
  HELLO(lowest version, cluster, id, nonce,
        inc[, highest version])            ->
                                           <-  CHALLENGE(chosen version, cluster, id, nonce,
                                                         inc, HMAC proof of the secret)
  AUTH(HMAC proof, last seq I processed
       from your incarnation)              ->
                                           <-  READY(last seq I processed from yours)

Every check names the side that is misconfigured, because the operator reads only one side's
log at a time: "peer b/0 uses cluster name 'x', this router 'y'" says which config to fix.
Nothing of a link is used (no routes, no entries) before both proofs checked out, so a router
with a wrong secret never learns or sends a single route (NATS checks CONNECT before any RS+).

Version negotiation: the acceptor chooses the highest version both routers speak (each capped
by its ``cluster.protocol_version``) and says it in the CHALLENGE; the dialer checks it is one
it speaks. A version-2 build checks only "HELLO version == 2" and ignores the HELLO's tail, so
the bytes are arranged for it: cluster/frames.py's docstring gives the rule. No common version:
both sides refuse, naming both ranges and the key that caps them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass

from cluster import frames
from cluster.settings import router_sort_key

# -- the handshake's frames (HELLO, CHALLENGE, AUTH; READY is a seq frame) -------------------
_U16 = struct.Struct(">H")
_U64 = struct.Struct(">Q")


def _s(text: str) -> bytes:
    raw = text.encode()
    return _U16.pack(len(raw)) + raw


def _read_s(body: bytes, p: int) -> tuple[str, int]:
    (n,) = _U16.unpack_from(body, p)
    p += 2
    if p + n > len(body):
        raise frames.FrameError("string runs past the frame")
    return body[p:p + n].decode(), p + n


@dataclass(frozen=True)
class Hello:
    """HELLO: ``version`` is the lowest version the sender speaks and ``top`` the highest
    (0: the same); CHALLENGE: ``version`` is the one the acceptor chose (``top`` unused)."""

    version: int
    cluster: str
    router: str
    nonce: bytes
    incarnation: bytes
    top: int = 0

    @property
    def highest(self) -> int:
        return self.top or self.version


def encode_hello(h: Hello, ftype: int = frames.HELLO, proof: bytes = b"") -> bytes:
    """A HELLO carries ``top`` after the incarnation only when it is above ``version`` (a
    router speaking only 2 sends exactly a version-2 HELLO); a CHALLENGE never does (the proof
    follows the incarnation there, as version 2 reads it)."""
    tail = _U16.pack(h.top) if ftype == frames.HELLO and h.top > h.version else proof
    return frames.frame(ftype, _U16.pack(h.version) + _s(h.cluster) + _s(h.router) + h.nonce
                        + h.incarnation + tail)


def decode_hello_frame(body: bytes) -> Hello:
    """A HELLO, with its highest version when it says one (what follows is ignored: a HELLO
    may grow at its end, as version 2 let it)."""
    hello, rest = decode_hello(body)
    if len(rest) >= 2:
        (top,) = _U16.unpack_from(rest, 0)
        if top > hello.version:
            return dataclasses.replace(hello, top=top)
    return hello


def decode_hello(body: bytes) -> tuple[Hello, bytes]:
    """HELLO or CHALLENGE: (fields, the proof that follows them in a CHALLENGE)."""
    try:
        (version,) = _U16.unpack_from(body, 0)
        cluster, p = _read_s(body, 2)
        router, p = _read_s(body, p)
    except (struct.error, UnicodeDecodeError) as err:
        raise frames.FrameError(f"bad hello: {err}") from None
    if p + 32 > len(body):
        raise frames.FrameError("bad hello: short nonce")
    return Hello(version, cluster, router, body[p:p + 16], body[p + 16:p + 32]), body[p + 32:]


def proof(secret: bytes, role: bytes, dialer: Hello, acceptor_nonce: bytes,
          acceptor_router: str, chosen: int = frames.MIN_VERSION) -> bytes:
    """HMAC-SHA256 over both nonces and both ids: each side proves it holds the secret without
    sending it, and a proof cannot be replayed on another link or another handshake. From
    version 3 it covers the negotiation too (the dialer's range and the acceptor's choice); at
    2 it is the version-2 proof, unchanged."""
    parts = [role, dialer.cluster.encode(), dialer.router.encode(), acceptor_router.encode(),
             dialer.nonce, acceptor_nonce]
    if chosen >= frames.V_EPOCHS:
        parts.append(b"v%d-%d-%d" % (dialer.version, dialer.highest, chosen))
    return hmac.new(secret, b"|".join(parts), hashlib.sha256).digest()


def encode_auth(mac: bytes, last_seq: int) -> bytes:
    return frames.frame(frames.AUTH, mac + _U64.pack(last_seq))


def decode_auth(body: bytes) -> tuple[bytes, int]:
    if len(body) != 40:
        raise frames.FrameError("bad auth frame")
    return body[:32], _U64.unpack_from(body, 32)[0]


class HandshakeRefused(Exception):
    """The handshake failed: ``why`` goes to the log of this side and, in a REFUSE, the peer's."""

    def __init__(self, why: str, tell_peer: str | None = None) -> None:
        super().__init__(why)
        self.why = why
        self.tell_peer = tell_peer if tell_peer is not None else why


@dataclass(frozen=True)
class Established:
    peer: str
    peer_incarnation: bytes
    resume_from: int  # the peer processed our entries up to this seq; resend what is above
    version: int = frames.MIN_VERSION  # the negotiated mesh protocol version of this connection


ResumePoint = Callable[[str, bytes], int]  # (peer id, peer incarnation) -> last seq processed


def _versions(low: int, high: int) -> str:
    return f"{low}" if low == high else f"{low}-{high}"


class _Side:
    def __init__(self, cluster: str, me: str, secret: bytes, incarnation: bytes,
                 known: set[str], resume_point: ResumePoint,
                 cap: int = frames.VERSION) -> None:
        # the leading version field is the lowest we speak; ``top`` the highest (the cap)
        top = max(frames.MIN_VERSION, min(cap, frames.VERSION))
        self.me = Hello(frames.MIN_VERSION, cluster, me, os.urandom(16), incarnation,
                        top if top > frames.MIN_VERSION else 0)
        self.secret = secret
        self.known = known
        self.resume_point = resume_point

    def _no_common_version(self, router: str, peer_low: int,
                           peer_high: int) -> HandshakeRefused:
        me = self.me
        return HandshakeRefused(
            f"peer {router!r} speaks mesh protocol "
            f"{_versions(peer_low, peer_high)}, this router {_versions(me.version, me.highest)} "
            f"(cluster.protocol_version caps it): no common version; upgrade the older node, "
            f"or set cluster.protocol_version to a version both speak")

    def _check_peer(self, peer: Hello) -> None:
        me = self.me
        if peer.cluster != me.cluster:
            raise HandshakeRefused(
                f"peer {peer.router!r} is in cluster {peer.cluster!r}, this router in "
                f"{me.cluster!r}: cluster.name differs between the two nodes' configs")
        if peer.router == me.router:
            raise HandshakeRefused(f"a second router claims id {me.router!r}: two nodes share "
                                   f"node.id, or [[cluster.nodes]] gives two nodes one address")
        if peer.router not in self.known:
            raise HandshakeRefused(
                f"router id {peer.router!r} is not in this node's [[cluster.nodes]] list "
                f"(routers {sorted(self.known)}): add its node or fix its node id",
                f"router id {peer.router!r} is unknown to {me.router!r}: the two nodes' "
                f"[[cluster.nodes]] lists differ")


class DialerHandshake(_Side):
    """The lower id's side: it connected, it speaks first."""

    def __init__(self, *args: object, peer: str, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.expected = peer

    def start(self) -> bytes:
        return encode_hello(self.me)

    def on_frame(self, ftype: int, body: bytes) -> tuple[bytes, Established | None]:
        if ftype == frames.REFUSE:
            raise HandshakeRefused(f"peer {self.expected!r} refused the link: "
                                   f"{body.decode(errors='replace')}", "")
        if ftype == frames.CHALLENGE:
            peer, mac = decode_hello(body)
            self._check_peer(peer)
            chosen = peer.version  # the acceptor's choice: one we speak, or no link
            if not self.me.version <= chosen <= self.me.highest:
                raise self._no_common_version(peer.router, chosen, chosen)
            if peer.router != self.expected:
                raise HandshakeRefused(
                    f"dialled {self.expected!r} but {peer.router!r} answered: the address of "
                    f"{self.expected!r} in [[cluster.nodes]] is wrong on this node")
            want = proof(self.secret, b"acceptor", self.me, peer.nonce, peer.router,
                                chosen)
            if not hmac.compare_digest(mac, want):
                raise HandshakeRefused(
                    f"peer {peer.router!r} proved a different cluster secret: cluster.secret "
                    f"(or secret_file) differs between this node and {peer.router!r}",
                    f"router {self.me.router!r} rejects your proof: cluster.secret differs")
            self._peer = peer
            mine = proof(self.secret, b"dialer", self.me, peer.nonce, peer.router, chosen)
            resume = self.resume_point(peer.router, peer.incarnation)
            return encode_auth(mine, resume), None
        if ftype == frames.READY:
            peer = getattr(self, "_peer", None)
            if peer is None:
                raise HandshakeRefused("peer sent READY before CHALLENGE")
            return b"", Established(peer.router, peer.incarnation, frames.decode_seq(body),
                                    peer.version)
        raise HandshakeRefused(f"unexpected {frames.FRAME_NAMES.get(ftype, ftype)} frame "
                               f"during the handshake")


class AcceptorHandshake(_Side):
    """The higher id's side: it accepted a connection from some router, not yet known."""

    _peer: Hello | None = None
    chosen = frames.MIN_VERSION

    def on_frame(self, ftype: int, body: bytes) -> tuple[bytes, Established | None]:
        if ftype == frames.HELLO and self._peer is None:
            peer = decode_hello_frame(body)
            self._check_peer(peer)
            # the highest version both speak; a dialer that said no highest (a version-2
            # build) gets 2, so its CHALLENGE is byte for byte the one it knows
            chosen = min(peer.highest, self.me.highest)
            if chosen < max(peer.version, self.me.version):
                raise self._no_common_version(peer.router, peer.version, peer.highest)
            self.chosen = chosen
            if router_sort_key(peer.router) > router_sort_key(self.me.router):
                raise HandshakeRefused(
                    f"{peer.router!r} dialled {self.me.router!r}, but the lower id dials: the "
                    f"two nodes' [[cluster.nodes]] lists differ")
            self._peer = peer
            mac = proof(self.secret, b"acceptor", peer, self.me.nonce, self.me.router,
                               chosen)
            challenge = dataclasses.replace(self.me, version=chosen, top=0)
            return encode_hello(challenge, frames.CHALLENGE, mac), None
        if ftype == frames.AUTH and self._peer is not None:
            peer = self._peer
            mac, resume = decode_auth(body)
            want = proof(self.secret, b"dialer", peer, self.me.nonce, self.me.router,
                                self.chosen)
            if not hmac.compare_digest(mac, want):
                raise HandshakeRefused(
                    f"peer {peer.router!r} failed the secret check: cluster.secret (or "
                    f"secret_file) differs between this node and {peer.router!r}",
                    f"router {self.me.router!r} rejects your proof: cluster.secret differs")
            mine = self.resume_point(peer.router, peer.incarnation)
            return (frames.encode_seq(frames.READY, mine),
                    Established(peer.router, peer.incarnation, resume, self.chosen))
        if ftype == frames.REFUSE:
            raise HandshakeRefused(f"peer refused the link: {body.decode(errors='replace')}",
                                   "")
        raise HandshakeRefused(f"unexpected {frames.FRAME_NAMES.get(ftype, ftype)} frame "
                               f"during the handshake")
