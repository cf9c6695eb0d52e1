"""Planted bugs for the MQTT bridge (issue 27, ``[[bridge]]``: meshmq/bridge.py,
meshmq/bridgeconfig.py, meshmq/mqttclient.py), run by ``tests/mutate.py bridge-``.

Each test of ``tests/interop/test_bridge_mosquitto.py`` (a real Mosquitto),
``tests/cluster/test_bridge_cluster.py`` and ``tests/meshmq/test_bridge_config.py`` is named by
at least one mutation it must catch.
"""

from __future__ import annotations

from typing import Any

T = "tests/interop/test_bridge_mosquitto.py"
CL = "tests/cluster/test_bridge_cluster.py"
CFG = "tests/meshmq/test_bridge_config.py"
BR = "meshmq/bridge.py"
BC = "meshmq/bridgeconfig.py"


def bridge_mutations(mutation: Any) -> tuple[Any, ...]:
    """The mutations, built with tests/mutate.py's ``Mutation`` class (passed in: no cycle)."""
    m = mutation
    return (
        m("bridge-out-prefix", "bridge: outbound topics keep the local prefix (remote_prefix "
          "not applied)", BR,
          "            return t.remote_prefix + topic[len(t.local_prefix):], t.qos\n",
          "            return topic, t.qos\n", (f"{T}::test_out_in_and_prefixes",)),
        m("bridge-in-prefix", "bridge: inbound topics published here without the local "
          "prefix", BR,
          "            return t.local_prefix + topic[len(t.remote_prefix):], t.qos\n",
          "            return topic, t.qos\n", (f"{T}::test_out_in_and_prefixes",)),
        m("bridge-local-no-local", "bridge: the local subscription without No Local (what the "
          "bridge publishes here goes back out)", BR,
          "(t.local_filter, SubscriptionOptions(t.qos, no_local=True,",
          "(t.local_filter, SubscriptionOptions(t.qos, no_local=False,",
          (f"{T}::test_both_directions_no_loop[mqttv5]",)),
        m("bridge-311-marker", "bridge: an MQTT 3.1.1 bridge without the bridge bit 0x80 "
          "(Mosquitto sends its own publishes back)", BR,
          "                             bridge_bit=cfg.level != 5)\n",
          "                             bridge_bit=False)\n",
          (f"{T}::test_both_directions_no_loop[mqttv311]",)),
        m("bridge-local-clean-start", "bridge: the local session starts clean on every "
          "reconnect (no stored position: what was stored while the remote was away is lost)",
          BR, "        await local.connect(Connect(cfg.local_client_id, 5, clean_start=False,",
          "        await local.connect(Connect(cfg.local_client_id, 5, clean_start=True,",
          (f"{T}::test_remote_restart_during_qos1_stream_loses_nothing",)),
        m("bridge-local-session-expiry", "bridge: the local session expires when its "
          "connection closes (session expiry 0): a restart or an outage forgets the position",
          BR, "                                    properties={Prop.SESSION_EXPIRY_INTERVAL: "
          "NEVER}))\n",
          "                                    properties={Prop.SESSION_EXPIRY_INTERVAL: 0}))\n",
          (f"{T}::test_meshmq_kill9_resumes_from_stored_position",)),
        m("bridge-ack-before-remote", "bridge: a local delivery is acknowledged when it is "
          "sent to the remote, not when the remote acknowledged it", BR,
          "            fut.add_done_callback(lambda f: self._out_acked(remote, local, pid, "
          "topic, f))\n",
          "            local.puback(pid)\n", (f"{T}::test_remote_crash_loses_nothing",)),
        m("bridge-inbound-early-ack", "bridge: an inbound QoS 1 message is acknowledged to the "
          "remote before this broker stored it", BR,
          "        topic, qos = mapped\n",
          "        topic, qos = mapped\n        if pkt.qos:\n            remote.puback("
          "pkt.packet_id)\n", (f"{T}::test_inbound_acked_to_remote_only_once_stored",)),
        m("bridge-tls-no-verify", "bridge: TLS without certificate verification", BR,
          "        if cfg.insecure:\n",
          "        ctx.check_hostname = False\n        ctx.verify_mode = ssl.CERT_NONE\n"
          "        if cfg.insecure:\n", (f"{T}::test_tls_to_mosquitto_with_a_test_ca",)),
        m("bridge-tls-cafile-ignored", "bridge: the configured cafile is not loaded (only the "
          "system's CAs)", BR,
          "ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=cfg.cafile)",
          "ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=None)",
          (f"{T}::test_tls_to_mosquitto_with_a_test_ca",)),
        m("bridge-cluster-everywhere", "bridge: every router of a cluster runs every bridge",
          BR, "            chosen = pick_router(b.cfg.name, alive)\n",
          "            chosen = me\n", (f"{CL}::test_one_router_runs_the_bridge_and_it_moves_"
                                      "when_that_node_dies",)),
        m("bridge-cluster-no-move", "bridge: the rendezvous choice over every configured "
          "router, live or not (a bridge never moves off a dead router)", BR,
          "                                  if link.state == \"up\"]\n",
          "                                  ]\n",
          (f"{CL}::test_one_router_runs_the_bridge_and_it_moves_when_that_node_dies",)),
        m("bridge-state-topic", "bridge: $SYS/broker/connection/<name>/state never says 1",
          BR, "        self._notify(b\"1\")\n", "        pass\n",
          (f"{T}::test_out_in_and_prefixes",)),
        m("bridge-lag-metric", "bridge: meshmq_bridge_lag_messages counts only what waits for "
          "the remote's window (not the session's lag behind the logs)", BR,
          "        return behind + len(session.queue) + len(self._held)\n",
          "        return len(self._held)\n",
          (f"{T}::test_meshmq_kill9_resumes_from_stored_position",)),
        m("bridge-reserved-client-id", "a client may connect as $bridge/<name> (and take the "
          "bridge's session with its positions)", "broker/handle_connect.py",
          "        if refused is None and client_id.startswith(\"$bridge/\") and not "
          "conn.trusted:\n",
          "        if False:\n", (f"{T}::test_out_in_and_prefixes",)),
        m("bridge-remote-clean-start", "bridge: the remote session starts clean (what the "
          "remote kept for the bridge while it was away is discarded)", BR,
          "        await remote.connect(Connect(cfg.client_id, cfg.level, clean_start=False,",
          "        await remote.connect(Connect(cfg.client_id, cfg.level, clean_start=True,",
          (f"{T}::test_inbound_published_while_meshmq_is_down_arrives",)),
        m("bridge-early-inbound-dropped", "bridge: inbound messages the remote sends before "
          "the local side is up are left unacknowledged (stuck until the next reconnect)", BR,
          "            self._early.append(pkt)  # the local side is not up yet (see "
          "_connected_once)\n", "            pass\n",
          (f"{T}::test_inbound_published_while_meshmq_is_down_arrives",)),
        m("bridge-queue-full-silent", "a session queue full by count (max_queued_messages) "
          "drops without a log line or limit metric", "broker/delivery.py",
          "                self.limits.queue_full(session)  # (the bytes bound logs in "
          "queue_bytes_full)\n", "                pass\n",
          (f"{T}::test_unlogged_outbound_waits_in_a_bounded_queue",)),
        m("bridge-local-untrusted", "bridge: its local connection is not marked trusted (on a "
          "broker with a password file its CONNECT is refused)", BR,
          "            conn.trusted = True\n", "            conn.trusted = False\n",
          (f"{T}::test_secured_broker_bridge_needs_no_password_but_its_acl",)),
        m("bridge-suback-ignored", "bridge: a refused SUBSCRIBE (ACL) is ignored: the bridge "
          "says it is up and carries nothing, silently", BR,
          "               if code >= 0x80]\n", "               if code >= 0x100]\n",
          (f"{T}::test_secured_broker_bridge_needs_no_password_but_its_acl",)),
        m("bridge-keepalive-deaf", "bridge: the remote's silence past 1.5 x keepalive is not "
          "noticed (a frozen remote keeps the bridge 'up' forever)", BR,
          "            if self.loop.time() - remote.last_rx > keepalive * 1.5:\n",
          "            if False:\n", (f"{T}::test_a_frozen_remote_is_detected_by_keepalive",)),
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
