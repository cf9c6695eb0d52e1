"""Planted bugs for readers that meet a corrupt record (issue 28, item 7), run by
``tests/mutate.py`` like every other guard (``tests/mutate.py corrupt-read``).

Each test of ``tests/broker/test_log_corruption_readers.py``,
``tests/commitlog/test_commitlog_read_salvage.py``, ``tests/cluster/test_corrupt_remote_read.py``
and ``tests/spark_connector/test_source_corrupt.py`` is named by at least one mutation it must
catch. Kept in their own module so work going on side by side does not fight over one tuple.
"""

from __future__ import annotations

from typing import Any

RD = "tests/broker/test_log_corruption_readers.py"
CASE = RD + "::test_flipped_byte_after_clean_shutdown_is_skipped_by_every_reader"
SP = ("tests/spark_connector/test_source_corrupt.py::"
      "test_corrupt_record_fails_or_is_skipped_per_fail_on_data_loss")
ST = "commitlog/store.py"
SV = "tests/commitlog/test_commitlog_read_salvage.py"
XR = "tests/cluster/test_corrupt_remote_read.py::test_remote_catch_up_goes_on_past_a_corrupt_record"
XF = ("tests/cluster/test_corrupt_remote_read.py::"
      "test_corrupt_record_in_the_owners_log_is_read_around_from_another_node")
SVC = SV + "::test_every_read_path_skips_a_damaged_record_found_after_a_clean_close"


def corrupt_mutations(mutation: Any) -> tuple[Any, ...]:
    """The mutations, built with tests/mutate.py's ``Mutation`` class (passed in: no cycle)."""
    m = mutation
    return (
        m("corrupt-read-no-salvage", "store: a reader that meets a corrupt record raises (the "
          "fetch API's 500, a closed replay) instead of quarantining it and reading around it",
          ST, "                if not self._salvage(dev, getattr(exc, \"want\", offset), exc):\n",
          "                if True:\n", (f"{CASE}[payload]",)),
        m("corrupt-read-length-no-salvage", "the same, for a damaged length field",
          ST, "                if not self._salvage(dev, getattr(exc, \"want\", offset), exc):\n",
          "                if True:\n", (f"{CASE}[length]",)),
        m("corrupt-read-catchup-no-salvage", "the same, met by a persistent session catching "
          "up after a restart", ST,
          "                if not self._salvage(dev, getattr(exc, \"want\", offset), exc):\n",
          "                if True:\n",
          (RD + "::test_offline_persistent_session_catches_up_around_a_corrupt_record",)),
        m("corrupt-read-catchup-uncounted", "catch-up: offsets lost to a corrupt record "
          "skipped without counting them as dropped", "broker/catchup.py",
          "                        stats.dropped(DropReason.CORRUPT, rec.offset - c.next)\n",
          "                        pass\n",
          (RD + "::test_offline_persistent_session_catches_up_around_a_corrupt_record",)),
        m("corrupt-read-remote-catchup-stalls", "remote catch-up: a read answered from past "
          "where it asked (the owner skipped lost offsets) is taken for a cursor that moved "
          "back, read again forever", "broker/cursors.py",
          "offset > c.next and asked != c.next:", "offset > c.next:", (XR + "[256]",)),
        m("corrupt-read-remote-no-salvage", "the same, read from another node over the mesh",
          ST, "                if not self._salvage(dev, getattr(exc, \"want\", offset), exc):\n",
          "                if True:\n", (XF,)),
        m("corrupt-read-remote-replay-uncounted", "remote replay: offsets lost in the owner's "
          "log skipped without counting them as dropped", "broker/cursors.py",
          "            self.stats.dropped(DropReason.CORRUPT, to - c.next)\n",
          "        pass\n", (XF,)),
        m("corrupt-read-remote-replay-tail-uncounted", "remote replay: offsets the owner lost "
          "at its log's end skipped without counting them as dropped", "broker/cursors.py",
          "        self.skip_lost(session, c, at)\n",
          "        c.next = max(c.next, at)\n",
          (XF + "[299]",)),
        m("corrupt-read-tail-gap-stops", "fetch API: a gap that ends the read is not followed "
          "(next_offset stays on the lost offset)", "meshmq/fetch_api.py",
          "            if past <= nxt:\n", "            if True:\n", (f"{CASE}[tail]",)),
        m("corrupt-read-gap-not-saved", "store: a gap a reader found is not written to "
          "gaps.json, so a restart reports the same loss as new corruption", ST,
          "            _q.save_gaps(self.directory, stored)\n        except OSError as err:\n"
          "            log.error(\"commitlog %s: cannot record the gap",
          "            pass\n        except OSError as err:\n"
          "            log.error(\"commitlog %s: cannot record the gap", (f"{CASE}[payload]",)),
        m("corrupt-read-replay-uncounted", "replay: offsets lost to corruption skipped without "
          "counting them as dropped", "broker/cursors.py",
          "            self.stats.dropped(DropReason.CORRUPT, to - c.next)\n",
          "        pass\n", (f"{CASE}[payload]",)),
        m("corrupt-read-pidx-walk-unchecked", "store: a sealed segment's rebuilt position "
          "index stops at a damaged header (the records after it unread)", ST,
          "                idx = _salvage.verified_positions(data, _new_positions)\n",
          "                pass\n", (f"{SVC}[py-length_small-sealed-no_pidx]",)),
        m("corrupt-read-positions-no-step", "store: the position read does not step over a "
          "bad range a reader already met", ST,
          "                    if bad and base + s + p in bad:\n",
          "                    if False:\n", (f"{SVC}[py-offset-sealed-pidx]",)),
        m("corrupt-read-scan-no-step", "store: the header-walk fallback does not step over a "
          "bad range a reader already met (a damaged length derails it)", ST,
          "                    if bad and pos + p in bad:\n", "                    if False:\n",
          (f"{SVC}[py-length-active-scan]",)),
        m("corrupt-read-active-walk-unchecked", "store: the active segment's positions rebuilt "
          "at open stop at a damaged header (later records silently unread)", ST,
          "                        entries = _salvage.verified_positions(head, _new_positions)\n",
          "                        pass\n", (f"{SVC}[py-magic-active-scan]",)),
        m("corrupt-read-misattributed", "store: a reader's walk reports another device's "
          "damaged record (its header names that device) as its own loss too", ST,
          "        ours = [(a, b) for a, b, other in after if not other] or",
          "        ours = [(a, b) for a, b, other in after] or",
          (f"{SV}::test_each_reader_reports_only_its_own_loss",)),
        m("corrupt-read-spark-ignores-loss", "Spark source: a lost range is skipped with a "
          "warning even with failOnDataLoss=true", "spark_connector/source.py",
          "    if opts.fail_on_data_loss:\n        raise _data_loss(device, lo, hi, why)\n",
          "    if False:\n        raise _data_loss(device, lo, hi, why)\n", (SP,)),
    )
