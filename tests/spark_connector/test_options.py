"""Option parsing and planning rules, without Spark (pure functions of spark_connector)."""

from __future__ import annotations

import pytest

from spark_connector.arrow import topic_matches
from spark_connector.options import OptionError, parse_sink_options, parse_source_options
from spark_connector.planning import admit, group_ranges


@pytest.mark.parametrize(("key", "value", "named"), [
    ("maxrecordpertrigger", "1", "maxrecordpertrigger"),
    ("maxrecordspertrigger", "0", "maxRecordsPerTrigger"),
    ("maxrecordspertrigger", "1e3", "maxRecordsPerTrigger"),
    ("minrecordspertrigger", "-1", "minRecordsPerTrigger"),
    ("maxtriggerdelay", "5 parsecs", "maxTriggerDelay"),
    ("startingoffsets", "[1, 2]", "startingOffsets"),
    ("startingoffsets", '{"d": -3}', "startingOffsets"),
    ("startingoffsets", '{"d": true}', "startingOffsets"),
    ("startingoffsets", "newest", "startingOffsets"),
    ("endingoffsets", "earliest", "endingOffsets"),
    ("endingoffsets", '{"d": -2}', "endingOffsets"),
    ("startingtimestamp", "yesterday", "startingTimestamp"),
    ("failondataloss", "yes", "failOnDataLoss"),
    ("includeheaders", "1", "includeHeaders"),
    ("devicepattern", "[a-", "devicePattern"),
    ("devices", " , ", "devices"),
    ("topicfilter", "a/b#", "topicFilter"),
    ("topicfilter", "a+/b", "topicFilter"),
    ("servers", "h:0", "servers"),
    ("servers", "[::1", "servers"),
    ("fetchmaxbytes", str(65 << 20), "fetchMaxBytes"),
    ("maxrecordsperpartition", "0", "maxRecordsPerPartition"),
])
def test_bad_source_option_is_named(key: str, value: str, named: str) -> None:
    with pytest.raises(OptionError, match=named):
        parse_source_options({"servers": "127.0.0.1:9883", key: value})


def test_exclusive_and_inconsistent_options() -> None:
    with pytest.raises(OptionError, match="devicePattern"):
        parse_source_options({"devices": "a", "devicepattern": "b.*"})
    with pytest.raises(OptionError, match="startingTimestamp"):
        parse_source_options({"startingoffsets": "earliest", "startingtimestamp": "1"})
    with pytest.raises(OptionError, match="minRecordsPerTrigger"):
        parse_source_options({"maxrecordspertrigger": "10", "minrecordspertrigger": "11"})
    with pytest.raises(OptionError, match="clientid2"):
        parse_sink_options({"clientid2": "x"})


def test_good_options_parse() -> None:
    o = parse_source_options({
        "servers": "a:1, [::1]:2,b", "devices": "y,x,y", "startingoffsets": '{"x": 3, "y": -2}',
        "maxtriggerdelay": "250ms", "failondataloss": "FALSE", "checkpointlocation": "/ck",
    })
    assert o.servers == (("a", 1), ("::1", 2), ("b", 9883))
    assert o.devices == ("x", "y")
    assert o.starting_offsets == {"x": 3, "y": -2}
    assert o.max_trigger_delay_s == 0.25
    assert o.fail_on_data_loss is False
    assert o.wants("x") and not o.wants("z")
    assert parse_source_options({"devicepattern": "d[0-9]+"}).wants("d12")
    assert not parse_source_options({"devicepattern": "d[0-9]+"}).wants("d12x")
    assert parse_sink_options({}).servers == (("127.0.0.1", 1883),)


def test_admit_gives_equal_shares_and_redistributes() -> None:
    assert admit({"a": 10, "b": 1000, "c": 1000}, 300) == {"a": 10, "b": 145, "c": 145}
    assert admit({"a": 5, "b": 0}, 100) == {"a": 5}
    got = admit({f"d{i}": 7 for i in range(10)}, 33)
    assert sum(got.values()) == 33 and max(got.values()) - min(got.values()) <= 1


def test_group_ranges_bounds_every_partition() -> None:
    parts = group_ranges([("big", 0, 1000, False), ("s1", 5, 8, False), ("s2", 0, 2, True)], 400)
    assert all(sum(hi - lo for _, lo, hi, _ in p) <= 400 for p in parts)
    flat = sorted(r for p in parts for r in p)
    assert [r for r in flat if r[0] == "big"] == [
        ("big", 0, 400, False), ("big", 400, 800, False), ("big", 800, 1000, False)]
    assert len(parts) == 3  # the small devices share the last partition with big's tail


@pytest.mark.parametrize(("flt", "topic", "ok"), [
    ("a/#", "a", True), ("a/#", "a/b/c", True), ("a/+", "a/b", True), ("a/+", "a/b/c", False),
    ("+/b", "a/b", True), ("#", "$SYS/x", False), ("a/b", "a/b", True), ("a/b", "a/c", False),
])
def test_topic_filter_matching(flt: str, topic: str, ok: bool) -> None:
    assert topic_matches(flt.split("/"), topic) is ok


def test_kafka_names_are_aliases_and_credentials_parse(tmp_path) -> None:
    """Issue 27: Kafka's option names mean ours; credentials and HTTPS options parse."""
    o = parse_source_options({"maxoffsetspertrigger": "7", "minoffsetspertrigger": "3",
                              "subscribepattern": "d.*", "ssl.cafile": __file__,
                              "username": "alice", "password": "pw"})
    assert (o.max_records_per_trigger, o.min_records_per_trigger) == (7, 3)
    assert o.device_pattern == "d.*"
    assert o.auth is not None and o.auth.tls and o.auth.cafile == __file__
    assert o.auth.header() == "Basic YWxpY2U6cHc="
    token = tmp_path / "t"
    token.write_text("# comment\nreader:tok-0123456789abcdef\n")
    o = parse_source_options({"tokenfile": str(token), "servers": "https://h:1,https://g"})
    assert o.auth is not None and o.auth.header() == "Bearer tok-0123456789abcdef"
    assert o.auth.tls and o.servers == (("h", 1), ("g", 9883))
    o = parse_source_options({"startingoffsetsbytimestamp": '{"d1": 1700000000000}'})
    assert o.starting_timestamps_ms == {"d1": 1700000000000}
    for bad, named in [({"maxoffsetspertrigger": "1", "maxrecordspertrigger": "2"},
                        "maxOffsetsPerTrigger"),
                       ({"username": "alice"}, "password"),
                       ({"token": "x", "tokenfile": str(token)}, "tokenFile"),
                       ({"startingoffsetsbytimestamp": "[1]"}, "startingOffsetsByTimestamp"),
                       ({"startingoffsetsbytimestamp": '{"d": 1}', "startingtimestamp": "1"},
                        "startingOffsetsByTimestamp"),
                       ({"cafile": str(tmp_path / "missing.pem")}, "caFile"),
                       ({"maxoffsetpertrigger": "1"}, "did you mean 'maxOffsetsPerTrigger'")]:
        with pytest.raises(OptionError, match=named):
            parse_source_options(bad)
