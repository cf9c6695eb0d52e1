"""Session claims across routers: a client connecting here takes its session from whichever
router holds it ([MQTT-3.1.4-3]: the old connection is closed, the session handed over, or
ended for a clean start).

Split out of ``cluster/mesh.py`` (which keeps ``Mesh.claim``, the broker's seam, and
dispatches the CLAIM/CLAIMED frames here). A router that does not answer within
``_CLAIM_TIMEOUT`` keeps what it has and the client gets a new session, as with a partition
in EMQX; under Raft placement the session registry names the previous holder and only it is
asked (broker/registry.py).
"""

from __future__ import annotations

from typing import Any

from cluster import frames

_CLAIM_TIMEOUT = 2.0  # seconds a CONNECT waits for the other routers to release its session


class SessionClaims:
    """The claims of one router's mesh (see the module docstring)."""

    def __init__(self, mesh: Any) -> None:
        self.mesh = mesh

    def claim(self, client_id: str, clean: bool, done: Any, to: str | None = None,
              timeout: float | None = None) -> None:
        """A client connected here: every other router that holds its session closes the old
        connection [MQTT-3.1.4-3] and hands the session over (or ends it, for a clean start).
        ``done(state or None)`` once every reachable router answered, or after
        ``_CLAIM_TIMEOUT`` (a router that does not answer keeps what it has: the client gets
        a new session, as with a partition in EMQX). ``to``: ask only that router (the session
        registry named the previous holder, broker/registry.py), within ``timeout``."""
        links = [link for link in self.mesh.links.values()
                 if link.state == "up" and (to is None or link.peer == to)]
        if not links:
            self.mesh.loop.call_soon(done, None)
            return
        # unanswered in time, or a link down meanwhile: done with what the others handed over
        req = self.mesh.requests.open(links, _CLAIM_TIMEOUT if timeout is None else timeout,
                                      lambda _why, _late: done(req.value), "claim unanswered")
        req.done = done
        for link in links:
            link.conn.write(frames.encode_claim(req.id, client_id, clean))

    def on_frame(self, link: Any, ftype: int, body: bytes) -> None:
        if ftype == frames.CLAIM:
            req, client_id, clean = frames.decode_claim(body)
            state = self.mesh.router.sessions_remote.release_session(client_id, clean, link.peer)
            if link.conn is not None:
                link.conn.write(frames.encode_claimed(req, state))
            return
        req_id, state = frames.decode_claimed(body)
        req = self.mesh.requests.answer(link, req_id)
        if req is None:
            return  # answered after the timeout: the session it carried is lost (logged there)
        if state is not None and req.value is None:
            req.value = state
        if not req.waiting:  # every router answered
            self.mesh.answer(req.done, req.value)
