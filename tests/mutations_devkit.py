"""Planted bugs for the N-router ``scale`` group of ``python -m bench.cluster`` (bench/scale.py,
``--routers``/``--pairs``), run by ``tests/mutate.py devkit-``. Each names the test that must
catch it."""

from __future__ import annotations

from typing import Any

T = "tests/bench/test_cluster_bench.py"
RUN = T + "::test_scale_group_runs_every_router_count"
SHAPE = T + "::test_scale_generator_grows_with_the_pairs"


def devkit_mutations(mutation: Any) -> tuple[Any, ...]:
    """The mutations, built with tests/mutate.py's ``Mutation`` class (passed in: no cycle)."""
    m = mutation
    return (
        m("devkit-scale-two-routers-only", "scale: only the first two router counts run "
          "(the historic r1/r2 pair)", "bench/scale.py",
          "    return list(routers) if rnd % 2 == 0 else list(reversed(routers))\n",
          "    return list(routers)[:2] if rnd % 2 == 0 else list(reversed(routers))[:2]\n",
          (SHAPE,)),
        m("devkit-scale-pairs-ignored", "scale: --pairs parsed but the runs keep 32 pairs",
          "bench/cluster.py", "{w: run_pairs(cl, mode, args.pairs)}", "{w: run_pairs(cl, mode)}",
          (RUN,)),
        m("devkit-scale-one-publisher", "scale: one publisher process whatever the pairs "
          "(the generator the ceiling at 8 routers)", "bench/scale.py",
          "    groups = max(1, -(-pairs // PAIRS_PER_PUBLISHER))\n", "    groups = 1\n",
          (SHAPE,)),
        m("devkit-scale-no-table", "scale: the per-N table not printed", "bench/cluster.py",
          "        out.append(scale.table(doc))\n", "        pass\n", (RUN,)),
    )
