"""Which device log a PUBLISH belongs to.

A device log is the unit of order, storage and (later) replication: every message of one device
keeps one order, like a Kafka partition keyed by device. Rules are MQTT filters where one level may
be ``{device}``; the first rule that matches a topic decides. The default rule is
``devices/{device}/#`` (the device id is a topic level, as in the rumqtt design notes). A topic no
rule matches is logged under its first level (a "topic group": one group, one order), and a rule
with ``log = false`` keeps matching topics as pure live pub/sub. ``$``-topics are never logged:
they are broker-internal by convention ([MQTT-4.7.2-1] keeps them apart from wildcards too).
"""

from __future__ import annotations

from dataclasses import dataclass

DEVICE = "{device}"
_CACHE_LIMIT = 65_536


@dataclass(frozen=True, slots=True)
class LogRule:
    filter: str  # MQTT filter; one level may be "{device}" (matches one level, like "+")
    log: bool = True

    def levels(self) -> list[str]:
        return self.filter.split("/")


DEFAULT_RULES = (LogRule("devices/{device}/#"),)


def validate_rule(rule: LogRule) -> str | None:
    """What is wrong with a rule, or None: config loading reports it with the key's name."""
    levels = rule.levels()
    if levels.count(DEVICE) > 1:
        return "at most one {device} level"
    for i, level in enumerate(levels):
        if level == "#" and i != len(levels) - 1:
            return "'#' must be the last level"
        if level not in ("#", "+", DEVICE) and ("#" in level or "+" in level or "{" in level):
            return f"invalid level {level!r}"
    if rule.log and DEVICE not in levels and levels[0] in ("+", "#"):
        return "a logged rule without {device} needs a literal first level (it keys the log)"
    return None


class LogRules:
    def __init__(self, rules: tuple[LogRule, ...] = DEFAULT_RULES) -> None:
        self._rules = [(r, r.levels()) for r in rules]
        # topic -> its key (None: unlogged), for key_for; public for DeviceLogs.key_for's
        # lookup without a call (cleared when full, never replaced: an alias stays valid)
        self.cache: dict[str, str | None] = {}

    def key_for(self, topic: str) -> str | None:
        """The device key whose log stores ``topic``, or None for unlogged topics."""
        try:
            return self.cache[topic]
        except KeyError:
            pass
        key = self._resolve(topic)
        if len(self.cache) >= _CACHE_LIMIT:
            self.cache.clear()
        self.cache[topic] = key
        return key

    def _resolve(self, topic: str) -> str | None:
        if topic.startswith("$"):
            return None
        levels = topic.split("/")
        for rule, pattern in self._rules:
            matched, device = _match(pattern, levels)
            if matched:
                if not rule.log:
                    return None
                return device if device is not None else levels[0]
        return levels[0]

    def key_for_filter(self, flt: str) -> str | None:
        """The single device a subscription filter covers, if it covers exactly one.

        Offset replay (subscriber-held offsets) reads one device log, so a filter like
        ``devices/d1/#`` names device ``d1``; ``devices/+/temp`` covers many and returns None.
        """
        levels = flt.split("/")
        for rule, pattern in self._rules:
            if not rule.log:
                continue
            if DEVICE in pattern:
                i = pattern.index(DEVICE)
                if len(levels) > i and all(
                    p == level or p in ("+", DEVICE) for p, level in zip(pattern[:i], levels[:i],
                                                                          strict=False)
                ) and levels[i] not in ("+", "#"):
                    return levels[i]
        if levels and levels[0] not in ("+", "#", "") and not levels[0].startswith("$"):
            # a topic-group log keyed by the first level
            if not any(self._rule_claims_prefix(levels[0])):
                return levels[0]
        return None

    def filters_for(self, device: str) -> list[str]:
        """The subscription filters whose topics can be stored in ``device``'s log: each logged
        rule with ``{device}`` filled in, and ``device/#`` (the first-level topic group). The
        admin fetch API checks a reader's MQTT read ACL against these."""
        out = [r.filter.replace(DEVICE, device) for r, p in self._rules
               if r.log and DEVICE in p]
        out.append(device + "/#")
        return out

    def _rule_claims_prefix(self, first: str) -> list[bool]:
        return [p[0] == first or p[0] in ("+", "#", DEVICE) for _, p in self._rules]


def _match(pattern: list[str], levels: list[str]) -> tuple[bool, str | None]:
    device = None
    n = len(levels)
    for i, p in enumerate(pattern):
        if p == "#":
            return True, device
        if i >= n:
            return False, None
        if p == DEVICE:
            device = levels[i]
        elif p != "+" and p != levels[i]:
            return False, None
    return len(pattern) == n, device
