"""Offline verification of a store directory (``meshmq log inspect PATH`` calls this).

Reads segment files directly (no lock, no recovery, changes nothing), so it can be run
on a live node's data or a copy of a broken one to see what recovery would do.
"""

from __future__ import annotations

import os
import sys
import zlib
from dataclasses import dataclass, field

from commitlog import epochs as _ep
from commitlog.quarantine import QUARANTINE_DIR, load_gaps, next_valid_record
from commitlog.record import FLAG_CONTROL, HEADER, HEADER_SIZE, frame_end
from commitlog.store import CHECKPOINT_NAME, SEGMENT_SUFFIX


@dataclass
class KeySummary:
    """What one key holds across the segments."""

    records: int = 0
    first_offset: int = -1
    last_offset: int = -1
    truncations: int = 0
    # Leader epoch table as recovery would replay it: [(epoch, start offset)]
    epochs: list[tuple[int, int]] = field(default_factory=list)


@dataclass
class SegmentReport:
    """One segment file: records found and where (if anywhere) verification stopped."""

    path: str
    base: int
    size: int
    records: int = 0
    valid_bytes: int = 0
    corrupt_at: int | None = None  # byte offset in the file
    corrupt_reason: str = ""
    # Bad ranges with intact records after them: (start, end, reason, quarantined), byte
    # offsets in the file; quarantined = recovery already copied them to quarantine/ and
    # skips them (not counted as corrupt any more).
    ranges: list[tuple[int, int, str, bool]] = field(default_factory=list)


