"""Planted bugs for review 6's attacks on the MQTT bridge (issue 27, ``[[bridge]]``:
meshmq/bridge.py, meshmq/mqttclient.py), run by ``tests/mutate.py review6-``. Each names the
real-process test of ``tests/interop/test_review6_bridge_faults.py`` (a real Mosquitto, or a
remote that sends malformed packets) that catches it.
"""

from __future__ import annotations

from typing import Any

T = "tests/interop/test_review6_bridge_faults.py"


def review6_mutations(mutation: Any) -> tuple[Any, ...]:
    """The mutations, built with tests/mutate.py's ``Mutation`` class (passed in: no cycle)."""
    m = mutation
    return (
        m("review6-bridge-oversized-inbound-resent", "bridge: an inbound message bigger than "
          "this broker's mqtt.max_packet_size is written to the local connection (closed with "
          "0x95), so the remote resends it first after every reconnect: the bridge is wedged",
          "meshmq/mqttclient.py",
          "        if limit is not None and len(data) > limit:\n",
          "        if False:\n",
          (f"{T}::test_an_oversized_inbound_message_does_not_wedge_the_bridge",)),
        m("review6-bridge-oversized-outbound-resent", "bridge: an outbound message bigger "
          "than the remote's Maximum Packet Size (its v5 CONNACK) is sent (the remote "
          "disconnects), so the session resends it first after every reconnect: wedged",
          "meshmq/mqttclient.py",
          "        if limit is not None and len(data) > limit:\n",
          "        if False:\n",
          ((f"{T}::test_an_outbound_message_over_the_remote_packet_limit_does_not_wedge_the_"
            "bridge"),)),
        m("review6-bridge-acl-denied-inbound-resent", "bridge: an inbound message the ACL of "
          "$bridge/<name> denies (PUBACK 0x87) closes the remote unacknowledged, resent first "
          "after every reconnect: the bridge is wedged", "meshmq/bridge.py",
          "            if f.result() in _DEFINITE_IN:\n",
          "            if False:\n",
          (f"{T}::test_an_inbound_message_the_acl_denies_does_not_wedge_the_bridge",)),
        m("review6-mqttclient-parse-error-escapes", "bridge client: a malformed packet from the "
          "remote ends the read task without closing the connection (the bridge notices only "
          "at its keepalive, and never says why)", "meshmq/mqttclient.py",
          "        except Exception as exc:  # noqa: BLE001 - a bad packet or socket error ends "
          "this link\n",
          "        except OSError as exc:\n",
          ((f"{T}::test_a_remote_sending_malformed_packets_is_dropped_and_retried"
            "[reserved-packet-type]"),)),
        m("review6-bridge-full-disk-let-go", "bridge: an inbound message refused by a full "
          "disk (0x80, may pass later) is let go like an ACL denial: acknowledged to the remote "
          "and lost", "meshmq/bridge.py",
          "_DEFINITE_IN = frozenset({0x87, 0x90, 0x95, 0x99})\n",
          "_DEFINITE_IN = frozenset({0x80, 0x87, 0x90, 0x95, 0x99})\n",
          (f"{T}::test_inbound_on_a_full_disk_is_never_acked_and_arrives_once_space_is_back",)),
    )
