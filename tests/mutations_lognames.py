"""Planted bugs for the commit log's names and its high-water-mark API (issue 26, the
commit-log part), run by ``tests/mutate.py`` like every other guard
(``tests/mutate.py lognames-``). Each test of
``tests/commitlog/test_commitlog_high_watermark.py`` is named by at least one; so are the
deprecated aliases of the renamed fetch API fields (kept one release: removing one early
breaks Spark jobs and dashboards) and the Spark client's reading of a previous-release
server.
"""

from __future__ import annotations

from typing import Any

HW = "tests/commitlog/test_commitlog_high_watermark.py"
PER_COMMIT = HW + "::test_waiters_fire_per_commit_once_their_record_is_committed"
FAILED = HW + "::test_a_failed_write_gives_its_error_to_the_waiters_and_never_a_success"
FETCH = "tests/meshmq/test_fetch_api.py::test_list_info_and_records"
MANY = "tests/meshmq/test_fetch_many.py::test_thousand_devices_in_one_request_with_reasons"
SPARK_OLD = ("tests/spark_connector/test_client_paging.py::"
             "test_ranges_from_a_server_of_the_previous_release")


def lognames_mutations(mutation: Any) -> tuple[Any, ...]:
    """The mutations, built with tests/mutate.py's ``Mutation`` class (passed in: no cycle)."""
    m = mutation
    return (
        m("lognames-hw-wake-at-log-end",
          "commitlog/store.py _wake: waiters woken up to the log end (appends not yet "
          "durable) instead of the high-water mark",
          "commitlog/store.py",
          "                call_all(self._waiters.take_ready(dev.key, dev.high_watermark),\n",
          "                call_all(self._waiters.take_ready(dev.key, dev.next),\n",
          (PER_COMMIT + "[c]", PER_COMMIT + "[py]")),
        m("lognames-hw-rollback-generic-error",
          "commitlog/store.py rollback: waiters get a made-up EIO, not the write's own error",
          "commitlog/store.py",
          "        exc = cause if cause is not None else LogWriteError(\n",
          "        exc = LogWriteError(\n",
          (FAILED,)),
        m("lognames-hw-late-waiter-waits",
          "commitlog/groupcommit.py when_high_watermark: a waiter for a rolled-back record "
          "waits for the next record appended at its offset (acked for another record)",
          "commitlog/groupcommit.py",
          "        if offset >= store.log_end(key):\n",
          "        if False:\n",
          (FAILED,)),
        # ---------------------------------------------- external names and their aliases
        m("lognames-fetch-drops-deprecated-names",
          "meshmq/fetch_api.py: the listing and device info drop the deprecated start/end "
          "a release early (Spark jobs and scripts reading them break)",
          "meshmq/fetch_api.py",
          '            "start": log_start, "end": high_watermark}\n',
          "            }\n",
          (FETCH,)),
        m("lognames-fetch-drops-deprecated-headers",
          "meshmq/fetch_api.py: X-Meshmq-End no longer sent, a release early",
          "meshmq/fetch_api.py",
          '        "X-Meshmq-End": str(end),  # deprecated name, one release\n', "",
          (FETCH,)),
        m("lognames-section-log-end-alias",
          "commitlog/fetch.py: the deprecated DeviceFetch.log_end answers the high-water "
          "mark instead of the durable end it always was",
          "commitlog/fetch.py",
          "        return self.durable_end\n", "        return self.high_watermark\n",
          (MANY,)),
        m("lognames-spark-new-names-only",
          "spark_connector/client.py: a listing from a previous-release server (start/end "
          "only) is not read",
          "spark_connector/client.py",
          '    return (int(entry["log_start"] if "log_start" in entry else entry["start"]),\n',
          '    return (int(entry["log_start"]),\n',
          (SPARK_OLD,)),
    )
