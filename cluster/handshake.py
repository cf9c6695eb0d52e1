"""The link handshake as two sans-I/O state machines: frames in, frames out, a verdict.

Dialer (the lower router id)                 Acceptor
  HELLO(version, cluster, id, nonce, inc)  ->
                                           <-  CHALLENGE(same fields, HMAC proof of the secret)
  AUTH(HMAC proof, last seq I processed
       from your incarnation)              ->
                                           <-  READY(last seq I processed from yours)

Every check names the side that is misconfigured, because the operator reads only one side's
log at a time: "peer b/0 uses cluster name 'x', this router 'y'" says which config to fix.
Nothing of a link is used (no routes, no entries) before both proofs checked out, so a router
with a wrong secret never learns or sends a single route (NATS checks CONNECT before any RS+).
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Callable
from dataclasses import dataclass

from cluster import frames
from cluster.frames import Hello
from cluster.settings import router_sort_key


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


ResumePoint = Callable[[str, bytes], int]  # (peer id, peer incarnation) -> last seq processed


class _Side:
    def __init__(self, cluster: str, me: str, secret: bytes, incarnation: bytes,
                 known: set[str], resume_point: ResumePoint) -> None:
        self.me = Hello(frames.VERSION, cluster, me, os.urandom(16), incarnation)
        self.secret = secret
        self.known = known
        self.resume_point = resume_point

    def _check_peer(self, peer: Hello) -> None:
        me = self.me
        if peer.version != me.version:
            raise HandshakeRefused(
                f"peer {peer.router!r} speaks mesh protocol {peer.version}, this router "
                f"{me.version}: run the same meshmq version on every node")
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
        return frames.encode_hello(self.me)

    def on_frame(self, ftype: int, body: bytes) -> tuple[bytes, Established | None]:
        if ftype == frames.REFUSE:
            raise HandshakeRefused(f"peer {self.expected!r} refused the link: "
                                   f"{body.decode(errors='replace')}", "")
        if ftype == frames.CHALLENGE:
            peer, mac = frames.decode_hello(body)
            self._check_peer(peer)
            if peer.router != self.expected:
                raise HandshakeRefused(
                    f"dialled {self.expected!r} but {peer.router!r} answered: the address of "
                    f"{self.expected!r} in [[cluster.nodes]] is wrong on this node")
            want = frames.proof(self.secret, b"acceptor", self.me, peer.nonce, peer.router)
            if not hmac.compare_digest(mac, want):
                raise HandshakeRefused(
                    f"peer {peer.router!r} proved a different cluster secret: cluster.secret "
                    f"(or secret_file) differs between this node and {peer.router!r}",
                    f"router {self.me.router!r} rejects your proof: cluster.secret differs")
            self._peer = peer
            mine = frames.proof(self.secret, b"dialer", self.me, peer.nonce, peer.router)
            resume = self.resume_point(peer.router, peer.incarnation)
            return frames.encode_auth(mine, resume), None
        if ftype == frames.READY:
            peer = getattr(self, "_peer", None)
            if peer is None:
                raise HandshakeRefused("peer sent READY before CHALLENGE")
            return b"", Established(peer.router, peer.incarnation, frames.decode_seq(body))
        raise HandshakeRefused(f"unexpected {frames.FRAME_NAMES.get(ftype, ftype)} frame "
                               f"during the handshake")


class AcceptorHandshake(_Side):
    """The higher id's side: it accepted a connection from some router, not yet known."""

    _peer: Hello | None = None

    def on_frame(self, ftype: int, body: bytes) -> tuple[bytes, Established | None]:
        if ftype == frames.HELLO and self._peer is None:
            peer, _ = frames.decode_hello(body)
            self._check_peer(peer)
            if router_sort_key(peer.router) > router_sort_key(self.me.router):
                raise HandshakeRefused(
                    f"{peer.router!r} dialled {self.me.router!r}, but the lower id dials: the "
                    f"two nodes' [[cluster.nodes]] lists differ")
            self._peer = peer
            mac = frames.proof(self.secret, b"acceptor", peer, self.me.nonce, self.me.router)
            return frames.encode_hello(self.me, frames.CHALLENGE, mac), None
        if ftype == frames.AUTH and self._peer is not None:
            peer = self._peer
            mac, resume = frames.decode_auth(body)
            want = frames.proof(self.secret, b"dialer", peer, self.me.nonce, self.me.router)
            if not hmac.compare_digest(mac, want):
                raise HandshakeRefused(
                    f"peer {peer.router!r} failed the secret check: cluster.secret (or "
                    f"secret_file) differs between this node and {peer.router!r}",
                    f"router {self.me.router!r} rejects your proof: cluster.secret differs")
            mine = self.resume_point(peer.router, peer.incarnation)
            return (frames.encode_seq(frames.READY, mine),
                    Established(peer.router, peer.incarnation, resume))
        if ftype == frames.REFUSE:
            raise HandshakeRefused(f"peer refused the link: {body.decode(errors='replace')}",
                                   "")
        raise HandshakeRefused(f"unexpected {frames.FRAME_NAMES.get(ftype, ftype)} frame "
                               f"during the handshake")
