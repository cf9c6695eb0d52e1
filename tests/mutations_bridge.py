"""Planted bugs for the MQTT bridge (issue 27, ``[[bridge]]``: meshmq/bridge.py,
meshmq/bridgeconfig.py, meshmq/mqttclient.py), run by ``tests/mutate.py bridge-``.

Each test of ``tests/interop/test_bridge_mosquitto.py`` (a real Mosquitto),
``tests/cluster/test_bridge_cluster.py`` and ``tests/meshmq/test_bridge_config.py`` is named by
at least one mutation it must catch.
"""

from __future__ import annotations

from typing import Any

CFG = "tests/meshmq/test_bridge_config.py"
BC = "meshmq/bridgeconfig.py"


def bridge_mutations(mutation: Any) -> tuple[Any, ...]:
    """The mutations, built with tests/mutate.py's ``Mutation`` class (passed in: no cycle)."""
    m = mutation
    return (
        m("bridge-cfg-direction", "config: any [[bridge.topics]] direction accepted", BC,
          "    if direction not in DIRECTIONS:\n", "    if False:\n",
          (f"{CFG}::test_bad_bridge_config_names_the_key[bad-direction]",
           f"{CFG}::test_meshmq_serve_exits_2_naming_the_key")),
        m("bridge-cfg-qos", "config: [[bridge.topics]] qos 2 accepted", BC,
          "    if isinstance(qos, bool) or qos not in (0, 1):\n",
          "    if isinstance(qos, bool) or qos not in (0, 1, 2):\n",
          (f"{CFG}::test_bad_bridge_config_names_the_key[bad-qos]",)),
        m("bridge-cfg-duplicate", "config: two bridges with one name accepted", BC,
          "        if bridge.name in seen:\n", "        if False:\n",
          (f"{CFG}::test_duplicate_names_are_refused",)),
        m("bridge-cfg-prefix", "config: a wildcard in a topic prefix accepted", BC,
          "        if has_wildcards(prefix) or \"\\0\" in prefix:\n", "        if False:\n",
          (f"{CFG}::test_bad_bridge_config_names_the_key[wildcard-prefix]",)),
        m("bridge-cfg-remote-prefix-default", "config: remote_prefix read from local_prefix",
          BC, "    for key in (\"local_prefix\", \"remote_prefix\"):\n",
          "    for key in (\"local_prefix\", \"local_prefix\"):\n",
          (f"{CFG}::test_a_good_bridge_section_loads",)),
        m("bridge-cfg-password-file", "config: the bridge's password_file is not read (the "
          "remote gets no password)", BC,
          "        password = lines[0] if lines else b\"\"",
          "        password = None",
          (f"{CFG}::test_the_documented_example_loads",)),
    )
