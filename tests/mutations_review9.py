"""Planted bugs for review9's tests of the catch-up read (issue 25's per-pump topic memo,
broker/catchup.py), run by ``tests/mutate.py review9-``."""

from __future__ import annotations

from typing import Any

T = "tests/broker/test_review9_catchup.py"
SIDS = T + "::test_lagging_session_gets_each_subscription_identifier_once"
NEWSUB = T + "::test_subscription_made_while_behind_takes_what_is_stored_after_it"
QOS = T + "::test_lagging_v311_session_gets_the_highest_granted_qos_of_overlapping_filters"
PROPS = T + "::test_lagging_v5_session_gets_every_property_back_from_the_log"
EXPIRED = T + "::test_lagging_session_is_not_fed_expired_messages_from_the_log"
NO_LOCAL = "tests/broker/test_log_delivery.py::test_no_local_holds_when_fed_from_log"
RETAIN = ("tests/broker/test_review9_malformed_retention.py::"
          "test_malformed_publishes_do_not_stay_in_memory_after_their_connections")


def review9_mutations(mutation: Any) -> tuple[Any, ...]:
    m = mutation
    return (
        m("review9-catchup-sub-ids-repeated", "broker/catchup.py match_record: a subscription "
          "identifier listed once per overlapping subscription that carries it (route() lists "
          "it once)", "broker/catchup.py",
          "            elif sub.sub_id not in ids:", "            else:", (SIDS,)),
        m("review9-catchup-memo-ignores-newest", "broker/catchup.py pump: the per-topic answer "
          "kept for records older than the newest subscription too", "broker/catchup.py",
          "                    if memo is not None and rec.timestamp_us + skew >= newest:\n",
          "                    if memo is not None:\n", (NEWSUB,)),
        m("review9-catchup-memo-ignores-no-local", "broker/catchup.py pump: the per-topic "
          "answer kept with a No Local subscription (whose answer depends on the publisher)",
          "broker/catchup.py",
          "            None if any([sub.no_local for sub in subs]) else {})\n",
          "            {})\n", (NO_LOCAL,)),
        m("review9-parse-error-cycle", "broker/protocol/connection.py receive_data: the parse "
          "error raised from a local (frame -> error -> traceback -> frame: the received "
          "bytes wait for the cyclic collector)", "broker/protocol/connection.py",
          "            try:\n                raise parse_error\n            finally:\n"
          "                del parse_error\n", "            raise parse_error\n", (RETAIN,)),
        m("review9-catchup-last-qos-wins", "broker/catchup.py match_record: overlapping "
          "subscriptions merged at the last one's QoS, not the highest", "broker/catchup.py",
          "        if sub.qos > qos:\n", "        if True:\n", (QOS,)),
        m("review9-record-headers-skipped", "broker/devicelogs.py record_message: a record's "
          "headers (v5 properties, expiry, origin) not read back", "broker/devicelogs.py",
          "    if headers:\n", "    if headers and not rec.timestamp_us:\n", (PROPS,)),
        m("review9-catchup-expiry-unchecked", "broker/catchup.py pump: a record read back is "
          "delivered without checking its Message Expiry Interval", "broker/catchup.py",
          "                        if msg.expiry_at is not None and "
          "msg.expired(time.monotonic()):\n",
          "                        if False:\n", (EXPIRED,)),
    )
