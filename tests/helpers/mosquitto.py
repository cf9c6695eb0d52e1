"""A real Eclipse Mosquitto broker process for the bridge tests (Debian's ``mosquitto``).

``MosquittoProc(dir).start()`` writes a config (one listener on a free loopback port, optional
TLS listener, persistence on so a restart keeps sessions, as a production Mosquitto runs) and
starts ``mosquitto -c``; ``stop()``/``kill()`` end it by its PID; ``restart()`` starts it again
on the same ports. ``find_mosquitto()`` installs the package with apt when run as root (as the
suite's other Debian tools are), else skips saying what to install.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from helpers.apt import apt_install, can_install
from helpers.broker import free_port

ALL_MOSQUITTOS: list[MosquittoProc] = []


def find_mosquitto() -> str:
    path = shutil.which("mosquitto") or ("/usr/sbin/mosquitto"
                                         if os.path.exists("/usr/sbin/mosquitto") else None)
    if path is None and can_install():
        apt_install("mosquitto", lambda: shutil.which("mosquitto") is not None
                    or os.path.exists("/usr/sbin/mosquitto"), update_first=True)
        path = shutil.which("mosquitto") or ("/usr/sbin/mosquitto"
                                             if os.path.exists("/usr/sbin/mosquitto") else None)
    if path is None:
        pytest.skip("the mosquitto broker is missing: `sudo apt-get install -y mosquitto`")
    return path


def make_ca(directory: Path) -> tuple[str, str, str]:
    """A test CA and a server certificate it signed, for localhost / 127.0.0.1:
    (ca certificate, server certificate, server key)."""
    d = Path(directory)

    def run(*args: str) -> None:
        res = subprocess.run(["openssl", *args], capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, f"openssl {args[0]} failed: {res.stderr}"

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(d / "ca.key"),
        "-out", str(d / "ca.crt"), "-days", "2", "-subj", "/CN=meshmq test CA")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(d / "server.key"),
        "-out", str(d / "server.csr"), "-subj", "/CN=localhost")
    (d / "san.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    run("x509", "-req", "-in", str(d / "server.csr"), "-CA", str(d / "ca.crt"), "-CAkey",
        str(d / "ca.key"), "-CAcreateserial", "-out", str(d / "server.crt"), "-days", "2",
        "-extfile", str(d / "san.ext"))
    return str(d / "ca.crt"), str(d / "server.crt"), str(d / "server.key")


class MosquittoProc:
    def __init__(self, workdir: Path, tls: tuple[str, str] | None = None) -> None:
        self.bin = find_mosquitto()
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.host = "127.0.0.1"
        self.port = free_port()
        self.tls_port = free_port() if tls else None
        lines = [
            "user root",  # as root it would switch to "mosquitto", who cannot read tmp dirs
            "allow_anonymous true",
            "persistence true",
            f"persistence_location {self.workdir}/",
            "autosave_interval 1",
            "max_queued_messages 100000",
            "log_dest stderr",
            "log_type all",
            f"listener {self.port} {self.host}",
        ]
        if tls:
            lines += [f"listener {self.tls_port} {self.host}", f"certfile {tls[0]}",
                      f"keyfile {tls[1]}"]
        self.conf = self.workdir / "mosquitto.conf"
        self.conf.write_text("\n".join(lines) + "\n")
        self.log_path = self.workdir / "mosquitto.log"
        self.proc: subprocess.Popen[bytes] | None = None
        ALL_MOSQUITTOS.append(self)

    def start(self) -> MosquittoProc:
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        self.proc = subprocess.Popen([self.bin, "-c", str(self.conf)], stdout=log, stderr=log,
                                     stdin=subprocess.DEVNULL, cwd=str(self.workdir))
        log.close()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"mosquitto exited: {self.log_tail()}"
            try:
                with socket.create_connection((self.host, self.port), timeout=1):
                    return self
            except OSError:
                time.sleep(0.05)
        raise AssertionError(f"mosquitto not listening on {self.port}: {self.log_tail()}")

    def stop(self) -> None:
        """SIGTERM (Mosquitto saves its persistence file), wait, SIGKILL if it hangs."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def restart(self) -> MosquittoProc:
        self.stop()
        return self.start()

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""
