"""Process-wide logging set-up: readable text for people, JSON lines for log shippers.

Why: the broker rooms log with the standard ``logging`` module and attach facts as
``extra={"client_id": ..., "peer": ...}`` instead of formatting them into the message. The same
call then reads well in a terminal (``key=value`` after the message, logfmt style) and arrives as
separate fields in Loki/Elasticsearch (``--log-format json``, what the systemd unit uses). Time is
UTC with milliseconds and a ``Z`` so lines from several nodes sort together.

Everything goes to stderr: systemd and Docker collect it, and stdout stays free for commands
such as ``meshmq version``.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

__all__ = ["setup_logging", "TextFormatter", "JsonFormatter", "LEVELS", "FORMATS"]

LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}
FORMATS = ("text", "json")

# Attributes every LogRecord has; anything else on a record came from ``extra=``.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message", "asctime", "taskName",
}


def _timestamp(record: logging.LogRecord) -> str:
    seconds = int(record.created)
    millis = int((record.created - seconds) * 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{millis:03d}Z"


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")}


def _logfmt_value(value: object) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    if text == "" or any(c.isspace() or c in '"=' for c in text):
        return json.dumps(text, ensure_ascii=False)
    return text


class TextFormatter(logging.Formatter):
    """``2026-11-22T06:00:00.123Z INFO broker.router client connected client_id=abc ...``."""

    def format(self, record: logging.LogRecord) -> str:
        parts = [_timestamp(record), record.levelname, record.name, record.getMessage()]
        parts.extend(f"{k}={_logfmt_value(v)}" for k, v in _extras(record).items())
        line = " ".join(parts)
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        if record.stack_info:
            line += "\n" + self.formatStack(record.stack_info)
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts``, ``level``, ``logger``, ``msg`` and every extra field.

    The fixed keys win over an extra of the same name; a traceback goes in ``exc`` so the record
    stays on one line.
    """

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {"ts": _timestamp(record), "level": record.levelname.lower(),
                               "logger": record.name, "msg": record.getMessage()}
        for key, value in _extras(record).items():
            doc.setdefault(key, value)
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            doc["stack"] = self.formatStack(record.stack_info)
        return json.dumps(doc, default=str, ensure_ascii=False)


class _MeshmqHandler(logging.StreamHandler):
    """Marker class, so a second ``setup_logging`` replaces ours and leaves others alone."""


def setup_logging(level: str, fmt: str) -> None:
    """Configure the root logger to write ``fmt`` ("text" | "json") at ``level`` to stderr.

    Idempotent: calling it again (tests, a future reload) replaces the handler it installed.
    aiohttp's access logger is pinned to WARNING so Prometheus scrapes do not fill the log.
    """
    try:
        numeric = LEVELS[level.lower()]
    except KeyError:
        raise ValueError(f"log level must be one of {', '.join(LEVELS)}, got {level!r}") from None
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _MeshmqHandler)]:
        root.removeHandler(old)
    handler = _MeshmqHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root.addHandler(handler)
    root.setLevel(numeric)
    logging.getLogger("aiohttp.access").setLevel(max(numeric, logging.WARNING))
    logging.captureWarnings(True)
