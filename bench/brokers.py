"""Start and stop the brokers under test, and read their CPU time and RSS from /proc."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import mqttpkt as mp

REPO = Path(__file__).resolve().parent.parent
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
BROKER_NOFILE = 65536


class BrokerUnavailable(RuntimeError):
    """The broker cannot be run on this machine (reason in the message)."""


_GIVEN: set[int] = set()  # ports handed out by this process: never twice (the kernel may)


def free_port() -> int:
    """A free loopback port no earlier call returned: nodes spawned together pick their ports
    before any binds them, and the kernel can hand the same free port out twice."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _GIVEN:
            _GIVEN.add(port)
            return port


def _child_setup() -> None:
    """Runs in the broker's child process before exec: more fds, die with the bench."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    for want in (max(hard, BROKER_NOFILE), hard):
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, want))
            break
        except (ValueError, OSError):
            continue
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


# ------------------------------------------------------------------------------------- /proc


def _children_map() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat", "rb") as f:
                st = f.read()
        except OSError:
            continue
        ppid = int(st[st.rindex(b")") + 2:].split()[1])
        kids.setdefault(ppid, []).append(int(d))
    return kids


def process_tree(pid: int) -> list[int]:
    kids = _children_map()
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, ()))
    return out


def cpu_seconds(pids: list[int]) -> float:
    """utime + stime of the given processes (live ones only)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                st = f.read()
        except OSError:
            continue
        fields = st[st.rindex(b")") + 2:].split()
        total += int(fields[11]) + int(fields[12])
    return total / CLK_TCK


def _machine_cpu_ticks() -> list[int]:
    """The aggregate "cpu" line of /proc/stat: user, nice, system, idle, iowait, irq, softirq,
    steal, ... in clock ticks."""
    with open("/proc/stat") as f:
        return [int(x) for x in f.readline().split()[1:]]


def machine_busy_seconds() -> float:
    """Busy CPU seconds of the whole machine (all cores) from /proc/stat, steal included."""
    v = _machine_cpu_ticks()
    idle = v[3] + (v[4] if len(v) > 4 else 0)
    return (sum(v[:8]) - idle) / CLK_TCK


def machine_steal_seconds() -> float:
    """CPU seconds the hypervisor ran something else on this VM's vCPUs (/proc/stat "steal").

    A process whose vCPU is stolen stops for that long without being descheduled by this
    kernel, so steal shows up directly in latency tails; it is 0 on bare metal.
    """
    v = _machine_cpu_ticks()
    return v[7] / CLK_TCK if len(v) > 7 else 0.0


