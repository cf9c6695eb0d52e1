"""Start and stop a real ``python -m meshmq serve`` process for the behaviour tests."""

from __future__ import annotations

import copy
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
READY_TIMEOUT = 15.0

# Every broker started by the test session, in start order (for failure reports).
ALL_BROKERS: list[BrokerProc] = []


_HANDED_OUT: set[int] = set()


def _ephemeral_range() -> tuple[int, int]:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo, hi = (int(x) for x in f.read().split())
            return lo, hi
    except (OSError, ValueError):
        return 32768, 60999


_EPHEMERAL = _ephemeral_range()
# Ports handed to brokers come from below the kernel's ephemeral range: a port picked there is
# one the kernel never hands to a bind(0) or an outgoing connection, so a cluster router that
# binds its loopback admin server to port 0 cannot take the MQTT or mesh port another router of
# the test is about to bind (seen: "address already in use" on a mesh port at start-up).
_ALL_PORTS = (20000, min(_EPHEMERAL[0], 32768)) if _EPHEMERAL[0] > 21000 else (0, 0)


def _worker_slice(lo: int, hi: int) -> tuple[int, int]:
    """This pytest-xdist worker's share of [lo, hi): the suite runs in several worker
    processes (pyproject's addopts), each picking ports for its own brokers; between a worker's
    probe bind and its broker's bind, another worker could pick the same free port. Disjoint
    slices (gw0 the first, gw1 the next, ...) make that impossible, as Kafka's and Cassandra's
    test harnesses give each fork its own port block. Without xdist: the whole range."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    if not worker.startswith("gw") or count < 2 or not hi:
        return lo, hi
    index = int(worker[2:]) % count
    size = (hi - lo) // count
    return lo + index * size, lo + (index + 1) * size


_PORT_RANGE = _worker_slice(*_ALL_PORTS)
# A generator of our own: hypothesis seeds the global ``random`` deterministically inside its
# tests, which would make every worker draw the same sequence of ports.
_RNG = random.Random()


def port_range() -> tuple[int, int]:
    """[lo, hi) this process picks broker ports from ((0, 0): the kernel's bind(0))."""
    return _PORT_RANGE


def free_port() -> int:
    """A TCP port nobody listens on right now, never one this process handed out before: the
    kernel may give the same free port twice in a row, and a broker's listeners then collide
    (seen once: ws and tcp on one port, config error at start)."""
    while True:
        if _PORT_RANGE[1]:
            port = _RNG.randrange(*_PORT_RANGE)
            if port in _HANDED_OUT:
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
        else:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        escaped = value.replace("\\", "\\\\").replace('"', '\\"')
        return f'"{escaped}"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):  # an inline table (e.g. [[bridge]]'s topics)
        return "{" + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"cannot write {value!r} as TOML")


def to_toml(config: dict[str, Any]) -> str:
    """Write nested dicts as TOML tables (enough for the broker config)."""
    lines: list[str] = []

    def table(prefix: str, data: dict[str, Any]) -> None:
        def is_array_of_tables(v: Any) -> bool:
            return isinstance(v, list) and bool(v) and all(isinstance(x, dict) for x in v)

        scalars = {k: v for k, v in data.items()
                   if not isinstance(v, dict) and not is_array_of_tables(v)}
        tables = {k: v for k, v in data.items() if isinstance(v, dict)}
        arrays = {k: v for k, v in data.items() if is_array_of_tables(v)}
        if prefix and (scalars or not (tables or arrays)):
            lines.append(f"[{prefix}]")
        for key, value in scalars.items():
            lines.append(f"{key} = {toml_value(value)}")
        if scalars:
            lines.append("")
        for key, value in tables.items():
            table(f"{prefix}.{key}" if prefix else key, value)
        for key, items in arrays.items():  # [[commitlog.rules]] and the like
            for item in items:
                lines.append(f"[[{prefix}.{key}]]" if prefix else f"[[{key}]]")
                lines.extend(f"{k} = {toml_value(v)}" for k, v in item.items())
                lines.append("")

    table("", config)
    return "\n".join(lines) + "\n"


def deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def parse_metrics(text: str) -> dict[str, float]:
    """Parse Prometheus text exposition into {'name{a="x",b="y"}': value} (labels sorted)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+\d+)?$", line)
        if not m:
            continue
        name, labels_raw, value = m.group(1), m.group(3), m.group(4)
        labels = dict(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', labels_raw or ""))
        key = name
        if labels:
            key += "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"
        try:
            out[key] = float(value)
        except ValueError:
            continue
    return out


def metric_sum(metrics: dict[str, float], name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels``."""
    total = 0.0
    for key, value in metrics.items():
        base, _, rest = key.partition("{")
        if base != name:
            continue
        sample_labels = dict(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', rest))
        if all(sample_labels.get(k) == v for k, v in labels.items()):
            total += value
    return total


class BrokerProc:
    """One broker process with its own config, ports, data directory and log file."""

    def __init__(self, workdir: Path, overrides: dict[str, Any] | None = None, *,
                 ws: bool = True, tls: tuple[str, str] | None = None,
                 extra_env: dict[str, str] | None = None) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.host = "127.0.0.1"
        self.port = free_port()
        self.ws_port = free_port() if ws else None
        self.tls_port = free_port() if tls else None
        self.admin_port = free_port()
        base: dict[str, Any] = {
            "node": {"id": "test", "data_dir": str(self.workdir / "data")},
            "listener": {
                "tcp": {"bind": f"{self.host}:{self.port}"},
                "ws": {"bind": f"{self.host}:{self.ws_port}" if ws else "", "path": "/mqtt"},
                "tls": {"bind": ""},
            },
            "admin": {"bind": f"{self.host}:{self.admin_port}"},
            "auth": {"allow_anonymous": True},
            "log": {"level": "debug", "format": "text"},
        }
        if tls:
            base["listener"]["tls"] = {
                "bind": f"{self.host}:{self.tls_port}", "certfile": tls[0], "keyfile": tls[1],
            }
        self.config = deep_merge(base, overrides or {})
        self.config_path = self.workdir / "meshmq.toml"
        self.config_path.write_text(to_toml(self.config))
        self.log_path = self.workdir / "broker.stderr.log"
        self.extra_env = extra_env or {}
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        # An Authorization header ``http_get`` sends (admin.token_file or a password file make
        # the admin API ask for credentials); None sends none.
        self.admin_authorization: str | None = None
        ALL_BROKERS.append(self)

    # -- process control ----------------------------------------------------------------------
    @property
    def pid(self) -> int:
        assert self.proc is not None, "broker not started"
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, wait: bool = True) -> BrokerProc:
        # A test's broker is configured by its own file and extra_env only: MESHMQ_* variables
        # in the developer's shell would override its config (or, unknown, stop start-up).
        env = {k: v for k, v in os.environ.items() if not k.startswith("MESHMQ_")}
        env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        env["PYTHONUNBUFFERED"] = "1"
        env.update(self.extra_env)
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        log.write(f"\n===== start #{self.starts + 1} =====\n".encode())
        log.flush()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "meshmq", "serve", "-c", str(self.config_path)],
            stdout=log, stderr=log, stdin=subprocess.DEVNULL, cwd=str(self.workdir), env=env,
        )
        log.close()
        self.starts += 1
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(
                    f"broker exited with code {self.proc.returncode} before it was ready;"
                    f" stderr tail:\n{self.log_tail()}"
                )
            try:
                with urllib.request.urlopen(
                    f"http://{self.host}:{self.admin_port}/readyz", timeout=1
                ) as resp:
                    if resp.status == 200:
                        return
                    last = f"HTTP {resp.status}"
            except urllib.error.HTTPError as exc:
                last = f"HTTP {exc.code}"
            except OSError as exc:
                last = repr(exc)
            time.sleep(0.05)
        raise AssertionError(
            f"broker not ready within {timeout}s (last /readyz: {last}); stderr tail:\n"
            f"{self.log_tail()}"
        )

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM, wait, then SIGKILL. Returns the exit code (None if never started)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)

    def restart(self) -> BrokerProc:
        """Graceful stop, then start again on the same ports, config and data directory."""
        self.stop()
        return self.start()

    # -- observation --------------------------------------------------------------------------
    def http_get(self, path: str, timeout: float = 5.0) -> tuple[int, str]:
        req = urllib.request.Request(f"http://{self.host}:{self.admin_port}{path}")
        if self.admin_authorization is not None:
            req.add_header("Authorization", self.admin_authorization)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.status, resp.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode("utf-8", "replace")

    def metrics_text(self) -> str:
        status, body = self.http_get("/metrics")
        assert status == 200, f"/metrics answered HTTP {status}: {body[:500]}"
        return body

    def metrics(self) -> dict[str, float]:
        return parse_metrics(self.metrics_text())

    def metric(self, name: str, **labels: str) -> float:
        return metric_sum(self.metrics(), name, **labels)

    def log_text(self) -> str:
        try:
            return self.log_path.read_text("utf-8", "replace")
        except FileNotFoundError:
            return ""

    def log_size(self) -> int:
        try:
            return self.log_path.stat().st_size
        except FileNotFoundError:
            return 0

    def log_since(self, offset: int) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(offset)
                return f.read().decode("utf-8", "replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def rss_kib(self) -> int:
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        raise AssertionError("VmRSS not found")

    def __repr__(self) -> str:
        return f"<BrokerProc pid={self.proc.pid if self.proc else None} port={self.port}>"


def wait_for(predicate: Any, timeout: float = 10.0, interval: float = 0.05,
             message: str = "condition") -> Any:
    """Poll ``predicate`` until it returns a truthy value; fail with ``message`` at timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)
