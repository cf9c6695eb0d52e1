"""Commit log micro-benchmarks: ``python -m commitlog.bench [--records N] [--dir PATH]``.

Measures, on one core (the first line says whether the compiled loops of
``commitlog._speedups`` run; ``COMMITLOG_PURE_PYTHON=1`` measures the pure-Python ones):
  * append with one write + one fsync per batch (1000 records across 100 devices, 64-byte
    payloads: what a busy event-loop tick hands the store);
  * the same through GroupCommitter on asyncio (fsync on the worker thread, batches grow);
  * reads: from the tail cache, from disk via the sparse index, and decoding a fetch body
    (records and columnar);
  * replay-style reads of single devices' whole history from disk (1000 and 100 devices
    interleaved, 8 MiB segments), with and without the position index files;
  * replication (issue 14): follower append (a leader's replica stream, 100 devices x 10
    records per batch, one write + one fsync per batch), a many-device fetch body of 100
    devices decoded, and reads of a device after 100 truncations vs one never truncated.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import tempfile
import time

from commitlog.fetch import (
    STATUS_OK,
    decode_fetch_columns,
    decode_fetch_response,
    decode_multi_records,
    encode_fetch_response,
    encode_multi_fetch,
    encode_section,
)
from commitlog.groupcommit import GroupCommitter
from commitlog.record import SPEEDUPS, encode_batch
from commitlog.settings import LogSettings
from commitlog.store import LogStore

PAYLOAD = b"x" * 64


def bench_append(path: str, records: int, batch: int, devices: int) -> tuple[float, int]:
    """Synchronous loop: append ``batch`` records, flush, fsync, commit."""
    keys = [f"device-{i:05d}" for i in range(devices)]
    topics = [f"sensors/{k}/telemetry" for k in keys]
    st = LogStore.open(path, LogSettings())
    ts = time.time_ns() // 1000
    t0 = time.perf_counter()
    n = 0
    append = st.append
    while n < records:
        for j in range(batch):
            d = (n + j) % devices
            append(keys[d], ts, topics[d], 1, None, PAYLOAD)
        n += batch
        st.commit(st.sync() if st.flush() else 0)
    dt = time.perf_counter() - t0
    nbytes = st.stats.append_bytes
    fsyncs = st.stats.fsyncs
    st.close()
    print(f"append+fsync/batch: {n} records in {dt:.2f}s = {n / dt:,.0f} rec/s, "
          f"{nbytes / dt / 1e6:.1f} MB/s, {fsyncs} fsyncs, batch {batch}, {devices} devices")
    return n / dt, nbytes


def bench_group_commit(path: str, records: int, per_tick: int, devices: int) -> float:
    """GroupCommitter: appends per tick; fsync runs on the worker while ticks continue."""
    keys = [f"device-{i:05d}" for i in range(devices)]
    topics = [f"sensors/{k}/telemetry" for k in keys]

    async def run() -> tuple[float, LogStore]:
        st = LogStore.open(path, LogSettings())
        gc = GroupCommitter(st)
        ts = time.time_ns() // 1000
        acks = [0]

        def ack(exc: BaseException | None) -> None:
            acks[0] += 1

        t0 = time.perf_counter()
        n = 0
        while n < records:
            for j in range(per_tick):
                d = (n + j) % devices
                gc.append(keys[d], ts, topics[d], 1, None, PAYLOAD)
            gc.when_durable(ack)
            n += per_tick
            await asyncio.sleep(0)
        await gc.wait_durable()
        dt = time.perf_counter() - t0
        stats = st.stats
        print(f"group commit (asyncio): {n} records in {dt:.2f}s = {n / dt:,.0f} rec/s, "
              f"{stats.batches} writes, {stats.fsyncs} fsyncs, "
              f"mean records/fsync {n / max(stats.fsyncs, 1):.0f}")
        await gc.close()
        return n / dt, st

    rate, _ = asyncio.run(run())
    return rate


def bench_reads(path: str, devices: int) -> None:
    """Read every device's whole log: via the tail cache, then from disk after reopen."""
    keys = [f"device-{i:05d}" for i in range(devices)]
    ckpt = os.path.join(path, "index.ckpt")
    if os.path.exists(ckpt):
        os.unlink(ckpt)
    t0 = time.perf_counter()
    st = LogStore.open(path, LogSettings(tail_cache_bytes_per_device=0))
    dt = time.perf_counter() - t0
    total = sum(st.log_range(k)[1] for k in keys)
    print(f"full scan (recovery without checkpoint, CRC + index rebuild): {total} records in "
          f"{dt:.2f}s = {total / dt:,.0f} rec/s")
    t0 = time.perf_counter()
    n = 0
    for k in keys:
        off, end = st.log_range(k)
        while off < end:
            recs = st.read(k, off, 5000, 1 << 24)
            n += len(recs)
            off = recs[-1].offset + 1
    dt = time.perf_counter() - t0
    print(f"read from disk (sparse index, {devices} interleaved devices): {n} records in "
          f"{dt:.2f}s = {n / dt:,.0f} rec/s")
    st.close()
    # tail cache: fill a fresh store and read back at the head
    cache_dir = path + "-cache"
    st = LogStore.open(cache_dir, LogSettings())
    for i in range(200_000):
        st.append(keys[i % devices], i, "t", 1, None, PAYLOAD)
        if i % 1000 == 999:
            st.flush_sync_commit()
    st.flush_sync_commit()
    t0 = time.perf_counter()
    n = 0
    for k in keys:
        start, end = st.log_range(k)
        off = max(start, end - 1000)
        while off < end:
            recs = st.read(k, off, 500)
            n += len(recs)
            off = recs[-1].offset + 1
    dt = time.perf_counter() - t0
    print(f"read from tail cache: {n} records in {dt:.3f}s = {n / dt:,.0f} rec/s "
          f"(hits {st.stats.tail_cache_hits}, misses {st.stats.tail_cache_misses})")
    recs = []
    for k in keys[:10]:
        recs += st.read(k, 0, 10_000, 1 << 30)
    st.close()
    shutil.rmtree(cache_dir, ignore_errors=True)
    body = encode_fetch_response(recs)
    t0 = time.perf_counter()
    out = decode_fetch_response(body)
    dt = time.perf_counter() - t0
    print(f"fetch decode (records, CRC checked): {len(out)} in {dt:.3f}s = "
          f"{len(out) / dt:,.0f} rec/s")
    t0 = time.perf_counter()
    cols = decode_fetch_columns(body)
    dt = time.perf_counter() - t0
    print(f"fetch decode (columnar, CRC checked): {len(cols.offsets)} in {dt:.3f}s = "
          f"{len(cols.offsets) / dt:,.0f} rec/s")
    t0 = time.perf_counter()
    cols = decode_fetch_columns(body, verify=False)
    dt = time.perf_counter() - t0
    print(f"fetch decode (columnar, no CRC): {len(cols.offsets) / dt:,.0f} rec/s")