@dataclass
class InspectReport:
    """Result of :func:`inspect`; ``ok`` is False if any segment has a bad record."""

    path: str
    segments: list[SegmentReport] = field(default_factory=list)
    keys: dict[str, KeySummary] = field(default_factory=dict)
    checkpoint_present: bool = False
    quarantine_files: list[tuple[str, int]] = field(default_factory=list)
    gaps: dict[str, list[tuple[int, int]]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True when every byte of every segment verified or was already quarantined."""
        return all(s.corrupt_at is None and all(r[3] for r in s.ranges)
                   for s in self.segments)

    @property
    def total_records(self) -> int:
        """Records across all segments."""
        return sum(s.records for s in self.segments)

    def format(self, max_keys: int = 50) -> str:
        """Human-readable report."""
        lines = [f"store {self.path}: {len(self.segments)} segments, {self.total_records} "
                 f"records, {len(self.keys)} keys, checkpoint "
                 f"{'present' if self.checkpoint_present else 'absent'}"]
        for s in self.segments:
            state = "ok" if s.corrupt_at is None else (
                f"CORRUPT at byte {s.corrupt_at} ({s.corrupt_reason}); "
                f"{s.size - s.corrupt_at} bytes after it")
            lines.append(f"  {os.path.basename(s.path)} base={s.base} size={s.size} "
                         f"records={s.records} {state}")
            for a, b, why, quarantined in s.ranges:
                what = ("quarantined (skipped by recovery)" if quarantined else
                        "CORRUPT, intact records after it: recovery will quarantine it")
                lines.append(f"    bytes {a}..{b} ({b - a} bytes, {why}): {what}")
        for name, size in self.quarantine_files:
            lines.append(f"  quarantine/{name}: {size} bytes")
        for k, ranges in sorted(self.gaps.items()):
            lost = ", ".join(f"{lo}..{hi - 1}" for lo, hi in ranges)
            lines.append(f"  key {k!r}: offsets lost to quarantined corruption: {lost}")
        for i, (k, ks) in enumerate(sorted(self.keys.items())):
            if i >= max_keys:
                lines.append(f"  ... {len(self.keys) - max_keys} more keys")
                break
            extra = f" truncations={ks.truncations}" if ks.truncations else ""
            if ks.epochs:
                extra += " epochs " + " ".join(f"{e}@{s}" for e, s in ks.epochs)
            lines.append(f"  key {k!r}: records={ks.records} offsets "
                         f"{ks.first_offset}..{ks.last_offset}{extra}")
        lines.append("RESULT: " + ("ok" if self.ok else "CORRUPT (recovery truncates a torn "
                                   "tail and quarantines a corrupt range with intact records "
                                   "after it)"))
        return "\n".join(lines)


def inspect(path: str) -> InspectReport:
    """Verify every record's length and CRC, segment by segment; summarise keys."""
    rep = InspectReport(path, checkpoint_present=os.path.exists(
        os.path.join(path, CHECKPOINT_NAME)))
    names = sorted(n for n in os.listdir(path)
                   if n.endswith(SEGMENT_SUFFIX) and n[: -len(SEGMENT_SUFFIX)].isdigit())
    known: set[tuple[int, int]] = set()  # (store position, bytes) of quarantined ranges
    qdir = os.path.join(path, QUARANTINE_DIR)
    if os.path.isdir(qdir):
        for qn in sorted(os.listdir(qdir)):
            if qn.endswith(".bad"):
                rep.quarantine_files.append((qn, os.path.getsize(os.path.join(qdir, qn))))
                parts = qn[:-4].rsplit("-", 3)
                if len(parts) == 4 and parts[2].isdigit() and parts[3].isdigit():
                    known.add((int(parts[2]), int(parts[3])))
        rep.gaps = load_gaps(path)
    for si, name in enumerate(names):
        fp = os.path.join(path, name)
        with open(fp, "rb") as f:
            data = f.read()
        sr = SegmentReport(fp, int(name[: -len(SEGMENT_SUFFIX)]), len(data))
        mv = memoryview(data)
        p = 0
        n = len(data)
        while p < n:
            reason = ""
            if n - p < HEADER_SIZE:
                reason = "truncated header"
            else:
                (length, crc, magic, flags, _a, off, _ts, kl, _tl, _hc) = HEADER.unpack_from(
                    data, p)
                end = frame_end(length, magic, p, n)
                if end < 0:
                    reason = "bad length/magic or torn record"
                elif zlib.crc32(mv[p + 8 : end]) != crc:
                    reason = "CRC mismatch"
            if reason:
                q = next_valid_record(data, p)
                if q < 0 and si + 1 < len(names):
                    q = n  # later segments: not the log's tail
                if q < 0:
                    sr.corrupt_at = p  # a torn tail: recovery truncates here
                    sr.corrupt_reason = reason
                    break
                sr.ranges.append((p, q, reason, (sr.base + p, q - p) in known))
                p = q
                continue
            key = data[p + HEADER_SIZE : p + HEADER_SIZE + kl].decode(errors="replace")
            ks = rep.keys.get(key)
            if ks is None:
                ks = rep.keys[key] = KeySummary()
            if flags & _ep.FLAG_EPOCH:
                try:
                    epoch = _ep.parse_epoch_payload(mv[p + HEADER_SIZE + kl : end])
                except ValueError:
                    epoch = -1
                entries = [(e, s, 0, 0) for e, s in ks.epochs]
                _ep.assign(entries, (epoch, off, 0, 0))
                ks.epochs = [(e[0], e[1]) for e in entries]
            elif flags & FLAG_CONTROL:
                ks.truncations += 1
                ks.last_offset = off - 1
                _ks_entries = [(e, s, 0, 0) for e, s in ks.epochs]
                _ep.truncate_from(_ks_entries, off)
                ks.epochs = [(e[0], e[1]) for e in _ks_entries]
            else:
                ks.records += 1
                if ks.first_offset < 0:
                    ks.first_offset = off
                ks.last_offset = off
                sr.records += 1
            p = end
        sr.valid_bytes = p
        mv.release()
        rep.segments.append(sr)
    return rep


def main(argv: list[str] | None = None) -> int:
    """``python -m commitlog.inspect PATH``: print the report; exit 1 if corrupt."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m commitlog.inspect STORE_DIR", file=sys.stderr)
        return 2
    rep = inspect(args[0])
    print(rep.format())
    return 0 if rep.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
