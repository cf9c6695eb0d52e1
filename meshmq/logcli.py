"""``meshmq log ...``: look at device commit logs from a shell.

* ``meshmq log list`` and ``meshmq log tail DEVICE`` talk to a running node through its admin
  HTTP fetch API (``meshmq.fetch_api``), because the store is locked by the node that owns it
  and only the node knows which records are committed.
* ``meshmq log inspect PATH`` works offline on a store directory (a live node's or a copy of a
  broken one): it verifies every record's CRC without taking the lock or changing anything, so
  an operator can see what recovery would cut before restarting.

HTTP uses urllib on purpose: these are one request at a time tools, and the standard library
keeps ``meshmq log`` working on a host with nothing but the package installed.

Exit codes follow ``meshmq.cli``: 0 ok, 1 the operation failed (node unreachable, unknown
device, corrupt store), 2 bad usage; 130 when ``tail --follow`` is stopped with Ctrl-C.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any, TextIO

from commitlog.fetch import decode_fetch_response
from commitlog.record import ATTR_QOS_MASK, ATTR_RETAIN, Record

__all__ = ["add_log_parser", "run_log", "DEFAULT_ADMIN", "format_record", "read_token"]

DEFAULT_ADMIN = "127.0.0.1:9883"
POLL_INTERVAL_S = 0.5
FETCH_MAX_RECORDS = 1000
HTTP_TIMEOUT_S = 10.0

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class LogCliError(Exception):
    """A failure the user should read as one line on stderr (exit 1)."""


def add_log_parser(sub: Any) -> None:
    """Add ``log`` with its ``list``/``tail``/``inspect`` subcommands to ``meshmq``'s parser
    (``sub`` is the object returned by ``add_subparsers``)."""
    log_p = sub.add_parser("log", help="list, tail or verify device commit logs",
                           description="Look at device commit logs: list and tail ask a running "
                           "node's admin API; inspect verifies a store directory offline.")
    log_sub = log_p.add_subparsers(dest="log_command", metavar="LOG_COMMAND")
    admin_help = f"admin API of the node, HOST:PORT or a URL (default {DEFAULT_ADMIN})"
    token_help = ("bearer token for a node with admin authentication: a file holding the "
                  "token, or a name:token line as in admin.token_file (the first one is used)")

    lst = log_sub.add_parser("list", help="devices with a log and their offset ranges")
    lst.add_argument("--admin", default=DEFAULT_ADMIN, metavar="HOST:PORT", help=admin_help)
    lst.add_argument("--token-file", metavar="PATH", help=token_help)
    lst.add_argument("--format", choices=("text", "json"), default="text")

    tail = log_sub.add_parser(
        "tail", help="print a device's records",
        description="Print DEVICE's committed records, one line each: offset, time (UTC), "
        "topic, qos, retain, payload (UTF-8 text, or hex: when it is not printable text).")
    tail.add_argument("device", metavar="DEVICE")
    tail.add_argument("--from", dest="start", default="earliest", metavar="N|earliest|latest",
                      help="first offset to print (default earliest: the oldest retained)")
    tail.add_argument("--follow", "-f", action="store_true",
                      help=f"keep polling for new records every {POLL_INTERVAL_S} s until Ctrl-C")
    tail.add_argument("--admin", default=DEFAULT_ADMIN, metavar="HOST:PORT", help=admin_help)
    tail.add_argument("--token-file", metavar="PATH", help=token_help)
    tail.add_argument("--format", choices=("text", "json"), default="text")

    insp = log_sub.add_parser(
        "inspect", help="verify a store directory offline (CRC of every record)",
        description="Verify every record of the store in PATH (usually <data_dir>/log; router "
        "R of a cluster node: <data_dir>/router-R/log) and summarise its keys. Read-only; safe "
        "on a live node's directory. Exit 1 if corrupt.")
    insp.add_argument("path", metavar="PATH")


def run_log(args: argparse.Namespace, out: TextIO | None = None,
            err: TextIO | None = None) -> int:
    """Run a parsed ``meshmq log ...`` command; returns the exit code."""
    out = out or sys.stdout
    err = err or sys.stderr
    cmd = getattr(args, "log_command", None)
    try:
        if cmd == "list":
            return _list(args, out, err)
        if cmd == "tail":
            return _tail(args, out, err)
        if cmd == "inspect":
            return _inspect(args.path, out, err)
    except LogCliError as exc:
        print(f"meshmq log {cmd}: {exc}", file=err)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `meshmq log tail d1 | head`: the reader left, not an error
        _silence_stdout()
        return EXIT_OK
    print("usage: meshmq log {list,tail,inspect} ... (see meshmq log --help)", file=err)
    return EXIT_USAGE


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush cannot raise again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    finally:
        os.close(devnull)


# ------------------------------------------------------------------------------ HTTP


def admin_url(admin: str) -> str:
    """``HOST:PORT`` / ``[v6]:PORT`` / ``http://...`` -> base URL without trailing slash."""
    if admin.startswith(("http://", "https://")):
        return admin.rstrip("/")
    from meshmq.config import parse_bind

    try:
        host, port = parse_bind(admin)
    except ValueError as exc:
        raise LogCliError(f"--admin {admin!r}: {exc}") from None
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"