def bench_read_one_device(path: str, records: int, devices: int, batch: int) -> None:
    """Replay-style reads: whole history of single devices from disk (no tail cache)
    among ``devices`` interleaved ones, 8 MiB segments (most of it in sealed segments)."""
    keys = [f"device-{i:05d}" for i in range(devices)]
    topics = [f"sensors/{k}/telemetry" for k in keys]
    s = LogSettings(segment_bytes=8 * 1024 * 1024, tail_cache_bytes_per_device=0)
    st = LogStore.open(path, s)
    ts = time.time_ns() // 1000
    n = 0
    while n < records:
        for j in range(batch):
            d = (n + j) % devices
            st.append(keys[d], ts, topics[d], 1, None, PAYLOAD)
        n += batch
        st.flush_sync_commit()
    st.close()
    sample = keys[:: max(1, devices // 100)][:100]
    for label in ("position index files", "no .pidx files (rebuilt on first read)"):
        if label.startswith("no"):
            for name in os.listdir(path):
                if name.endswith(".pidx"):
                    os.unlink(os.path.join(path, name))
        st = LogStore.open(path, s)
        t0 = time.perf_counter()
        got = 0
        for k in sample:
            off, end = st.log_range(k)
            while off < end:
                recs = st.read(k, off, 5000, 1 << 24)
                got += len(recs)
                off = recs[-1].offset + 1
        dt = time.perf_counter() - t0
        print(f"read one device from disk ({devices} devices interleaved, batch {batch}, "
              f"{len(st.segments)} segments, {label}): {got} records of {len(sample)} "
              f"devices in {dt:.3f}s = {got / dt:,.0f} rec/s")
        st.close()


def bench_follower_append(leader_path: str, path: str, per_device: int,
                          devices_per_batch: int) -> float:
    """A follower replays the leader store at ``leader_path`` from its replica stream:
    each batch holds ``per_device`` records of ``devices_per_batch`` devices (the replica
    stream is read beforehand, not timed), appended with append_follower, then one
    flush + fsync + commit."""
    leader = LogStore.open(leader_path, LogSettings())
    keys = sorted(leader.keys())
    chunks: list[tuple[str, bytes]] = []
    offs = dict.fromkeys(keys, 0)
    while True:
        got = False
        for k in keys:
            data, nxt = leader.read_replica(k, offs[k], per_device, 1 << 30)
            if data:
                chunks.append((k, data))
                offs[k] = nxt
                got = True
        if not got:
            break
    # Batches of devices_per_batch chunks, each device's chunks in order.
    chunks.sort(key=lambda c: keys.index(c[0]) // devices_per_batch)
    rounds = [chunks[i : i + devices_per_batch]
              for i in range(0, len(chunks), devices_per_batch)]
    total = sum(offs.values())
    leader.close()
    st = LogStore.open(path, LogSettings())
    t0 = time.perf_counter()
    for rnd in rounds:
        for k, data in rnd:
            st.append_follower(k, data)
        st.commit(st.sync() if st.flush() else 0)
    dt = time.perf_counter() - t0
    fsyncs = st.stats.fsyncs
    st.close()
    print(f"follower append+fsync/batch: {total} records in {dt:.2f}s = {total / dt:,.0f} "
          f"rec/s, {fsyncs} fsyncs, {devices_per_batch} devices x {per_device} records per "
          "batch")
    return total / dt


def bench_multi_fetch(leader_path: str, devices: int, per_device: int) -> float:
    """A many-device fetch body (the admin API's MQFM format) of ``devices`` devices with
    ``per_device`` records each: built from the store, then decoded (CRC checked)."""
    st = LogStore.open(leader_path, LogSettings())
    keys = sorted(st.keys())[:devices]
    t0 = time.perf_counter()
    sections = []
    for k in keys:
        start, hw = st.log_range(k)
        recs = st.read(k, start, per_device, 1 << 30)
        sections.append(encode_section(k, STATUS_OK, start, start, hw, st.durable_end(k),
                                       recs[-1].offset + 1, len(recs), encode_batch(recs)))
    body = encode_multi_fetch(sections)
    dt_build = time.perf_counter() - t0
    st.close()
    best = 0.0
    for _ in range(3):
        t0 = time.perf_counter()
        out = decode_multi_records(body)
        dt = time.perf_counter() - t0
        n = sum(len(v) for v in out.values())
        best = max(best, n / dt)
    print(f"many-device fetch decode ({len(keys)} devices, {n} records, {len(body) >> 20} MiB, "
          f"CRC checked): best of 3 {best:,.0f} rec/s (server-side read+encode "
          f"{n / dt_build:,.0f} rec/s)")
    return best


def bench_truncated_reads(path: str, records: int, truncations: int) -> float:
    """Whole-history disk reads of a device truncated ``truncations`` times vs one never
    truncated, same live record count, interleaved with 98 other devices (8 MiB segments,
    no tail cache); best of 5 passes each. Returns truncated / plain."""
    s = LogSettings(segment_bytes=8 * 1024 * 1024, tail_cache_bytes_per_device=0)
    st = LogStore.open(path, s)
    others = [f"device-{i:05d}" for i in range(98)]
    ts = time.time_ns() // 1000
    per = records // 100
    step = max(1, per // truncations)
    cut = 3
    done_trunc = 0
    while st.log_end("plain") < per:
        for _ in range(step):
            for k in ("plain", "trunc"):
                st.append(k, ts, f"sensors/{k}/t", 1, None, PAYLOAD)
            for k in others:
                st.append(k, ts, f"sensors/{k}/t", 1, None, PAYLOAD)
        for _ in range(cut if done_trunc < truncations else 0):
            st.append("trunc", ts, "sensors/trunc/t", 1, None, PAYLOAD)
        st.flush_sync_commit()
        if done_trunc < truncations:
            st.truncate("trunc", st.durable_end("trunc") - cut)
            st.flush_sync_commit()
            done_trunc += 1
    st.close()
    st = LogStore.open(path, s)
    rates = {}
    for k in ("plain", "trunc", "plain", "trunc"):
        best = rates.get(k, 0.0)
        for _ in range(5):
            t0 = time.perf_counter()
            n = 0
            off, end = st.log_range(k)
            while off < end:
                recs = st.read(k, off, 5000, 1 << 24)
                n += len(recs)
                off = recs[-1].offset + 1
            best = max(best, n / (time.perf_counter() - t0))
        rates[k] = best
    st.close()
    ratio = rates["trunc"] / rates["plain"]
    print(f"read one device after {done_trunc} truncations: {rates['trunc']:,.0f} rec/s vs "
          f"never truncated {rates['plain']:,.0f} rec/s ({ratio:.2f}x; {per} live records)")
    return ratio


def main(argv: list[str] | None = None) -> int:
    """Run all benchmarks in a temporary directory (or --dir) and print the figures."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--records", type=int, default=300_000)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--devices", type=int, default=100)
    ap.add_argument("--dir", default=None, help="directory on the disk to measure")
    args = ap.parse_args(argv)
    base = tempfile.mkdtemp(prefix="commitlog-bench-", dir=args.dir)
    print("per-record loops: " + ("C (commitlog._speedups)" if SPEEDUPS else
                                  "pure Python (COMMITLOG_PURE_PYTHON=1 or not built)"))
    try:
        bench_append(os.path.join(base, "a"), args.records, args.batch, args.devices)
        bench_group_commit(os.path.join(base, "g"), args.records, args.batch, args.devices)
        bench_reads(os.path.join(base, "a"), args.devices)
        bench_read_one_device(os.path.join(base, "r1"), args.records, 1000, args.batch)
        bench_read_one_device(os.path.join(base, "r2"), args.records, args.devices, args.batch)
        per = max(1, args.batch // args.devices)
        bench_follower_append(os.path.join(base, "a"), os.path.join(base, "f"), per,
                              args.devices)
        bench_follower_append(os.path.join(base, "a"), os.path.join(base, "f2"), per * 10,
                              max(1, args.devices // 10))
        bench_multi_fetch(os.path.join(base, "a"), 100, args.records // args.devices)
        bench_truncated_reads(os.path.join(base, "t"), args.records, 100)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
