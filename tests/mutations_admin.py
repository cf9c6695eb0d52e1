"""Planted bugs for issue 27's admin side (the admin API and CLI, the Spark source's options,
retained pacing, the auth lockout, the small fixes), run by ``tests/mutate.py`` like every
other guard (``tests/mutate.py admin27-``). Each test added for issue 27 is named by at least one
mutation it must catch.
"""

from __future__ import annotations

from typing import Any

API = "meshmq/admin_api.py"
RET = "meshmq/admin_retained.py"
T1 = "tests/meshmq/test_admin_api.py"
TX = "tests/cluster/test_cluster_admin.py"
RL = "tests/broker/test_resource_limits.py"
SA = "tests/spark_connector/test_source_auth.py"
SO = "tests/spark_connector/test_options.py"
LH = "tests/meshmq/test_logcli_hints.py"
RP = "tests/broker/test_retained_pacing.py::test_every_retained_message_reaches_new_subscribers"


def admin_mutations(mutation: Any) -> tuple[Any, ...]:
    """The mutations, built with tests/mutate.py's ``Mutation`` class (passed in: no cycle)."""
    m = mutation
    return (
        # ---------------------------------------------------------------- admin API
        m("admin27-kick-reason", "admin API: a kick closes with 0x80, not 0x98 Administrative "
          "action", API, "    conn.close(Reason.ADMINISTRATIVE_ACTION)\n",
          "    conn.close(Reason.UNSPECIFIED_ERROR)\n",
          (f"{T1}::test_kick_sends_0x98_and_keeps_the_session_unless_clean",)),
        m("admin27-kick-clean-ignored", "admin API: ?clean=true keeps the session",
          API, "    if clean:\n        session.expiry_interval = 0\n",
          "    if False:\n        session.expiry_interval = 0\n",
          (f"{T1}::test_kick_sends_0x98_and_keeps_the_session_unless_clean",)),
        m("admin27-kick-unlogged", "admin API: a kick is logged without who did it",
          API, '                 **who(request), "client_id": cid, "clean": clean})',
          '                 "client_id": cid, "clean": clean})',
          (f"{T1}::test_kick_sends_0x98_and_keeps_the_session_unless_clean",)),
        m("admin27-offline-hidden", "admin API: offline sessions are not listed",
          API, "        if connected is None or row[\"connected\"] == connected:\n",
          "        if row[\"connected\"] and (connected is None or row[\"connected\"] == "
          "connected):\n",
          (f"{T1}::test_kick_sends_0x98_and_keeps_the_session_unless_clean",)),
        m("admin27-page-skips", "admin API: a page's next_after is one past its last row (a "
          "client skipped between pages)", API,
          "    return rows[:limit], len(rows) > limit\n",
          "    return rows[:limit], len(rows) > limit + 1\n",
          (f"{T1}::test_clients_list_show_filters_and_paging",)),
        m("admin27-offline-delete-noop", "admin API: deleting an offline session leaves it",
          API, "        router.end_session(session)\n", "        pass\n",
          (f"{T1}::test_delete_offline_session_and_subscriptions",)),
        m("admin27-subs-filter", "admin API: ?filter= ignored", API,
          "            if flt is None or key == flt:\n", "            if True:\n",
          (f"{T1}::test_delete_offline_session_and_subscriptions",)),
        m("admin27-retained-acl", "admin API: retained listing ignores the reader's read ACL",
          RET, "not _matches(flt, topic) or not allowed(request, topic, False):",
          "not _matches(flt, topic):",
          (f"{T1}::test_retained_list_get_delete_under_the_acl",)),
        m("admin27-retained-not-durable", "admin API: a retained delete is not written to the "
          "#retained state log (comes back after kill -9)", RET,
          "    if persist is not None and persist.keeps(topic):\n",
          "    if False:\n",
          (f"{T1}::test_retained_delete_survives_a_restart",)),
        m("admin27-control-acl", "admin API: the $CONTROL/meshmq/clients guard is not checked",
          API, "    if not allowed(request, CONTROL_TOPIC, write):\n", "    if False:\n",
          (f"{T1}::test_acl_guards_the_client_routes",)),
        m("admin27-cluster-local-only", "admin API: listings answer from this router only",
          API, "        return None  # a peer's part: this router's own state only\n"
               "    return request.app.get(_VIEW_KEY)\n",
          "        return None  # a peer's part: this router's own state only\n"
          "    return None\n",
          (f"{TX}::test_clients_of_every_node_listed_and_kicked_from_node_0",)),
        m("admin27-cluster-merge-more", "admin API: merged page loses 'more' of peers",
          API, "    more = len(rows) > limit or any(m for _, m in pages)\n",
          "    more = len(rows) > limit\n",
          (f"{TX}::test_clients_of_every_node_listed_and_kicked_from_node_0",)),
        m("admin27-cluster-unknown-success", "admin API: a kick no router answered for is a "
          "404 though a router did not answer (unknown outcome reported as a known one)",
          API, "    if unreachable:\n        raise Bad(503, f\"{what} {ident!r} not found on "
               "the routers that answered; not done: \"",
          "    if False:\n        raise Bad(503, f\"{what} {ident!r} not found on "
          "the routers that answered; not done: \"",
          (f"{TX}::test_a_silent_router_is_named_not_left_out",)),
        # ---------------------------------------------------------------- retained pacing
        m("admin27-retained-unpaced", "retained on SUBSCRIBE all delivered at once (the bounded "
          "queue drops the rest, as before issue 27)", "broker/retainpace.py",
          "                if min(msg.qos, batch.qos) and (session.queue\n",
          "                if False and (session.queue\n", (RP,)),
        m("admin27-retained-qos0-congested", "QoS 0 retained sent into a congested socket "
          "(dropped as slow_consumer)", "broker/retainpace.py",
          "                if conn.congested:\n", "                if False:\n", (RP,)),
        m("admin27-retained-no-resume", "an ack freeing the window does not resume retained "
          "delivery", "broker/delivery.py",
          "        if session in self._retained_owed:\n"
          "            self.retained_pacer.pump(session)",
          "        if False:\n            self.retained_pacer.pump(session)", (RP,)),
        # ---------------------------------------------------------------- auth lockout
        m("admin27-lockout-username", "auth lockout keyed by the username alone (a stranger "
          "locks the real user out from everywhere, as before issue 27)", "broker/authgate.py",
          '    return "p:" + address + "\\0" + (username if username is not None else "")',
          '    return "u:" + (username if username is not None else "")',
          (f"{RL}::test_wrong_password_flood_cannot_starve_a_valid_client",)),
        m("admin27-lockout-no-address", "auth.max_address_failures not enforced",
          "broker/authgate.py", "        return (self._over(\"a:\" + address, self._max_address)\n",
          "        return (False\n",
          (f"{RL}::test_an_address_spraying_usernames_is_locked_out",)),
        # ---------------------------------------------------------------- Spark source
        m("admin27-spark-no-credentials", "Spark source: the credentials are never sent",
          "spark_connector/client.py", "                if self._authorization is not None:\n",
          "                if False:\n",
          (f"{SA}::test_token_file_over_https_and_basic_auth",)),
        m("admin27-spark-401-unavailable", "Spark source: a 401/403 fails over and ends as "
          "ServerUnavailable (as before issue 27)", "spark_connector/client.py",
          "                if resp.status in (401, 403):\n", "                if False:\n",
          (f"{SA}::test_refusals_are_authentication_errors",)),
        m("admin27-spark-plain-http", "Spark source: caFile/https:// ignored (plain HTTP)",
          "spark_connector/client.py", "        if auth is None or not auth.tls:\n",
          "        if True:\n", (f"{SA}::test_token_file_over_https_and_basic_auth",)),
        m("admin27-spark-alias-pattern", "Spark source: subscribePattern not an alias",
          "spark_connector/options.py", '           "subscribepattern": "devicepattern",\n',
          '           "subscribepattern_": "devicepattern",\n',
          (f"{SO}::test_kafka_names_are_aliases_and_credentials_parse",
           f"{SA}::test_token_file_over_https_and_basic_auth")),
        m("admin27-spark-no-hint", "Spark source: an unknown option's error names no close one",
          "spark_connector/options.py",
          "    close = difflib.get_close_matches(key.lower(), sorted(allowed), n=1, cutoff=0.6)",
          "    close = difflib.get_close_matches(key.lower(), sorted(allowed), n=1, cutoff=1.0)",
          (f"{SO}::test_kafka_names_are_aliases_and_credentials_parse",
           f"{SA}::test_unknown_option_names_the_closest")),
        m("admin27-spark-by-timestamp", "Spark source: startingOffsetsByTimestamp ignored "
          "(every device from its earliest)", "spark_connector/source.py",
          "        if by_ts is not None:  # Kafka's startingOffsetsByTimestamp, per device\n",
          "        if False:\n", (f"{SA}::test_token_file_over_https_and_basic_auth",)),
        # ---------------------------------------------------------------- small fixes
        m("admin27-docker-zlib", "deploy/Dockerfile's build stage without zlib1g-dev",
          "deploy/Dockerfile", "gcc libc6-dev zlib1g-dev \\\n", "gcc libc6-dev \\\n",
          ("tests/meshmq/test_deploy_docker.py::"
           "test_build_stage_installs_every_header_the_extensions_include",)),
        m("admin27-inspect-no-routers", "log inspect's hint does not name router-<r>/log",
          "meshmq/logcli.py", '    return " This looks like a data directory; its stores: " '
          '+ ", ".join(found)', '    return ""',
          (f"{LH}::test_inspect_of_a_cluster_data_dir_names_the_router_stores",)),
        m("admin27-acl-hidden-uncounted", "the listing does not count the logs the ACL hid",
          "meshmq/fetch_api.py", "            hidden += 1\n", "            hidden += 0\n",
          (f"{LH}::test_a_listing_the_acl_empties_says_why",)),
        m("admin27-readme-no-paho", "README's first command does not install paho-mqtt (the "
          "quick tour's snippet fails with ModuleNotFoundError)", "README.md",
          "pip install -q -e . paho-mqtt &&", "pip install -q -e . &&",
          ("tests/meshmq/test_readme_snippets.py::"
           "test_first_command_installs_what_the_tour_imports",)),
        m("admin27-readme-index-install", "README tells to install the Spark extra from an "
          "index", "README.md", "`.venv/bin/pip install -e '.[spark]'`",
          "`pip install 'meshmq[spark]'`",
          ("tests/meshmq/test_readme_snippets.py::test_install_lines_name_the_checkout",)),
        m("admin27-retained-unbounded", "mqtt.max_retained_pending not enforced",
          "broker/retainpace.py", "        if len(messages) > room:\n", "        if False:\n",
          ("tests/broker/test_retained_pacing.py::test_what_a_session_may_be_owed_is_bounded",)),
        m("admin27-retained-resubscribe-adds", "a re-SUBSCRIBE adds a second batch instead of "
          "replacing its filter's", "broker/retainpace.py",
          "            for old in [b for b in work if b.key == key]:\n",
          "            for old in [b for b in work if b.key == key and False]:\n",
          ("tests/broker/test_retained_pacing.py::"
           "test_a_resubscribe_replaces_what_its_filter_was_owed",)),
        m("admin27-sink-no-tls", "Spark sink: caFile / mqtts:// ignored (plain TCP to a TLS "
          "listener)", "spark_connector/mqtt.py",
          "                if self._tls is not None:\n                    sock = self._wrap(",
          "                if False:\n                    sock = self._wrap(",
          (f"{SA}::test_sink_over_tls_and_its_refusal",)),
        m("admin27-sink-auth-vague", "Spark sink: a refused login reported as a bare reason "
          "code", "spark_connector/mqtt.py",
          "                if body[1] in (0x86, 0x87):  # bad user name or password, not",
          "                if False:  # bad user name or password, not",
          (f"{SA}::test_sink_over_tls_and_its_refusal",)),
    )
