"""Planted bugs for the review of issue 28's merged branches (procs, mqttfix, corrupt), run by
``tests/mutate.py`` like every other guard (``tests/mutate.py review1``).

Each test added by that review is named by at least one mutation it must catch. Kept in its own
module so work going on side by side does not fight over one tuple.
"""

from __future__ import annotations

from typing import Any

ST = "commitlog/store.py"
DL = "meshmq/dirlock.py"
FD = ("tests/meshmq/test_data_dir_lock_full_disk.py::"
      "test_node_on_a_full_disk_starts_and_still_holds_its_lock")
SRC = "spark_connector/source.py"
SE = ("tests/spark_connector/test_source_corrupt_edges.py::"
      "test_corrupt_first_or_last_record_fails_or_is_skipped")
QO = ("tests/commitlog/test_salvage_quarantine_once.py::"
      "test_a_range_many_devices_lost_records_in_is_quarantined_once")
LU = ("tests/meshmq/test_data_dir_lock_unopenable.py::"
      "test_lock_file_that_cannot_be_opened_exits_2_naming_it")
SL = "broker/statelog.py"
SC = ("tests/broker/test_state_log_corrupt_counted.py::"
      "test_lost_retained_record_is_counted_at_restart")
WB = ("tests/commitlog/test_salvage_walk_bound.py::"
      "test_salvage_of_a_quiet_devices_last_record_reads_only_its_segments")


def review1_mutations(mutation: Any) -> tuple[Any, ...]:
    """The mutations, built with tests/mutate.py's ``Mutation`` class (passed in: no cycle)."""
    m = mutation
    return (
        m("review1-salvage-walks-whole-log", "store: a reader's salvage walk reads every later "
          "segment, those holding none of the device's records too (an event-loop stall that "
          "grows with the log)", ST,
          "                if skip and pos != start and not self._holds_device(seg, dev):\n",
          "                if False:\n", (f"{WB}[c]", f"{WB}[py]")),
        m("review1-salvage-walks-active-segment", "store: the salvage walk always reads the "
          "active segment, whether or not it holds the device's records", ST,
          "        j = bisect.bisect_left(dev.idx_pos, seg.base)\n",
          "        if seg is self._segments[-1]:\n            return True\n"
          "        j = bisect.bisect_left(dev.idx_pos, seg.base)\n", (f"{WB}[c]", f"{WB}[py]")),
        m("review1-salvage-quarantine-per-device", "store: a bad range many devices lost "
          "records in is copied to quarantine/ (and counted) once per device", ST,
          "            pieces, covering = _q.uncovered(self._quarantined, a, b)\n",
          "            pieces, covering = [(a, b)], []\n", (f"{QO}[c]", f"{QO}[py]")),
        m("review1-statelog-salvaged-not-counted", "state log replay: records the store "
          "salvaged are not counted in meshmq_persistence_restored{kind=\"corrupt_records\"}",
          SL, "        self.corrupt += sum(hi - lo for lo, hi in store.lost_ranges(",
          "        self.corrupt += 0 * sum(hi - lo for lo, hi in store.lost_ranges(", (SC,)),
        m("review1-dirlock-enospc-fatal", "dirlock: the holder's PID text failing to write "
          "(ENOSPC) kills the start-up with a traceback and exit 1", DL,
          "        except OSError as exc:\n            log.warning(\"%s: locked, but",
          "        except ValueError as exc:\n            log.warning(\"%s: locked, but",
          (FD,)),
        m("review1-dirlock-unopenable-traceback", "dirlock: a lock file that cannot be opened "
          "(another user's) escapes as a traceback and exit 1", DL,
          "        except OSError as exc:\n            # Typically a lock file left by a run",
          "        except ValueError as exc:\n            # Typically a lock file left by a run",
          (LU,)),
        m("review1-spark-first-record-loss-silent", "spark source: offsets lost before the "
          "first record a section serves (offset 0 of a device) are skipped without "
          "failOnDataLoss", SRC,
          "        _corrupt_loss(opts, device, off, min(first, hi))\n",
          "        pass\n", (f"{SE}[first]",)),
        m("review1-spark-last-record-loss-silent", "spark source: offsets lost after a "
          "section's last record (the device's last offset) are skipped without "
          "failOnDataLoss", SRC,
          "        _corrupt_loss(opts, device, nxt, min(sec.next_offset, hi))\n",
          "        pass\n", (f"{SE}[last]",)),
    )