class _Http:
    """GETs against one admin API, turning every failure into a one-line LogCliError."""

    def __init__(self, admin: str, token_file: str | None = None) -> None:
        self.admin = admin
        self.base = admin_url(admin)
        self.headers = {"Authorization": "Bearer " + read_token(token_file)} if token_file \
            else {}

    def get(self, path: str, query: dict[str, int] | None = None) -> tuple[int, dict[str, str],
                                                                           bytes]:
        """(status, headers, body) for 2xx and 4xx answers; raises for anything else."""
        url = self.base + path
        if query:
            url += "?" + urllib.parse.urlencode(query)
        try:
            req = urllib.request.Request(url, headers=self.headers)
            with urllib.request.urlopen(req, timeout=HTTP_TIMEOUT_S) as resp:
                return resp.status, dict(resp.headers.items()), resp.read()
        except urllib.error.HTTPError as exc:
            body = exc.read()
            if 400 <= exc.code < 500:
                return exc.code, dict(exc.headers.items()), body
            raise LogCliError(f"{url}: HTTP {exc.code}: {_error_text(body)}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise LogCliError(
                f"cannot reach the admin API at {self.base} ({reason}): is `meshmq serve` "
                "running? set --admin HOST:PORT") from None

    def get_json(self, path: str) -> tuple[int, dict[str, Any]]:
        status, _, body = self.get(path)
        try:
            data = json.loads(body)
        except ValueError:
            raise LogCliError(f"{self.base}{path}: not a JSON answer (is {self.admin} a meshmq "
                              "admin API?)") from None
        if not isinstance(data, dict):
            raise LogCliError(f"{self.base}{path}: unexpected answer {body[:80]!r}")
        return status, data


