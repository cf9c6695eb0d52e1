"""A raw mesh peer: a test plays one router of a cluster against a real ``meshmq serve``.

It dials the real router's mesh port, runs the handshake with the cluster secret (the project's
own sans-I/O ``DialerHandshake``, capped at the version the test picks), then sends and reads
frames byte for byte, as ``helpers/raw.py`` does for MQTT. It answers PINGs and pings back (the
real router closes a silent link after ``cluster.link_timeout``) and keeps every other frame for
the test; it acknowledges entries only with ``answer``.
"""

from __future__ import annotations

import os
import socket
import time

from cluster import frames
from cluster.handshake import DialerHandshake, Established


class MeshPeer:
    def __init__(self, port: int, cluster: str, me: str, peer: str, secret: bytes,
                 cap: int = frames.VERSION) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.reader = frames.FrameReader()
        self.frames: list[tuple[int, bytes]] = []
        self.next_seq = 1
        self.incarnation = os.urandom(16)
        self._last_ping = 0.0
        hs = DialerHandshake(cluster, me, secret, self.incarnation, {peer},
                             lambda _p, _i: 0, cap, peer=peer)
        self.sock.sendall(hs.start())
        est: Established | None = None
        deadline = time.monotonic() + 10
        while est is None:
            for ftype, body in self._recv(deadline):
                if est is not None:  # what the router sent right after READY (its routes)
                    self.frames.append((ftype, body))
                    continue
                out, est = hs.on_frame(ftype, body)
                if out:
                    self.sock.sendall(out)
        self.version = est.version

    def _recv(self, deadline: float) -> list[tuple[int, bytes]]:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("no frame from the router in time")
        self.sock.settimeout(min(left, 0.5))
        try:
            data = self.sock.recv(1 << 16)
        except TimeoutError:
            return []
        if not data:
            raise ConnectionError("the router closed the mesh connection")
        return self.reader.feed(data)

    def send_appends(self, appends: list[tuple[str, bytes, int]]) -> list[int]:
        """APPEND entries ``(device, payload, epoch)`` (the epoch is written at version 3
        only); returns their seqs."""
        parts, seqs = [], []
        for device, payload, epoch in appends:
            flags, tlen, body = frames.entry_body(frames.APPEND, f"devices/{device}/t",
                                                  payload, 1, False, None, None, device, -1,
                                                  None)
            seq = self.next_seq
            self.next_seq += 1
            if self.version >= frames.V_EPOCHS:
                parts.append(frames.entry_head_epoch(seq, frames.APPEND, flags, tlen, epoch))
            else:
                parts.append(frames.entry_head(seq, frames.APPEND, flags, tlen))
            parts.append(body)
            seqs.append(seq)
        self.sock.sendall(frames.encode_entries_parts(parts, len(appends)))
        return seqs

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def answer(self, entry: frames.Entry, status: int, why: str) -> None:
        """The RESULT of an APPEND the router sent, then the ACK up to it (as a real owner
        does: an APPEND acknowledged before its RESULT is sent again, to ask for it)."""
        self.sock.sendall(frames.encode_results([(entry.seq, status, -1, why)])
                          + frames.encode_seq(frames.ACK, entry.seq))

    def wait(self, want: int, timeout: float = 30.0) -> list[bytes]:
        """Bodies of frames of type ``want`` read until at least one came (in order)."""
        deadline = time.monotonic() + timeout
        while True:
            now = time.monotonic()
            if now - self._last_ping > 0.5:
                self.sock.sendall(frames.encode_ping(frames.PING, time.monotonic_ns()))
                self._last_ping = now
            for ftype, body in self._recv(deadline):
                if ftype == frames.PING:
                    self.sock.sendall(frames.encode_ping(frames.PONG, frames.decode_seq(body)))
                elif ftype != frames.PONG:
                    self.frames.append((ftype, body))
            got = [body for ftype, body in self.frames if ftype == want]
            if got:
                self.frames = [(t, b) for t, b in self.frames if t != want]
                return got

    def results(self, seqs: list[int], timeout: float = 30.0) -> dict[int, tuple]:
        """The RESULT ``(status, offset, why)`` of each of ``seqs``."""
        out: dict[int, tuple] = {}
        deadline = time.monotonic() + timeout
        while not set(seqs) <= set(out):
            for body in self.wait(frames.RESULTS, max(0.1, deadline - time.monotonic())):
                for seq, status, offset, why in frames.decode_results(body):
                    out[seq] = (status, offset, why)
        return out

    def appends(self, timeout: float = 30.0) -> list[frames.Entry]:
        """The next APPEND entries the router sent (at least one)."""
        deadline = time.monotonic() + timeout
        while True:
            got = [e for body in self.wait(frames.ENTRIES, deadline - time.monotonic())
                   for e in frames.decode_entries(body, self.version)
                   if e.kind == frames.APPEND]
            if got:
                return got

    def close(self) -> None:
        self.sock.close()
