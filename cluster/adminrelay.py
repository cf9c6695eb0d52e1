"""Admin requests relayed to the router that owns a device log (its fetch API has the log).

Split out of ``cluster/mesh.py`` (which keeps ``Mesh.relay`` and dispatches the ADMIN frames
here): an ADMIN_REQUEST frame carries an HTTP request over the mesh link to the owner, whose
admin API runs it (``Mesh.admin_executor``, set by the node wiring) and answers with an
ADMIN_RESPONSE on the same link, matched by the mesh's request registry (cluster/requests.py).
A link down or an answer too late gives 503/504, never a hang.
"""

from __future__ import annotations

import logging
from typing import Any

from cluster import frames

log = logging.getLogger("cluster.mesh")

_RELAY_MAX_RESPONSE = frames.MAX_FRAME - (1 << 20)  # room for the frame's head and headers


class AdminRelay:
    """The relay of one router's mesh (see the module docstring)."""

    def __init__(self, mesh: Any) -> None:
        self.mesh = mesh

    async def relay(self, owner: str, method: str, path: str, headers: list[tuple[str, str]],
                    body: bytes, timeout: float) -> tuple[int, str, list[tuple[str, str]], bytes]:
        """Run an admin request at ``owner`` (its fetch API has the log); (status, content
        type, headers, body). 503 when the link is down, 504 when no answer came in time."""
        link = self.mesh.links.get(owner)
        if link is None or link.state != "up" or link.conn is None:
            return 503, "text/plain", [], f"the owner router {owner} is unreachable".encode()
        fut = self.mesh.loop.create_future()

        def fail(why: str, timed_out: bool) -> None:
            if not fut.done():  # 504: no answer in time; 503: the link went down meanwhile
                fut.set_result((504 if timed_out else 503, "text/plain", [], why.encode()))

        req = self.mesh.requests.open((link,), timeout, fail,
                                      f"no answer from the owner router {owner}")
        req.done = fut
        link.conn.write(frames.encode_admin(frames.ADMIN_REQUEST, req.id, method, path,
                                            headers, body))
        try:
            return await fut
        finally:
            self.mesh.requests.drop(req)

    def on_frame(self, link: Any, ftype: int, body: bytes) -> None:
        req, first, second, headers, payload = frames.decode_admin(body)
        if ftype == frames.ADMIN_RESPONSE:
            pending = self.mesh.requests.answer(link, req)
            if pending is not None and not pending.done.done():
                pending.done.set_result((int(first), second, headers, payload))
            return
        if self.mesh.admin_executor is None:
            link.conn.write(frames.encode_admin(frames.ADMIN_RESPONSE, req, "503", "text/plain",
                                                [], b"no admin API on the owner"))
            return
        self.mesh.loop.create_task(self._execute(link, req, first, second, headers, payload))

    async def _execute(self, link: Any, req: int, method: str, path: str,
                       headers: list[tuple[str, str]], body: bytes) -> None:
        try:
            status, ctype, out_headers, out = await self.mesh.admin_executor(method, path, headers,
                                                                        body)
        except Exception as err:  # noqa: BLE001 - the asker gets a 502, this router goes on
            log.warning("relayed admin request failed: %s", err, extra={"path": path})
            status, ctype, out_headers, out = 502, "text/plain", [], str(err).encode()
        if len(out) > _RELAY_MAX_RESPONSE:
            # a frame over MAX_FRAME would be read as a broken peer and drop the link (for
            # every flow on it): the asker gets a clear error instead
            status, ctype, out_headers = 502, "text/plain", []
            out = (f"the answer ({len(out)} bytes) is larger than a mesh frame may carry "
                   f"({_RELAY_MAX_RESPONSE} bytes): ask for less (max_bytes), or ask the "
                   f"owner router {self.mesh.rid} directly").encode()
        if link.conn is not None:
            link.conn.write(frames.encode_admin(frames.ADMIN_RESPONSE, req, str(status), ctype,
                                                out_headers, out))