def rss_bytes(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/statm", "rb") as f:
                total += int(f.read().split()[1]) * PAGE
        except OSError:
            continue
    return total


# ------------------------------------------------------------------------------------ brokers


def meshmq_config(data_dir: str, port: int, admin_port: int) -> str:
    """The one place that writes meshmq's TOML config for a benchmark run."""
    return "\n".join([
        "[node]",
        f'data_dir = "{data_dir}"',
        "",
        "[listener.tcp]",
        f'bind = "127.0.0.1:{port}"',
        "",
        "[admin]",
        f'bind = "127.0.0.1:{admin_port}"',
        "",
        "[log]",
        'level = "warning"',
        "",
        # Mosquitto stores nothing, so the live workloads (qos0, fanout, latency, ... on
        # bench/<n>) compare live pub/sub: those topics are marked unlogged. Device topics keep
        # the default rule, so the qos1 workload runs with the durable commit log (group commit,
        # fsync per batch) as the issue asks.
        "[mqtt]",
        "max_inflight = 100  # the same window as mosquitto_config's max_inflight_messages",
        "",
        "[[commitlog.rules]]",
        'filter = "bench/#"',
        "log = false",
        "",
        "[[commitlog.rules]]",
        'filter = "devices/{device}/#"',
        "",
    ])


def mosquitto_config(port: int, nodelay: bool = False) -> str:
    return "\n".join([
        f"set_tcp_nodelay {'true' if nodelay else 'false'}",
        "per_listener_settings false",
        "allow_anonymous true",
        "persistence false",
        "max_queued_messages 1000000",
        "max_inflight_messages 100",
        "log_dest stderr",
        "log_type error",
        "log_type warning",
        f"listener {port} 127.0.0.1",
        "max_connections -1",
        "",
    ])


def amqtt_config(port: int) -> dict:
    return {
        "listeners": {"default": {"type": "tcp", "bind": f"127.0.0.1:{port}",
                                  "max_connections": -1}},
        "plugins": {"amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True}},
    }


def find_mosquitto() -> str | None:
    return shutil.which("mosquitto") or next(
        (p for p in ("/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto") if os.path.exists(p)),
        None)


def ensure_mosquitto(log=print) -> str:
    path = find_mosquitto()
    if path:
        return path
    cmd = "apt-get update && apt-get install -y mosquitto"
    if os.geteuid() == 0 and shutil.which("apt-get"):
        log(f"mosquitto not found; running: {cmd}")
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        subprocess.run(["sh", "-c", cmd], env=env, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=600, check=False)
        # apt may start a system service on 1883; we never use that one.
        path = find_mosquitto()
        if path:
            return path
    raise BrokerUnavailable(f"mosquitto is not installed; install it with: sudo sh -c '{cmd}'")


def check_meshmq() -> None:
    try:
        r = subprocess.run([sys.executable, "-m", "meshmq", "serve", "--help"], cwd=REPO,
                           capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired as exc:
        raise BrokerUnavailable("`python -m meshmq serve --help` timed out") from exc
    if r.returncode != 0:
        tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["(no output)"]
        raise BrokerUnavailable(f"`python -m meshmq serve` is not available yet: {tail[0]}")


def check_amqtt() -> None:
    import importlib.util

    if importlib.util.find_spec("amqtt") is None:
        raise BrokerUnavailable("amqtt is not installed (pip install amqtt==0.12.1)")


def check_available(name: str, log=print) -> None:
    if name == "mosquitto":
        ensure_mosquitto(log)
    elif name == "amqtt":
        check_amqtt()
    elif name == "meshmq":
        check_meshmq()
    elif name == "null":
        pass
    else:
        raise BrokerUnavailable(f"unknown broker {name!r}")


def mqtt_ping(port: int, timeout: float = 1.0) -> bool:
    """True when something on ``port`` answers CONNECT with a CONNACK."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(mp.connect("bench-probe") + mp.disconnect())
            data = s.recv(4)
            return len(data) >= 2 and data[0] == mp.CONNACK
    except OSError:
        return False


class Broker:
    """One broker process started by the bench (and only stopped by PID)."""

    def __init__(self, name: str, tcp_nodelay: bool = False):
        self.name = name
        self.tcp_nodelay = tcp_nodelay  # Mosquitto only: the others always set TCP_NODELAY
        self.port = 0
        self.proc: subprocess.Popen | None = None
        self.tmp: tempfile.TemporaryDirectory | None = None
        self.log_path: Path | None = None

    def _command(self, tmp: Path) -> list[str]:
        self.port = free_port()
        if self.name == "mosquitto":
            cfg = tmp / "mosquitto.conf"
            cfg.write_text(mosquitto_config(self.port, self.tcp_nodelay))
            return [ensure_mosquitto(), "-c", str(cfg)]
        if self.name == "amqtt":
            cfg = tmp / "amqtt.json"
            cfg.write_text(json.dumps(amqtt_config(self.port)))
            return [sys.executable, "-m", "bench.amqtt_runner", str(cfg)]
        if self.name == "null":
            return [sys.executable, "-m", "bench.nullbroker", str(self.port)]
        if self.name == "meshmq":
            data = tmp / "data"
            data.mkdir()
            cfg = tmp / "meshmq.toml"
            cfg.write_text(meshmq_config(str(data), self.port, free_port()))
            profile = os.environ.get("BENCH_PROFILE")
            if profile:
                # cProfile writes the file when meshmq exits on SIGTERM (graceful drain);
                # one file per broker start, so each workload can be read on its own.
                out = f"{profile}-{os.getpid()}-{time.monotonic_ns()}.prof"
                return [sys.executable, "-m", "cProfile", "-o", out, "-m", "meshmq", "serve",
                        "-c", str(cfg)]
            return [sys.executable, "-m", "meshmq", "serve", "-c", str(cfg)]
        raise BrokerUnavailable(self.name)

    def start(self, timeout: float = 20.0) -> None:
        self.spawn()
        self.wait_ready(timeout)

    def spawn(self) -> None:
        """Start the process (``wait_ready`` waits for its CONNACK)."""
        self.tmp = tempfile.TemporaryDirectory(prefix=f"bench-{self.name}-")
        tmp = Path(self.tmp.name)
        os.chmod(tmp, 0o755)  # mosquitto drops privileges after reading its config
        cmd = self._command(tmp)
        self.log_path = tmp / "broker.log"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, cwd=REPO, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, preexec_fn=_child_setup,
                                         start_new_session=True)

    def wait_ready(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}: "
                                   f"{self.log_tail()}")
            if mqtt_ping(self.port):
                return
            time.sleep(0.05)
        raise RuntimeError(f"{self.name} did not answer CONNECT within {timeout:.0f}s: "
                           f"{self.log_tail()}")

    def log_tail(self, n: int = 5) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").strip().splitlines()
        except (OSError, AttributeError):
            return ""
        return " | ".join(lines[-n:])

    def pids(self) -> list[int]:
        return process_tree(self.proc.pid) if self.proc and self.proc.poll() is None else []

    def cpu_seconds(self) -> float:
        return cpu_seconds(self.pids())

    def rss(self) -> int:
        return rss_bytes(self.pids())

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        p = self.proc
        if p is not None:
            tree = self.pids()
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    p.terminate()
                try:
                    p.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        p.kill()
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        p.wait(timeout=5)
            for child in tree[1:]:  # helpers the broker may have forked, by PID
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(child, signal.SIGKILL)
            self.proc = None
        if self.tmp is not None:
            with contextlib.suppress(OSError):
                self.tmp.cleanup()
            self.tmp = None
