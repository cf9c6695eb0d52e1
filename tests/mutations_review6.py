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
        m("review6-mqttclient-parse-error-escapes", "bridge client: a malformed packet from the "
          "remote ends the read task without closing the connection (the bridge notices only "
          "at its keepalive, and never says why)", "meshmq/mqttclient.py",
          "        except Exception as exc:  # noqa: BLE001 - a bad packet or socket error ends "
          "this link\n",
          "        except OSError as exc:\n",
          ((f"{T}::test_a_remote_sending_malformed_packets_is_dropped_and_retried"
            "[reserved-packet-type]"),)),
    )
