"""Topic name and topic filter rules (section 4.7 of 3.1.1 / 5.0), as fast pure functions.

These sit on the broker's hot paths (every PUBLISH, every SUBSCRIBE), so the common case (no
wildcard characters) is decided with a couple of substring scans and no splitting.
"""

from __future__ import annotations

from .errors import ProtocolError

SHARE_PREFIX = "$share/"


def validate_topic_name(topic: str) -> None:
    """Raise ProtocolError 0x90 (Topic Name invalid) unless ``topic`` may name a PUBLISH.

    Topic names are at least one character long [MQTT-4.7.3-1] and hold no wildcard characters
    [MQTT-3.3.2-2]. U+0000 is already refused by the decoder as malformed [MQTT-4.7.3-2].
    """
    if not topic:
        raise ProtocolError(0x90, "empty topic name")
    if "+" in topic or "#" in topic:
        raise ProtocolError(0x90, f"wildcard in topic name {topic!r}")


def _plain_filter_ok(flt: str) -> bool:
    if not flt:
        return False
    if "+" not in flt and "#" not in flt:
        return True
    levels = flt.split("/")
    last = len(levels) - 1
    for i, level in enumerate(levels):
        if "#" in level:
            # '#' must be a whole level and the last one [MQTT-4.7.1-2]
            if level != "#" or i != last:
                return False
        elif "+" in level and level != "+":  # '+' must occupy a whole level [MQTT-4.7.1-3]
            return False
    return True


def is_valid_topic_filter(flt: str) -> bool:
    """Whether ``flt`` is a valid topic filter (4.7.1), shared subscriptions (4.8.2) included.

    ``$share/{group}/{filter}``: the group is non-empty and holds none of ``/ + #``
    [MQTT-4.8.2-1], and the filter after it is itself valid [MQTT-4.8.2-2].
    """
    if flt.startswith(SHARE_PREFIX):
        group, sep, real = flt[7:].partition("/")
        if not sep or not group or "+" in group or "#" in group:
            return False
        return _plain_filter_ok(real)
    return _plain_filter_ok(flt)


def parse_shared(flt: str) -> tuple[str | None, str]:
    """Split ``$share/{group}/{filter}`` into ``(group, filter)``; ``(None, flt)`` if not shared.

    Assumes the filter passed :func:`is_valid_topic_filter`.
    """
    if flt.startswith(SHARE_PREFIX):
        group, _, real = flt[7:].partition("/")
        return group, real
    return None, flt


def has_wildcards(flt: str) -> bool:
    """Whether a topic filter holds ``+`` or ``#`` (so it cannot be an exact-match lookup)."""
    return "+" in flt or "#" in flt
