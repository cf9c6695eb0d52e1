"""Planted bugs for issue 28's process defects (6, 8, 10): orphan routers, one process per
data directory, dev-cluster's port checks, readiness and environment. Run by ``tests/mutate.py``
like every other guard (``tests/mutate.py procs-``); kept in a module of its own so work going
on side by side does not fight over one tuple."""

from __future__ import annotations

from typing import Any

LOCK = "tests/meshmq/test_data_dir_lock.py"
ORPHAN = "tests/cluster/test_orphan_routers.py"


def procs_mutations(mutation: Any) -> tuple[Any, ...]:
    """The mutations, built with tests/mutate.py's ``Mutation`` class (passed in: no cycle)."""
    m = mutation
    return (
        # ------------------------------------------------------------ one process per data_dir
        m("procs-no-datadir-lock", "a single node takes no lock on its data_dir (the second "
          "serve fails later, exit 1, on the commit log's LOCK, naming no PID)",
          "meshmq/node.py",
          "            self._dirlock = DataDirLock.acquire(self.config.data_dir)\n",
          "            pass\n",
          (f"{LOCK}::test_second_serve_on_a_data_dir_in_use_exits_2_naming_it",)),
        m("procs-stale-lock-blocks", "the lock is a PID file: one left by a kill -9'd node "
          "blocks its restart", "meshmq/dirlock.py",
          "            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\n",
          "            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\n"
          "            if os.pread(fd, 1, 0):\n"
          "                raise BlockingIOError(errno.EWOULDBLOCK, 'pid file present')\n",
          (f"{LOCK}::test_lock_file_left_by_a_killed_node_does_not_block_a_restart",)),
        m("procs-supervisor-no-lock", "a cluster node's supervisor does not lock its data_dir "
          "(its routers start, then meet the first node's router locks)",
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
    )
