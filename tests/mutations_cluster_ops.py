"""Planted bugs for the cluster node's process, config and operations side (issue 15), run by
``tests/mutate.py`` like every other guard (``tests/mutate.py cluster-``).

One or more per new test: each test of ``tests/meshmq/test_cluster_config.py``,
``tests/cluster/test_supervisor.py``, ``tests/cluster/test_dev_cluster.py`` and
``tests/cluster/test_node_admin.py`` is named by at least one mutation it must catch; so is
each test of the cluster-wide fetch API (``tests/cluster/test_cluster_fetch.py``,
``tests/meshmq/test_fetch_cluster_merge.py``, ``tests/spark_connector/test_cluster_source.py``;
``tests/mutate.py xfetch``). Kept in their own module so the mesh's mutations and these do not
fight over one tuple.
"""

from __future__ import annotations

from typing import Any

CFG = "tests/meshmq/test_cluster_config.py"
CASE = CFG + "::test_misconfiguration_exits_2_naming_the_key"
SUP = "tests/cluster/test_supervisor.py"
DEV = "tests/cluster/test_dev_cluster.py"
ADM = "tests/cluster/test_node_admin.py"
XF = "tests/cluster/test_cluster_fetch.py"
XM = "tests/meshmq/test_fetch_cluster_merge.py"
XS = "tests/spark_connector/test_cluster_source.py"
FA = "meshmq/fetch_api.py"


