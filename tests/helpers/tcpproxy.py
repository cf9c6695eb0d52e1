"""A TCP proxy a test controls, to cut and heal one mesh link between two live nodes."""

from __future__ import annotations

import select
import socket
import threading

from helpers.broker import free_port


class TcpProxy:
    """Forwards 127.0.0.1:port to a target. ``cut()`` closes every connection and refuses new
    ones (closed at accept) until ``heal()``: to both ends it is a network that dropped them.
    ``blackhole()`` first loses whatever is in flight."""

    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.port = free_port()
        self._lsock = socket.socket()
        self._lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._lsock.bind(("127.0.0.1", self.port))
        self._lsock.listen(16)
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._lock = threading.Lock()
        self._cut = False
        self._blackhole = False
        self._blackhole_back = False
        self._stop = False
        self.accepted = 0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def cut(self) -> None:
        with self._lock:
            self._cut = True
            pairs, self._pairs = self._pairs, []
        for a, b in pairs:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()

    def blackhole(self, back_only: bool = False) -> None:
        """Keep the connections open but drop every byte from now on, both ways (a network
        that silently loses packets: what was sent in this state never arrives). With
        ``back_only``, only what the target sends back to the dialler is lost (a one-way cut:
        the target still hears everything, its answers never arrive)."""
        if back_only:
            self._blackhole_back = True
        else:
            self._blackhole = True

    def heal(self) -> None:
        with self._lock:
            self._cut = False
            self._blackhole = False
            self._blackhole_back = False

    def close(self) -> None:
        self._stop = True
        self.cut()
        self._lsock.close()

    def _run(self) -> None:
        while not self._stop:
            with self._lock:
                socks = [self._lsock] + [s for pair in self._pairs for s in pair]
            try:
                readable, _, _ = select.select(socks, [], [], 0.05)
            except (OSError, ValueError):
                continue
            for s in readable:
                if s is self._lsock:
                    self._accept()
                else:
                    self._pump(s)

    def _accept(self) -> None:
        try:
            client, _ = self._lsock.accept()
        except OSError:
            return
        if self._cut:
            client.close()
            return
        try:
            upstream = socket.create_connection(self.target, timeout=2)
        except OSError:
            client.close()
            return
        self.accepted += 1
        with self._lock:
            self._pairs.append((client, upstream))

    def _pump(self, s: socket.socket) -> None:
        with self._lock:
            pair = next((p for p in self._pairs if s in p), None)
        if pair is None:
            return
        other = pair[1] if s is pair[0] else pair[0]
        try:
            data = s.recv(65536)
            if data:
                lost = self._blackhole or (self._blackhole_back and s is pair[1])
                if not lost:
                    other.sendall(data)
                return
        except OSError:
            pass
        with self._lock:
            if pair in self._pairs:
                self._pairs.remove(pair)
        for x in pair:
            x.close()
