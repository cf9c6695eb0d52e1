"""Planted bugs for the review of the merged ``outcomes`` branch (issue 28: an APPEND's outcome
reaches the publisher exactly once; ``cluster.append_timeout``), run by ``tests/mutate.py``
like every other guard (``tests/mutate.py review2-``). Each names the test that must catch it.
"""

from __future__ import annotations

from typing import Any

Q2 = "tests/cluster/test_review2_qos2_resume.py"
Q2T = Q2 + "::test_a_qos2_resend_after_reconnect_is_answered_whatever_the_owner_says"
Q2V4 = Q2 + "::test_a_311_qos2_publish_refused_by_disconnect_can_be_resent"
LOCAL = "tests/broker/test_review2_qos2_refused_311.py"


def review2_mutations(mutation: Any) -> tuple[Any, ...]:
    """The mutations, built with tests/mutate.py's ``Mutation`` class (passed in: no cycle)."""
    m = mutation
    return (
        m("review2-qos2-pending-after-close", "a QoS 2 publish's remote outcome arriving after "
          "its connection closed leaves the packet id pending in the session forever",
          "broker/forwarding.py",
          "        if msg.qos == 2 and conn.closing and conn.session is not None:\n",
          "        if False:\n", (f"{Q2T}[refused]", f"{Q2T}[stored-late]")),
        m("review2-qos2-late-store-not-told", "a QoS 2 publish stored after its connection "
          "closed: the session's live connection is not sent its PUBREC",
          "broker/forwarding.py",
          "            if live is not None:\n                props = (",
          "            if False:\n                props = (",
          (f"{Q2T}[stored-late]",)),
        m("review2-qos2-311-refused-pending", "a 3.1.1 QoS 2 publish refused as not stored "
          "(connection closed, no negative PUBREC in 3.1.1) leaves its packet id pending in "
          "the session: the client's resend after reconnecting is swallowed for good",
          "broker/ingest.py",
          "        if qos == 2 and conn is not None and conn.session is not None:\n"
          "            # the id is",
          "        if False:\n            # the id is",
          (f"{LOCAL}::test_a_311_qos2_publish_refused_by_the_log_can_be_resent", Q2V4)),
        m("review2-qos2-local-stored-after-close", "a QoS 2 publish stored in the local log after "
          "its connection closed leaves its packet id pending in the resumed session: the "
          "client's resend is swallowed for good",
          "broker/ingest.py",
          "                if msg.qos == 2 and conn.closing and conn.session is not None:\n"
          "                    # its resumed session",
          "                if False:\n                    # its resumed session",
          (f"{LOCAL}::test_a_qos2_publish_stored_after_its_connection_closed_is_answered_on_resume",)),
    )