def read_token(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as fh:
            lines = [ln.strip() for ln in fh if ln.strip() and not ln.lstrip().startswith("#")]
    except OSError as exc:
        raise LogCliError(f"--token-file {path!r}: {exc.strerror}") from None
    if not lines:
        raise LogCliError(f"--token-file {path!r}: no token in the file")
    return lines[0].rpartition(":")[2]


def _error_text(body: bytes) -> str:
    try:
        data = json.loads(body)
        if isinstance(data, dict) and "error" in data:
            return str(data["error"])
    except ValueError:
        pass
    return body[:200].decode(errors="replace").strip()


def _device_path(device: str) -> str:
    return "/api/v1/logs/" + urllib.parse.quote(device, safe="")


# ------------------------------------------------------------------------------ list


def _list(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Every page of the listing. In a cluster a page names the routers that did not answer
    (their logs are missing): what was listed is printed, then they are named on stderr and
    the exit status is 1, so a script does not take a partial list for the whole."""
    http = _Http(args.admin, args.token_file)
    logs: list[dict[str, Any]] = []
    unreachable: dict[str, str] = {}
    hidden = 0
    after: str | None = None
    while True:  # the listing is paged (a node may hold 100k devices)
        path = "/api/v1/logs?limit=10000"
        if after is not None:
            path += "&after=" + urllib.parse.quote(after, safe="")
        status, data = http.get_json(path)
        if status != 200:
            raise LogCliError(f"HTTP {status}: {data.get('error', data)}")
        logs += data.get("logs", [])
        unreachable.update(data.get("unreachable") or {})
        hidden += int(data.get("hidden_by_acl") or 0)
        after = data.get("next_after")  # absent on the last page
        if after is None:
            break
    code = EXIT_OK
    if hidden:
        # Exit 0 all the same, as Kafka's kafka-topics --list without Describe rights: the
        # listing is what this reader may see; the hint says why it is short (issue 27).
        what = "no device log is listed" if not logs else f"{len(logs)} listed"
        print(f"meshmq log list: {what}: the node's read ACL hides {hidden} device log(s) from "
              "this reader (the token's name or the user of --token-file / the password "
              "file): the listing shows only logs it may subscribe to; add an ACL rule such "
              "as 'topic read devices/#' under 'user NAME'", file=err)
    if unreachable:
        print("meshmq log list: incomplete, these routers did not answer (their logs are not "
              "listed): " + "; ".join(unreachable.values()), file=err)
        code = EXIT_FAILED
    if args.format == "json":
        for entry in logs:
            print(json.dumps(entry), file=out)
        return code
    rows = [(str(e["device"]), *map(str, _range_of(e))) for e in logs]
    head = ("DEVICE", "LOG_START", "HIGH_WATERMARK")
    w0 = max([len(head[0])] + [len(r[0]) for r in rows])
    w1 = max([len(head[1])] + [len(r[1]) for r in rows])
    w2 = max([len(head[2])] + [len(r[2]) for r in rows])
    for r in [head, *rows]:
        print(f"{r[0]:<{w0}}  {r[1]:>{w1}}  {r[2]:>{w2}}", file=out)
    return code


# ------------------------------------------------------------------------------ tail


def _range_of(entry: dict) -> tuple[int, int]:
    """``(log_start, high_watermark)`` of a fetch API answer; a node of the previous release
    names them ``start`` and ``end`` (deprecated there, kept one release)."""
    return (int(entry["log_start"] if "log_start" in entry else entry.get("start", 0)),
            int(entry["high_watermark"] if "high_watermark" in entry else entry.get("end", 0)))


def format_payload(payload: bytes) -> tuple[str, str]:
    """(text, encoding): UTF-8 when it decodes to printable text, else ``hex`` digits.
    Printable only, so one record is always exactly one output line."""
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        return payload.hex(), "hex"
    if text.isprintable():
        return text, "utf-8"
    return payload.hex(), "hex"


def _iso(timestamp_us: int) -> str:
    try:
        t = dt.datetime.fromtimestamp(timestamp_us / 1e6, tz=dt.UTC)
    except (OverflowError, OSError, ValueError):
        return str(timestamp_us)
    return t.isoformat(timespec="microseconds").replace("+00:00", "Z")


def format_record(rec: Record, fmt: str) -> str:
    """One output line for ``rec``: text columns or one JSON object."""
    qos = rec.attrs & ATTR_QOS_MASK
    retain = bool(rec.attrs & ATTR_RETAIN)
    payload, encoding = format_payload(bytes(rec.payload))
    if fmt == "json":
        return json.dumps({
            "device": rec.key, "offset": rec.offset, "timestamp_us": rec.timestamp_us,
            "time": _iso(rec.timestamp_us), "topic": rec.topic, "qos": qos, "retain": retain,
            "payload": payload, "payload_encoding": encoding,
        }, ensure_ascii=False)
    shown = payload if encoding == "utf-8" else "hex:" + payload
    return (f"{rec.offset}\t{_iso(rec.timestamp_us)}\t{rec.topic}\tqos={qos}\t"
            f"retain={int(retain)}\t{shown}")


def _parse_from(text: str) -> int | str:
    if text in ("earliest", "latest"):
        return text
    if text.isascii() and text.isdigit():
        return int(text)
    raise LogCliError(f"--from {text!r}: expected an offset (>= 0), earliest or latest")


def _tail(args: argparse.Namespace, out: TextIO, err: TextIO,
          sleep: Callable[[float], None] = time.sleep) -> int:
    start_at = _parse_from(args.start)
    http = _Http(args.admin, args.token_file)
    path = _device_path(args.device)
    offset: int | None = start_at if isinstance(start_at, int) else None
    if offset is None:
        status, info = http.get_json(path)
        if status == 404 and args.follow:
            # Not there yet: wait for its first committed record, from offset 0.
            offset = 0
        elif status != 200:
            raise LogCliError(str(info.get("error", f"HTTP {status}")))
        else:
            offset = _range_of(info)[0 if start_at == "earliest" else 1]
    while True:
        status, headers, body = http.get(path + "/records",
                                         {"offset": offset, "max_records": FETCH_MAX_RECORDS})
        if status == 200:
            records = decode_fetch_response(body)
            for rec in records:
                print(format_record(rec, args.format), file=out)
            out.flush()
            for lost in filter(None, headers.get("X-Meshmq-Lost-Offsets", "").split(",")):
                lo, _, hi = lost.partition("-")
                print(f"meshmq log tail: offsets {lo}..{int(hi) - 1} of {args.device!r} were "
                      "lost to a corrupt record (quarantined; see the node's ERROR log)",
                      file=err)
            offset = int(headers.get("X-Meshmq-Next-Offset", offset + len(records)))
            end = int(headers.get("X-Meshmq-High-Watermark",
                                  headers.get("X-Meshmq-End", offset)))
            if records and offset < end:
                continue  # more is already there: no pause
        elif status == 416:
            info = _json_or_empty(body)
            start, end = _range_of(info)
            if offset < start:
                print(f"meshmq log tail: offsets {offset}..{start - 1} of {args.device!r} were "
                      f"deleted by retention; continuing at {start}", file=err)
                offset = start
            elif not args.follow:
                raise LogCliError(f"offset {offset} is beyond the high-water mark ({end}) of "
                                  f"{args.device!r}")
            else:
                print(f"meshmq log tail: offset {offset} is beyond the high-water mark ({end}) of "
                      f"{args.device!r} (log truncated?); continuing at {end}", file=err)
                offset = end
            continue
        elif status == 404 and args.follow:
            pass  # the device has not logged anything yet
        else:
            raise LogCliError(_error_text(body) or f"HTTP {status}")
        if not args.follow:
            return EXIT_OK
        sleep(POLL_INTERVAL_S)


def _json_or_empty(body: bytes) -> dict[str, Any]:
    try:
        data = json.loads(body)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


# ------------------------------------------------------------------------------ inspect


_STORE_HINT = ("usually <data_dir>/log on a single node, <data_dir>/router-<r>/log for router r "
               "of a cluster node")


def _stores_below(path: str) -> str:
    """Name the stores under a data directory given instead of a store: a single node's
    ``log/`` or a cluster node's ``router-<r>/log`` (issue 27: the hint only knew the first)."""
    found = [os.path.join(path, "log")] if os.path.isdir(os.path.join(path, "log")) else []
    try:
        routers = sorted((d for d in os.listdir(path) if d.startswith("router-")),
                         key=lambda d: (len(d), d))
    except OSError:
        routers = []
    found += [os.path.join(path, d, "log") for d in routers
              if os.path.isdir(os.path.join(path, d, "log"))]
    if not found:
        return ""
    return " This looks like a data directory; its stores: " + ", ".join(found)


def _inspect(path: str, out: TextIO, err: TextIO) -> int:
    from commitlog.inspect import inspect
    from commitlog.store import SEGMENT_SUFFIX

    if not os.path.isdir(path):
        what = "does not exist" if not os.path.exists(path) else "is not a directory"
        raise LogCliError(f"{path} {what} (give the store directory: {_STORE_HINT})")
    try:
        report = inspect(path)
    except OSError as exc:
        raise LogCliError(f"{path}: {exc.strerror or exc}") from None
    if not report.segments:  # before printing: an empty report would end in "RESULT: ok"
        raise LogCliError(f"no segment files (*{SEGMENT_SUFFIX}) in {path}: is this the "
                          f"commit-log directory ({_STORE_HINT})?{_stores_below(path)}")
    print(report.format(), file=out)
    if not report.ok:
        bad = next((s for s in report.segments if s.corrupt_at is not None), None)
        if bad is not None:
            print(f"meshmq log inspect: {path} is CORRUPT: {os.path.basename(bad.path)} at "
                  f"byte {bad.corrupt_at} ({bad.corrupt_reason}); the node's recovery will "
                  "truncate there at its next start", file=err)
        else:
            seg = next(s for s in report.segments if not all(r[3] for r in s.ranges))
            a, b, why, _ = next(r for r in seg.ranges if not r[3])
            print(f"meshmq log inspect: {path} is CORRUPT: {os.path.basename(seg.path)} bytes "
                  f"{a}..{b} ({why}) with intact records after them; the node's recovery "
                  "will quarantine them at its next start and keep the rest", file=err)
        return EXIT_FAILED
    return EXIT_OK