def ops_mutations(mutation: Any) -> tuple[Any, ...]:
    """The mutations, built with tests/mutate.py's ``Mutation`` class (passed in: no cycle)."""
    m = mutation
    return (
        # ---------------------------------------------------------------- [cluster] config
        m("cluster-cfg-duplicate-id", "config: duplicate [[cluster.nodes]] ids accepted",
          "meshmq/config.py", "        if node_id in seen:\n",
          "        if False and node_id in seen:\n", (f"{CASE}[duplicate-id]",)),
        m("cluster-cfg-own-id", "config: this node's id missing from the nodes list accepted",
          "meshmq/config.py", "    if node_id not in ids:\n", "    if False:\n",
          (f"{CASE}[own-id-not-listed]",)),
        m("cluster-cfg-own-id-env", "config: the same, this node's id coming from the "
          "environment", "meshmq/config.py", "    if node_id not in ids:\n", "    if False:\n",
          (f"{CASE}[own-id-from-env-not-listed]",)),
        m("cluster-cfg-slash", "config: no specific refusal of '/' in a node id",
          "meshmq/config.py", '        if isinstance(node_id, str) and "/" in node_id:\n',
          "        if False:\n", (f"{CASE}[slash-in-id]",)),
        m("cluster-cfg-routers-zero", "config: routers = 0 accepted",
          "meshmq/config.py", '        "routers": (_Int(1, MAX_ROUTERS), 1),\n',
          '        "routers": (_Int(0, MAX_ROUTERS), 1),\n', (f"{CASE}[routers-zero]",)),
        m("cluster-cfg-port-range", "config: a node port above 65535 accepted",
          "meshmq/config.py", "not isinstance(port, int) or not 1 <= port <= _U16:",
          "not isinstance(port, int) or not 1 <= port:", (f"{CASE}[port-out-of-range]",)),
        m("cluster-cfg-beyond-65535", "config: port + routers - 1 past 65535 accepted",
          "meshmq/config.py", "        if last > _U16:\n", "        if last > _U16 + 100:\n",
          (f"{CASE}[ports-beyond-65535]",)),
        m("cluster-cfg-overlap", "config: overlapping mesh port ranges on one host accepted",
          "meshmq/config.py", "                    and b.port <= a.port + routers - 1:\n",
          "                    and b.port < a.port:\n", (f"{CASE}[ranges-overlap-on-one-host]",)),
        m("cluster-cfg-mqtt-clash", "config: only the base mesh port checked against listeners",
          "meshmq/config.py", "if port and own.port <= port <= own.port + routers - 1:",
          "if port and own.port <= port <= own.port:", (f"{CASE}[clash-with-mqtt-port]",)),
        m("cluster-cfg-admin-clash", "config: admin.bind not checked against the mesh ports",
          "meshmq/config.py", '("listener", "ws", "bind"), ("admin", "bind")):',
          '("listener", "ws", "bind")):', (f"{CASE}[clash-with-admin-port]",)),
        m("cluster-cfg-no-secret", "config: a multi-router cluster without a secret accepted",
          "meshmq/config.py", "    if total > 1 and not secret:\n",
          "    if total > 99 and not secret:\n", (f"{CASE}[no-secret]",)),
        m("cluster-cfg-secret-always", "config: a secret demanded even for one router",
          "meshmq/config.py", "    if total > 1 and not secret:\n",
          "    if total >= 1 and not secret:\n", (f"{CFG}::test_one_router_needs_no_secret",)),
        m("cluster-cfg-short-secret", "config: secrets of 4 bytes accepted",
          "meshmq/config.py", "MIN_SECRET_BYTES = 16\n", "MIN_SECRET_BYTES = 4\n",
          (f"{CASE}[short-secret]",)),
        m("cluster-cfg-short-secret-file", "config: the same, the secret from secret_file",
          "meshmq/config.py", "MIN_SECRET_BYTES = 16\n", "MIN_SECRET_BYTES = 4\n",
          (f"{CFG}::test_short_secret_file_names_the_file_key",)),
        m("cluster-cfg-secret-and-file", "config: secret and secret_file both accepted",
          "meshmq/config.py", "    if secret and secret_file:\n", "    if False:\n",
          (f"{CASE}[secret-and-file]",)),
        m("cluster-cfg-secret-newline", "config: the secret file's trailing newline kept",
          "meshmq/config.py", '            data = fh.read().rstrip(b"\\r\\n")\n',
          "            data = fh.read()\n",
          (f"{CFG}::test_shorthand_one_node_n_routers_on_loopback",)),
        m("cluster-cfg-unknown-node-key", "config: unknown keys in [[cluster.nodes]] ignored",
          "meshmq/config.py", "            if key not in _NODE_KEYS:\n",
          "            if False:\n", (f"{CASE}[unknown-node-key]",)),
        m("cluster-cfg-missing-node-key", "config: no check that id/host/port are present",
          "meshmq/config.py", "            if key not in item:\n", "            if False:\n",
          (f"{CASE}[missing-node-port]",)),
        m("cluster-cfg-name-required", "config: [[cluster.nodes]] without cluster.name = "
          "silently a single node", "meshmq/config.py",
          "        if nodes is not None or stray:\n", "        if stray:\n",
          (f"{CASE}[nodes-without-name]",)),
        m("cluster-cfg-port-with-nodes", "config: cluster.port with a nodes list accepted",
          "meshmq/config.py", '            if src(key) is not None:\n',
          "            if False:\n", (f"{CASE}[port-with-nodes-list]",)),
        m("cluster-cfg-nodes-env", "config: MESHMQ_CLUSTER__NODES gets the generic message",
          "meshmq/config.py", "            if parts[:2] == [CLUSTER_SECTION, _NODES_KEY]:\n",
          "            if False:\n", (f"{CASE}[nodes-from-env]",)),
        m("cluster-cfg-reconnect", "config: reconnect_min > reconnect_max accepted",
          "meshmq/config.py",
          '    if float(get("reconnect_min")) > float(get("reconnect_max")):\n',
          "    if False:\n", (f"{CASE}[reconnect-min-above-max]",)),
        m("cluster-cfg-shorthand-port", "config: shorthand meshes from cluster.port + 1",
          "meshmq/config.py",
          '        base = int(get("port"))\n', '        base = int(get("port")) + 1\n',
          (f"{CFG}::test_shorthand_one_node_n_routers_on_loopback",)),
        m("cluster-cfg-reuse-port-off", "config: a cluster node's listeners without "
          "SO_REUSEPORT", "meshmq/config.py", "            reuse_port=cluster is not None,\n",
          "            reuse_port=False,\n",
          (f"{CFG}::test_three_node_cluster_loads",)),
        m("cluster-cfg-reuse-port-on", "config: a single node's listeners with SO_REUSEPORT",
          "meshmq/config.py", "            reuse_port=cluster is not None,\n",
          "            reuse_port=True,\n",
          (f"{CFG}::test_single_node_has_no_cluster_and_no_reuse_port",)),
        m("cluster-deploy-compose-id", "deploy: compose service mq-2 gets node id mq-3",
          "deploy/docker-compose.yml", "      MESHMQ_NODE__ID: mq-2\n",
          "      MESHMQ_NODE__ID: mq-3\n",
          (f"{CFG}::test_compose_cluster_config_loads_for_every_service",)),
        m("cluster-deploy-k8s-mesh-port", "deploy: the headless Service misses mesh port 7884",
          "deploy/kubernetes/meshmq-cluster.yaml",
          "    - {name: mesh-1, port: 7884, targetPort: 7884}\n",
          "    - {name: mesh-1, port: 7885, targetPort: 7885}\n",
          (f"{CFG}::test_kubernetes_statefulset_matches_its_config",)),
        # ---------------------------------------------------------------- supervisor
        m("cluster-sup-listener-reuse-port", "listener: the TCP server ignores reuse_port",
          "broker/listener.py", "reuse_address=True, reuse_port=self.settings.reuse_port or None)",
          "reuse_address=True, reuse_port=None)", (f"{SUP}::test_routers_share_the_mqtt_port",)),
        m("cluster-sup-tls-reuse-port", "listener: the TLS socket ignores reuse_port",
          "broker/listener.py", "                if self.reuse_port:\n",
          "                if False:\n", (f"{SUP}::test_tls_and_websocket_ports_are_shared_too",)),
        m("cluster-sup-ws-reuse-port", "listener: the WebSocket site ignores reuse_port",
          "broker/listener.py",
          "        site = web.TCPSite(self._ws_runner, host, port, reuse_address=True,\n"
          "                           reuse_port=self.settings.reuse_port or None)",
          "        site = web.TCPSite(self._ws_runner, host, port, reuse_address=True)",
          (f"{SUP}::test_tls_and_websocket_ports_are_shared_too",)),
        m("cluster-sup-no-restart", "supervisor: a dead router is not restarted",
          "meshmq/supervisor.py", "            await asyncio.sleep(delay)\n",
          "            return\n", (f"{SUP}::test_killed_router_is_restarted",)),
        m("cluster-sup-no-sigterm", "supervisor: stop() does not SIGTERM the routers (they "
          "are SIGKILLed after the timeout, undrained)", "meshmq/supervisor.py",
          "        pids = self.forward(signal.SIGTERM)\n", "        pids: list[int] = []\n",
          (f"{SUP}::test_sigterm_drains_and_stops_every_router",)),
        m("cluster-sup-no-sighup", "supervisor: SIGHUP not forwarded",
          "meshmq/cluster_node.py", "        pids = supervisor.forward(signal.SIGHUP)\n",
          "        pids: list[int] = []\n", (f"{SUP}::test_sighup_reaches_every_router",)),
        m("cluster-sup-no-pdeathsig", "router: does not ask to die with its supervisor, nor "
          "watch it (either one alone is enough for this test: issue 28)",
          "meshmq/router_proc.py", "        _die_with_parent(self._supervisor_pid)\n"
          "        asyncio.get_running_loop().call_soon(self._watch_parent)\n",
          "", (f"{SUP}::test_routers_die_with_a_killed_supervisor",)),
        m("cluster-sup-retry-start-failure", "supervisor: a router that never started is "
          "restarted forever", "meshmq/supervisor.py",
          "            if not ever_up or code == 2:\n", "            if code == 2:\n",
          (f"{SUP}::test_router_start_failure_stops_the_node_with_exit_1",)),
        m("cluster-sup-no-router-label", "node admin: merged samples lose the router label",
          "meshmq/node_admin.py",
          "out.samples.append(s._replace(labels={**s.labels, label: rid}))",
          "out.samples.append(s)",
          (f"{SUP}::test_merged_metrics_carry_the_router_label",)),
        m("cluster-sup-metrics-classic-scrape", "node admin: routers scraped in the classic "
          "text format (their _created series become families of their own)",
          "meshmq/node_admin.py", 'self._get(i, "/metrics", _OPENMETRICS)',
          'self._get(i, "/metrics")',
          (f"{SUP}::test_merged_metrics_carry_the_router_label",)),
        m("cluster-sup-readyz-blind", "node admin: /readyz ready whatever the routers say",
          "meshmq/node_admin.py",
          '        not_ready = {rid: why for rid, why in routers.items() if why != "ready"}\n',
          "        not_ready: dict[str, str] = {}\n",
          (f"{ADM}::test_readyz_names_the_router_that_does_not_answer",)),
        m("cluster-sup-owner-local", "node admin: device owner's 'local' flag inverted",
          "meshmq/node_admin.py",
          '                            and owner.rpartition("/")[0] == c.node_id}\n',
          '                            and owner.rpartition("/")[0] != c.node_id}\n',
          (f"{SUP}::test_readyz_and_cluster_status",)),
        m("cluster-sup-router-up-renamed", "node admin: meshmq_router_up's family renamed "
          "(the dashboard's cluster panels go blank)", "meshmq/node_admin.py",
          '    up = Metric("meshmq_router_up",', '    up = Metric("meshmq_routers_up",',
          ("tests/meshmq/test_dashboard.py::"
           "test_every_cluster_panel_metric_exists_on_a_cluster_node",)),
        # ---------------------------------------------------------------- node admin proxy
        # (no listing mutation here: a router lists the whole cluster and the node admin
        # proxies the listing to one router; see the xfetch mutations below)
        # (no "owner ignored" mutation: any router now answers for any device, relaying over
        # the mesh, so asking the local owner first saves a hop and is not a correctness rule)
        m("cluster-adm-proxy-drops-body", "node admin: a proxied POST loses its body",
          "meshmq/node_admin.py", "data=body, allow_redirects=False", "data=None, "
          "allow_redirects=False",
          (f"{ADM}::test_records_and_bulk_fetch_pass_through_the_proxy",)),
        m("cluster-adm-proxy-drops-headers", "node admin: the router's response headers "
          "(Content-Type...) are not passed back", "meshmq/node_admin.py",
          "                    if name.lower() not in _HOP_BY_HOP:\n",
          "                    if False:\n",
          (f"{ADM}::test_records_and_bulk_fetch_pass_through_the_proxy",)),
        # ---------------------------------------------------------------- dev-cluster, status
        m("cluster-status-links-up", "cluster status: up links counted as down",
          "meshmq/clustercli.py", '            if state == "up":\n',
          '            if state == "Up":\n',
          (f"{DEV}::test_dev_cluster_starts_and_stops_three_nodes",)),
        m("cluster-dev-mqtt-ports", "dev-cluster: node i's MQTT port is base + 2i",
          "meshmq/devcluster.py", "    return [DevNode(i, f\"node-{i}\", args.mqtt_port + i,",
          "    return [DevNode(i, f\"node-{i}\", args.mqtt_port + 2 * i,",
          (f"{DEV}::test_dev_cluster_starts_and_stops_three_nodes",)),
        m("cluster-dev-overlap", "dev-cluster: overlapping port ranges accepted",
          "meshmq/devcluster.py", "            if sa < sb + cb and sb < sa + ca:\n",
          "            if False:\n", (f"{DEV}::test_dev_cluster_refuses_overlapping_ports",)),
        m("cluster-status-404", "cluster status: a single node's 404 reported as an HTTP error",
          "meshmq/clustercli.py", "    if status == 404:\n", "    if status == 4040:\n",
          (f"{DEV}::test_cluster_status_on_a_single_node_says_it_is_not_a_cluster",)),
        m("cluster-status-down-link-ok", "cluster status: a down link still reads as healthy",
          "meshmq/clustercli.py", "    if down or notes:\n", "    if notes:\n",
          (f"{DEV}::test_cluster_status_renders_routers_links_and_owner",)),
        # ---------------------------------------------------------------- xfetch: any node
        # answers for any device (meshmq/fetch_api.py's cluster part)
        m("cluster-xfetch-local-only", "fetch API: a many-device fetch reads only this "
          "router's store (devices owned elsewhere come back unknown)", FA,
          "            if set(groups) != {None}:  # some devices live at other routers\n",
          "            if False:\n",
          (f"{XF}::test_one_many_device_fetch_at_node_0_reads_every_owner",)),
        m("cluster-xfetch-spark-local-only", "fetch API: the same, seen by a Spark job "
          "reading the cluster through one node", FA,
          "            if set(groups) != {None}:  # some devices live at other routers\n",
          "            if False:\n",
          (f"{XS}::test_one_nodes_url_reads_devices_owned_on_every_node",)),
        m("cluster-xfetch-no-budget", "fetch API: merged parts ignore the request's byte "
          "budget (each owner filled it)", FA,
          "        if s.count and used and used + s.size > max_bytes:\n", "        if False:\n",
          (f"{XF}::test_paging_under_a_small_budget_reads_every_record_once_in_order",
           f"{XM}::test_merged_parts_keep_one_budget_in_request_order")),
        m("cluster-xfetch-first-record-dropped", "fetch API: the merge drops a response's "
          "only record when it is over the budget (a reader never progresses)", FA,
          "        if s.count and used and used + s.size > max_bytes:\n",
          "        if s.count and used + s.size > max_bytes:\n",
          (f"{XM}::test_the_first_record_is_served_whatever_the_budget",)),
        m("cluster-xfetch-cut-skips", "fetch API: a section cut at the budget says to "
          "resume one record late (a record lost to the reader)", FA,
          "    next_offset = RECORD_HEADER.unpack_from(data, p)[5]  # the first record left out",
          "    next_offset = RECORD_HEADER.unpack_from(data, p)[5] + 1",
          (f"{XF}::test_paging_under_a_small_budget_reads_every_record_once_in_order",)),
        m("cluster-xfetch-listing-local", "fetch API: a router lists only its own logs",
          FA, "    if view is None or RELAYED_HEADER in request.headers:\n", "    if True:\n",
          (f"{XF}::test_the_listing_at_every_node_lists_every_log_once",
           f"{ADM}::test_log_listing_merges_every_router")),
        m("cluster-xfetch-listing-unsorted", "fetch API: the merged listing not sorted",
          FA, '    entries.sort(key=lambda e: str(e["device"]))\n', "",
          (f"{ADM}::test_log_listing_merges_every_router",)),
        m("cluster-xfetch-listing-no-bound", "fetch API: merged listing pages not cut where "
          "a router's page ended (a device skipped between pages)", FA,
          '               and (bound is None or str(e["device"]) <= bound)]', "]",
          (f"{XM}::test_every_owned_log_is_listed_once_across_pages_even_with_stale_copies",)),
        m("cluster-xfetch-listing-any-holder", "fetch API: a log listed from any router "
          "holding a copy, not only from its owner", FA,
          '               if owner_of(str(e["device"])) == router\n', "               if True\n",
          (f"{XM}::test_a_peer_lists_nothing_it_does_not_own",)),
        m("cluster-xfetch-unreachable-silent", "fetch API: a router that does not answer is "
          "left out of the listing without a word", FA,
          '        out["unreachable"] = unreachable\n', "        pass\n",
          (f"{XF}::test_an_unreachable_owner_is_named_not_skipped",)),
        m("cluster-xfetch-logcli-partial-ok", "meshmq log list: a listing naming unreachable "
          "routers exits 0 without a word", "meshmq/logcli.py", "    if unreachable:\n",
          "    if False:\n", (f"{XF}::test_an_unreachable_owner_is_named_not_skipped",)),
        m("cluster-xfetch-part-error-swallowed", "fetch API: a failed part is dropped from "
          "the merged fetch instead of failing it", FA,
          "    if failed:\n        try:\n            for exc in failed:\n",
          "    if False:\n        try:\n            for exc in failed:\n",
          (f"{XF}::test_an_unreachable_owner_is_named_not_skipped",)),
        m("cluster-xfetch-no-credentials", "fetch API: relayed parts lose the caller's "
          "Authorization (the owners refuse them)", FA,
          '    out = [(k, v) for k, v in request.headers.items() if k.lower() == '
          '"authorization"]', "    out: list[tuple[str, str]] = []",
          (f"{XF}::test_one_many_device_fetch_at_node_0_reads_every_owner",)),
        m("cluster-xfetch-poll-ignored", "fetch API: a spread long poll answers at once",
          FA, "    if not _has_news(sections) and lim.wait_ms:\n", "    if False:\n",
          (f"{XF}::test_a_long_poll_over_several_owners_returns_a_record_committed_while_it_"
           "waits",)),
        m("cluster-xfetch-poll-waits-all", "fetch API: a spread long poll waits for every "
          "owner, not the first with news", FA, "return_when=asyncio.FIRST_COMPLETED",
          "return_when=asyncio.ALL_COMPLETED",
          (f"{XM}::test_a_long_poll_over_owners_ends_when_the_first_has_news",)),
        m("cluster-xfetch-spark-partial-listing", "Spark client: a listing naming unreachable "
          "routers is planned with (their devices taken for gone)", "spark_connector/client.py",
          '            if page.get("unreachable"):\n', "            if False:\n",
          (f"{XS}::test_one_nodes_url_reads_devices_owned_on_every_node",)),
        m("cluster-adm-cluster-open", "node admin: /api/v1/cluster served without "
          "credentials when no router answers", "meshmq/node_admin.py",
          "            refused = await self.auth.refusal(request)\n",
          "            refused = None\n",
          (f"{XF}::test_the_node_admins_own_cluster_status_needs_credentials",)),
    )
