"""``GET /api/v1/lag``: the sessions furthest behind their device logs.

Kafka operators answer "who is behind, and by how much" with consumer-group lag tooling
(``kafka-consumer-groups --describe``, Burrow); a meshmq session that falls behind is fed from the
device logs (``broker/catchup.py``), so the same question has the same kind of answer. Metrics
carry only the totals (``meshmq_sessions_lagging``, ``meshmq_lag_messages``): a label per client
id would be unbounded cardinality. This endpoint lists the details, computed when asked.

Response (``application/json``), sessions sorted by total lag, largest first::

    {"sessions_lagging": 2, "lag_messages": 5120,
     "sessions": [{"client_id": "sub-1", "connected": true, "lag_messages": 5000,
                   "devices": [{"device": "d1", "next_offset": 120, "high_watermark": 5120,
                                "end": 5120, "lag_messages": 5000}, ...]}, ...]}

``high_watermark`` is the device log's high-water mark on this router (issue 26's names);
``end`` is its deprecated alias, kept for one release.

``?limit=N`` (1 to 1000, default 20) caps the sessions listed; ``?devices=M`` (1 to 1000,
default 20) caps the devices listed per session (the largest lags first).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

if TYPE_CHECKING:
    from broker.catchup import LogCatchUp


def _bounded(request: web.Request, name: str, default: int) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if not 1 <= value <= 1000:
        raise web.HTTPBadRequest(text=f'{{"error": "{name} must be an integer from 1 to 1000",'
                                      f' "parameter": "{name}"}}',
                                 content_type="application/json")
    return value


def register_lag_routes(app: web.Application, catchup: LogCatchUp) -> None:
    async def lag(request: web.Request) -> web.Response:
        limit = _bounded(request, "limit", 20)
        per_session = _bounded(request, "devices", 20)
        store = catchup.store
        rows = []
        for session in list(catchup.lagging):
            behind = catchup.lag_of(session)
            rows.append((sum(behind.values()), session, behind))
        rows.sort(key=lambda r: r[0], reverse=True)
        out = []
        for total, session, behind in rows[:limit]:
            devices = sorted(behind.items(), key=lambda kv: kv[1], reverse=True)[:per_session]
            out.append({
                "client_id": session.client_id,
                "connected": session.conn is not None,
                "lag_messages": total,
                "devices": [{"device": d, "next_offset": session.lag[d].next,
                             "high_watermark": (hw := store.high_watermark(d)),
                             "end": hw, "lag_messages": n}  # end: deprecated alias
                            for d, n in devices],
            })
        return web.json_response({"sessions_lagging": len(rows),
                                  "lag_messages": sum(r[0] for r in rows),
                                  "sessions": out})

    app.router.add_get("/api/v1/lag", lag)
