"""Planted bugs for issue 28's will hand-over, retained-clear and MQTT 5 details (the
``mqttfix`` work), run by ``tests/mutate.py`` like every other guard (``tests/mutate.py
mqttfix-``). Each new test is named by at least one mutation it must catch.
"""

from __future__ import annotations

from typing import Any

D5 = "tests/broker/test_mqtt5_details.py"


def mqttfix_mutations(mutation: Any) -> tuple[Any, ...]:
    """The mutations, built with tests/mutate.py's ``Mutation`` class (passed in: no cycle)."""
    m = mutation
    return (
        m("mqttfix-sub-id-twice", "router.route: overlapping subscriptions of one session "
          "send an identifier they share once per subscription ([2333, 2333])",
          "broker/router.py",
          "                    if sub.sub_id not in entry[2]:  # each identifier once "
          "[MQTT-3.3.4-3]\n                        entry[2].append(sub.sub_id)\n",
          "                    entry[2].append(sub.sub_id)\n",
          (f"{D5}::test_overlapping_subscriptions_with_one_identifier_send_it_once",)),
        m("mqttfix-protocol-error-no-drain", "router.protocol_error: DISCONNECT then an "
          "immediate close, so a client still writing gets a TCP reset",
          "broker/router.py",
          "        conn.close(err.reason_code, drain=True)",
          "        conn.close(err.reason_code, drain=False)",
          (f"{D5}::test_receive_maximum_violation_disconnect_is_not_followed_by_a_reset",)),
    )
