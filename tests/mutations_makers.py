"""Planted bugs for the compiled Message/Delivery makers and the whole-packet QoS 1/2 encoder
(``broker/protocol/_speedups.c`` ``slot_maker``, ``publish_packet_pid``; issue 25, logged
QoS 1), and for the bench generator's publisher ids (``tests/mutate.py makers-``). The C
plants rebuild the copy's extensions (tests/mutate.py); each is caught by
tests/protocol/test_slot_maker.py, the Python ones by the broker and bench tests."""

from __future__ import annotations

from typing import Any

SM = "tests/protocol/test_slot_maker.py"
C = "broker/protocol/_speedups.c"


def makers_mutations(mutation: Any) -> tuple[Any, ...]:
    m = mutation
    return (
        m("makers-fields-shifted", f"{C} slot_maker: each argument stored one field early "
          "(the first two land in one slot)", C,
          "        Py_SETREF(*(PyObject **)((char *)obj + mk->field_offset[j]), "
          "Py_NewRef(args[j]));\n",
          "        Py_SETREF(*(PyObject **)((char *)obj + mk->field_offset[j ? j - 1 : 0]), "
          "Py_NewRef(args[j]));\n", (SM,)),
        m("makers-object-leaked", f"{C} slot_maker: every made object keeps one reference "
          "too many (never freed)", C,
          "        Py_SETREF(*(PyObject **)((char *)obj + mk->field_offset[j]), "
          "Py_NewRef(args[j]));\n    return obj;\n",
          "        Py_SETREF(*(PyObject **)((char *)obj + mk->field_offset[j]), "
          "Py_NewRef(args[j]));\n    Py_INCREF(obj);\n    return obj;\n", (SM,)),
        m("makers-mutable-template", f"{C} slot_maker: a template's mutable default accepted "
          "(shared by every instance made)", C,
          "        if (v == NULL || !immutable_scalar(v)) {\n",
          "        if (v == NULL) {\n", (SM,)),
        m("makers-pid-bytes-swapped", f"{C} publish_packet_pid: the packet id's two bytes "
          "swapped (a QoS 1 copy acked under another id)", C,
          "    w[hl + tl] = (char)(pid >> 8);\n    w[hl + tl + 1] = (char)(pid & 255);\n",
          "    w[hl + tl + 1] = (char)(pid >> 8);\n    w[hl + tl] = (char)(pid & 255);\n",
          (SM,)),
        m("makers-bench-shared-pub-ids", "bench/loadgen.py w_pub0: every publisher process "
          "names its connections <tag>-pub-<i> (two processes take each other's sessions "
          "over)", "bench/loadgen.py",
          '''f"{p['tag']}-pub{base}", len(topics), None)''',
          '''f"{p['tag']}-pub", len(topics), None)''',
          ("tests/bench/test_cluster_bench.py::"
           "test_two_publisher_processes_keep_their_connections",)),
    )
