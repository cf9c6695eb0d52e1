"""Planted bugs for readers that meet a corrupt record (issue 28, item 7), run by
``tests/mutate.py`` like every other guard (``tests/mutate.py corrupt-read``).

Each test of ``tests/broker/test_log_corruption_readers.py`` and
``tests/spark_connector/test_source_corrupt.py`` is named by at least one mutation it must
catch. Kept in their own module so work going on side by side does not fight over one tuple.
"""

from __future__ import annotations

from typing import Any

RD = "tests/broker/test_log_corruption_readers.py"
CASE = RD + "::test_flipped_byte_after_clean_shutdown_is_skipped_by_every_reader"
SP = ("tests/spark_connector/test_source_corrupt.py::"
      "test_corrupt_record_fails_or_is_skipped_per_fail_on_data_loss")
ST = "commitlog/store.py"


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
          "counting them as dropped", "broker/replay.py",
          "        self.stats.dropped(DropReason.CORRUPT, to - cursor.next)\n",
          "        pass\n", (f"{CASE}[payload]",)),
        m("corrupt-read-spark-ignores-loss", "Spark source: a lost range is skipped with a "
          "warning even with failOnDataLoss=true", "spark_connector/source.py",
          "    if opts.fail_on_data_loss:\n        raise _data_loss(device, lo, hi, why)\n",
          "    if False:\n        raise _data_loss(device, lo, hi, why)\n", (SP,)),
    )
