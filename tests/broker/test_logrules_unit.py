"""Which log a topic goes to, and the MQTT 5 properties <-> record headers mapping (no sockets)."""

import pytest

from broker.devicelogs import ReplayCursor, headers_from_properties, properties_from_headers
from broker.logrules import DEFAULT_RULES, LogRule, LogRules, validate_rule
from broker.message import Message
from broker.protocol.properties import Prop


def test_default_rule_keys_by_device_level():
    rules = LogRules()
    assert rules.key_for("devices/d1/telemetry") == "d1"
    assert rules.key_for("devices/d1") == "d1"  # '#' matches the parent level
    assert rules.key_for("devices/d2/a/b/c") == "d2"


def test_unmatched_topics_group_by_first_level_and_dollar_is_never_logged():
    rules = LogRules()
    assert rules.key_for("sensors/x/y") == "sensors"
    assert rules.key_for("bench/0") == "bench"
    assert rules.key_for("$SYS/broker/uptime") is None


def test_first_matching_rule_wins_and_unlogged_rules():
    rules = LogRules((LogRule("live/#", log=False), LogRule("fleet/+/{device}/#"), *DEFAULT_RULES))
    assert rules.key_for("live/video") is None
    assert rules.key_for("fleet/eu/truck7/gps") == "truck7"
    assert rules.key_for("devices/d9/x") == "d9"
    assert rules.key_for("other") == "other"


def test_key_for_filter_names_one_device_or_none():
    rules = LogRules()
    assert rules.key_for_filter("devices/d1/#") == "d1"
    assert rules.key_for_filter("devices/d1/temp") == "d1"
    assert rules.key_for_filter("devices/+/temp") is None
    assert rules.key_for_filter("devices/#") is None
    assert rules.key_for_filter("sensors/#") == "sensors"
    assert rules.key_for_filter("#") is None
    assert rules.key_for_filter("+/x") is None


@pytest.mark.parametrize("flt,problem", [
    ("a/{device}/{device}", "at most one"),
    ("a/#/b", "last level"),
    ("a/x{y}/b", "invalid level"),
    ("+/b", "literal first level"),
])
def test_invalid_rules_are_explained(flt, problem):
    assert problem in validate_rule(LogRule(flt))


def test_properties_round_trip_through_headers():
    props = {
        Prop.CONTENT_TYPE: "application/json",
        Prop.RESPONSE_TOPIC: "reply/here",
        Prop.CORRELATION_DATA: b"\x00\x01corr",
        Prop.PAYLOAD_FORMAT_INDICATOR: 1,
        Prop.USER_PROPERTY: [("k", "v"), ("k", "v2"), ("ünï", "cödé")],
    }
    headers = headers_from_properties(props, 30)
    back, expiry = properties_from_headers(headers)
    assert back == props
    assert expiry == 30
    assert properties_from_headers([]) == (None, None)


def test_replay_cursor_accepts_live_only_in_order_after_catching_up():
    cursor = ReplayCursor("d1", 5)

    def msg(device, offset):
        m = Message("devices/d1/t", b"", 1, False, None, None, None)
        m.device, m.offset = device, offset
        return m

    assert cursor.accept_live(msg("other", 0))  # other logs are not this cursor's business
    assert not cursor.accept_live(msg("d1", 5))  # still replaying: the cursor will read it
    cursor.live = True
    assert not cursor.accept_live(msg("d1", 4))  # already replayed
    assert cursor.accept_live(msg("d1", 5))
    assert cursor.next == 6
