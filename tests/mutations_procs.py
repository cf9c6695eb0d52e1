"""Planted bugs for issue 28's process defects (6, 8, 10): orphan routers, one process per
data directory, dev-cluster's port checks, readiness and environment. Run by ``tests/mutate.py``
like every other guard (``tests/mutate.py procs-``); kept in a module of its own so work going
on side by side does not fight over one tuple."""

from __future__ import annotations

from typing import Any

LOCK = "tests/meshmq/test_data_dir_lock.py"
ORPHAN = "tests/cluster/test_orphan_routers.py"
DEVC = "tests/cluster/test_dev_cluster_checks.py"
DC = "meshmq/devcluster.py"


def procs_mutations(mutation: Any) -> tuple[Any, ...]:
    """The mutations, built with tests/mutate.py's ``Mutation`` class (passed in: no cycle)."""
    m = mutation
    return (
        # ------------------------------------------------------------ one process per data_dir
        m("procs-no-datadir-lock", "a single node takes no lock on its data_dir (the second "
          "serve fails later, exit 1, on the commit log's LOCK, naming no PID)",
          "meshmq/node.py",
          "        return DataDirLock.acquire(self.config.data_dir)\n",
          "        return DataDirLock(self.config.data_dir)\n",
          (f"{LOCK}::test_second_serve_on_a_data_dir_in_use_exits_2_naming_it",)),
        m("procs-stale-lock-blocks", "the lock is a PID file: one left by a kill -9'd node "
          "blocks its restart", "meshmq/dirlock.py",
          "            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\n",
          "            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\n"
          "            if os.pread(fd, 1, 0):\n"
          "                raise BlockingIOError(errno.EWOULDBLOCK, 'pid file present')\n",
          (f"{LOCK}::test_lock_file_left_by_a_killed_node_does_not_block_a_restart",)),
        m("procs-commitlog-in-use-exit-1", "a commitlog.dir in use by another node exits 1 "
          "(systemd restarts into it) without naming the key", "meshmq/node.py",
          "            if isinstance(err.__cause__, BlockingIOError):\n",
          "            if False:\n",
          (f"{LOCK}::test_second_serve_on_a_commitlog_dir_in_use_exits_2_naming_the_key",)),
        m("procs-supervisor-no-lock", "a cluster node's supervisor does not lock its data_dir "
          "(it waits 30 s on the first node's router stores, then exits 2 naming a router)",
          "meshmq/cluster_node.py",
          "        dirlock = DataDirLock.acquire(config.data_dir)\n",
          "        dirlock = DataDirLock(config.data_dir)\n",
          (f"{LOCK}::test_second_cluster_node_on_a_data_dir_in_use_exits_2_before_any_router",)),
        # ------------------------------------------------------------------- orphan routers
        m("procs-orphan-ppid-is-1", "a router orphaned before its prctl checks its parent "
          "against PID 1 (wrong under a subreaper: it runs on)", "meshmq/router_proc.py",
          "    return os.getppid() != supervisor_pid\n", "    return os.getppid() == 1\n",
          (f"{ORPHAN}::test_router_whose_supervisor_died_before_it_started_exits",)),
        m("procs-no-lock-wait", "a router meeting its store held by a draining orphan gives up "
          "at once (kill -9 then restart fails with exit 2)", "meshmq/router_proc.py",
          "LOCK_WAIT_S = ORPHAN_STOP_S + 10.0\n", "LOCK_WAIT_S = 0.0\n",
          (f"{ORPHAN}::test_node_restarted_while_an_orphan_holds_its_store_waits_for_it",)),
        m("procs-supervisor-no-orphan-wait", "the supervisor does not wait for a previous "
          "supervisor's orphans (draining) to free their stores and ports",
          "meshmq/cluster_node.py",
          "            (await acquire_router_store(router_dir(config, r))).release()\n",
          "            pass\n",
          (f"{ORPHAN}::test_node_restarted_while_an_orphan_holds_its_store_waits_for_it",)),
        m("procs-supervisor-no-port-probe", "a cluster node starts its routers on an MQTT port "
          "another node serves (SO_REUSEPORT shares it)", "meshmq/cluster_node.py",
          "    taken = listener_conflicts(config.broker.listeners)\n",
          "    taken: list[tuple[str, str, str]] = []\n",
          (f"{ORPHAN}::test_node_on_a_port_another_node_serves_exits_1_before_any_router",)),
        # ---------------------------------------------------------------------- dev-cluster
        m("procs-dev-no-port-check", "dev-cluster starts its nodes without checking their "
          "ports", DC, "    if taken:\n        for line in taken:\n",
          "    if False:\n        for line in taken:\n",
          (f"{DEVC}::test_port_of_a_running_broker_exits_2_naming_it_and_starts_nothing",
           f"{DEVC}::test_taken_mesh_port_of_the_last_node_exits_2_naming_it")),
        m("procs-dev-ready-any-pid", "dev-cluster accepts any 200 from a node's admin port as "
          "the node ready", DC, "            if pid != node.proc.pid:\n",
          "            if False:\n",
          (f"{DEVC}::test_ready_answer_from_another_process_is_not_the_node",)),
        m("procs-dev-env-dropped", "dev-cluster drops the MESHMQ_ variables it says it passes",
          DC, "        if why is None:\n            env[name] = value\n",
          "        if why is None:\n",
          (f"{DEVC}::test_meshmq_variables_reach_every_node_except_per_node_keys",)),
        m("procs-dev-env-per-node-passed", "dev-cluster passes per-node keys (every node on one "
          "MQTT port)", DC, "        why = _PER_NODE.get(key)\n",
          "        why = None and _PER_NODE.get(key)\n",
          (f"{DEVC}::test_meshmq_variables_reach_every_node_except_per_node_keys",)),
        m("procs-dev-no-dir-lock", "a second dev-cluster on a --dir in use rewrites the "
          "running nodes' configs and starts nodes on their data", DC,
          "        dirlock = DataDirLock.acquire(str(root))\n",
          "        dirlock = DataDirLock(str(root))\n        root.mkdir(parents=True, "
          "exist_ok=True)\n",
          (f"{DEVC}::test_second_dev_cluster_on_one_dir_exits_2_and_leaves_the_first_alone",)),
        m("procs-dev-env-not-validated", "dev-cluster starts nodes with a bad MESHMQ_ value "
          "(each fails on its own)", DC,
          "        load_config(str(nodes[0].config_path), env)\n", "        pass\n",
          (f"{DEVC}::test_bad_meshmq_value_exits_2_before_any_node_starts",)),
    )
