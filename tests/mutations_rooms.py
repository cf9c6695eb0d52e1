"""Planted bugs for the router's walls (issue 26, the broker/ part): the lint rules of
``tests/test_lint.py`` that keep the router entered through its port, small, and the broker/
import graph one way (``tests/mutate.py rooms-``).
"""

from __future__ import annotations

from typing import Any

LINT = "tests/test_lint.py"


def rooms_mutations(mutation: Any) -> tuple[Any, ...]:
    """The mutations, built with tests/mutate.py's ``Mutation`` class (passed in: no cycle)."""
    m = mutation
    return (
        m("rooms-private-access", "shared.py reaches a private router name (router._deliver) "
          "instead of the port's deliver", "broker/shared.py",
          "        self.router.deliver(session, msg, sub.qos, False, ids, group)\n",
          "        self.router._deliver(session, msg, sub.qos, False, ids, group)\n",
          (f"{LINT}::test_nothing_outside_the_router_touches_its_private_names",)),
        m("rooms-router-grows", "router.py grows past 500 lines (200 lines of new logic "
          "planted in it instead of a room)", "broker/router.py",
          "_FLUSH_EVERY = 16\n",
          "_FLUSH_EVERY = 16\n" + "# more logic\n" * 200,
          (f"{LINT}::test_router_py_stays_small",)),
        m("rooms-import-cycle", "session.py names the router's type again (a TYPE_CHECKING "
          "import: the broker/ circle comes back)", "broker/session.py",
          "if TYPE_CHECKING:\n    from broker.connection import Connection\n",
          "if TYPE_CHECKING:\n    from broker.connection import Connection\n"
          "    from broker.router import Router\n",
          (f"{LINT}::test_broker_imports_go_one_way",)),
    )
