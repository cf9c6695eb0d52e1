"""Planted bugs for review8's attack on issue 25's single-node speed change
(``tests/mutate.py review8-``): the shape cache's bound (``broker/message.py``
``MAX_SHAPES``) and what else the review found."""

from __future__ import annotations

from typing import Any

SHAPES = "tests/broker/test_shape_cache.py"
RESUB = f"{SHAPES}::test_resubscribing_to_a_large_retained_message_does_not_grow_the_broker"
IDS = f"{SHAPES}::test_each_qos0_copy_of_one_message_carries_its_own_ids_and_remaining_expiry"
STALE = ("tests/broker/test_stale_speedups.py::"
         "test_a_stale_codec_extension_runs_the_pure_python_codec_and_says_so")
KEY0 = "        key = (v5, -1, retain, sub_ids, remaining, position)"


def review8_mutations(mutation: Any) -> tuple[Any, ...]:
    """The mutations, built with tests/mutate.py's ``Mutation`` class (passed in: no cycle)."""
    m = mutation
    return (
        m("review8-shapes-unbounded", "broker/message.py packet0: every QoS 0 shape cached, "
          "unbounded (a retained message grows a payload copy per Subscription Identifier)",
          "broker/message.py",
          "            data = publish_packet0(self.topic, self.payload, retain, props, "
          "5 if v5 else 4)\n            if not shapes or len(shapes) < MAX_SHAPES:\n",
          "            data = publish_packet0(self.topic, self.payload, retain, props, "
          "5 if v5 else 4)\n            if True:\n",
          (f"{RESUB}[0]",)),
        m("review8-parts-unbounded", "broker/message.py parts: every QoS 1/2 shape cached, "
          "unbounded (the same growth for a retained copy sent at QoS 1)",
          "broker/message.py",
          "            if not shapes or len(shapes) < MAX_SHAPES:  "
          "# (no len() call for the first)\n"
          "                shapes[key] = parts\n",
          "            if True:\n                shapes[key] = parts\n",
          (f"{RESUB}[1]",)),
        m("review8-packet0-key-no-ids", "broker/message.py packet0: the shape key leaves out "
          "the subscription ids (every v5 subscriber gets the first one's identifiers)",
          "broker/message.py", KEY0, "        key = (v5, -1, retain, None, remaining, position)",
          (IDS,)),
        m("review8-packet0-key-no-remaining", "broker/message.py packet0: the shape key "
          "leaves out the remaining expiry (a later retained copy carries a stale interval)",
          "broker/message.py", KEY0, "        key = (v5, -1, retain, sub_ids, 0, position)",
          (IDS,)),
        m("review8-stale-speedups-used", "broker/protocol/codec.py: a codec extension built "
          "from an older _speedups.c (no publish_packet) is imported as is (every start dies "
          "with AttributeError)",
          "broker/protocol/codec.py",
          "if _speedups is not None and not all(\n",
          "if False and not all(\n",
          (STALE,)),
    )
