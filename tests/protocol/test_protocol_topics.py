"""Topic name / filter rules (4.7, 4.8.2)."""

from __future__ import annotations

import pytest

from broker.protocol import (
    ProtocolError,
    has_wildcards,
    is_valid_topic_filter,
    parse_shared,
    validate_topic_name,
)


@pytest.mark.parametrize("topic", ["a", "a/b", "/", "//", "$SYS/x", " ", "a b/ü"])
def test_valid_topic_names(topic: str) -> None:
    validate_topic_name(topic)


@pytest.mark.parametrize("topic", ["", "+", "#", "a/+", "a/#", "a+", "a#b"])
def test_invalid_topic_names(topic: str) -> None:
    with pytest.raises(ProtocolError) as info:
        validate_topic_name(topic)
    assert info.value.reason_code == 0x90


@pytest.mark.parametrize(
    ("flt", "ok"),
    [
        ("a/b", True),
        ("#", True),
        ("+", True),
        ("a/#", True),
        ("a/+/c", True),
        ("+/+", True),
        ("/+", True),
        ("a//b", True),
        ("$SYS/#", True),
        ("", False),
        ("a#", False),
        ("a/#/b", False),
        ("a/b#", False),
        ("a+/b", False),
        ("a/+b", False),
        ("##", False),
        ("$share/g/a/b", True),
        ("$share/g/#", True),
        ("$share/g/+/x", True),
        ("$share/g/", False),
        ("$share/g", False),
        ("$share//a", False),
        ("$share/g+/a", False),
        ("$share/g#/a", False),
        ("$share/g/a#", False),
        ("$sharex/g/a", True),  # not a shared subscription: an ordinary filter
    ],
)
def test_topic_filters(flt: str, ok: bool) -> None:
    assert is_valid_topic_filter(flt) is ok


def test_parse_shared() -> None:
    assert parse_shared("$share/grp/a/+/c") == ("grp", "a/+/c")
    assert parse_shared("a/b") == (None, "a/b")
    assert parse_shared("$share/grp/#") == ("grp", "#")


def test_has_wildcards() -> None:
    assert has_wildcards("a/+") and has_wildcards("#")
    assert not has_wildcards("a/b")
