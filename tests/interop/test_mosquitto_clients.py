"""Interop with the Eclipse Mosquitto command-line clients (mosquitto_pub / mosquitto_sub)."""

import shutil
import subprocess
import threading
import time

import pytest
from helpers.clients import V5, V311, unique

pytestmark = pytest.mark.timeout(60)

VERSIONS = ["mqttv311", "mqttv5"]


class Sub:
    """mosquitto_sub in the background; readiness = its debug line for the SUBACK."""

    def __init__(self, bin_, broker, topic, version, qos=1, extra=()):
        self.lines: list[str] = []
        self.ready = threading.Event()
        # mosquitto_sub block-buffers stdout into a pipe: ask for line buffering.
        stdbuf = shutil.which("stdbuf")
        prefix = [stdbuf, "-oL"] if stdbuf else []
        self.proc = subprocess.Popen(
            [*prefix, bin_, "-h", broker.host, "-p", str(broker.port), "-t", topic, "-q", str(qos),
             "-V", version, "-v", "-d", "-i", unique("msub"), *extra],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
        )
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            line = line.rstrip("\n")
            self.lines.append(line)
            if "received SUBACK" in line:
                self.ready.set()

    def wait_ready(self, timeout=10):
        if not self.ready.wait(timeout):
            raise AssertionError(f"mosquitto_sub got no SUBACK within {timeout}s: {self.lines}")

    def wait_line(self, text, timeout=10):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.lines:
                return
            time.sleep(0.05)
        raise AssertionError(f"mosquitto_sub never printed {text!r}; output: {self.lines}")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


@pytest.fixture
def subs():
    made = []
    yield made
    for s in made:
        s.stop()


def _pub(bin_, broker, topic, message, version, qos=1, extra=()):
    res = subprocess.run(
        [bin_, "-h", broker.host, "-p", str(broker.port), "-t", topic, "-m", message,
         "-q", str(qos), "-V", version, "-i", unique("mpub"), *extra],
        capture_output=True, text=True, timeout=20,
    )
    assert res.returncode == 0, f"mosquitto_pub failed ({res.returncode}): {res.stderr}"


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("qos", [0, 1, 2])
def test_mosquitto_pub_to_mosquitto_sub(broker, mosquitto_bin, subs, version, qos):
    """mosquitto_pub -> meshmq -> mosquitto_sub, for each protocol version and QoS."""
    topic = unique("mq") + "/t"
    s = Sub(mosquitto_bin["sub"], broker, topic, version, qos)
    subs.append(s)
    s.wait_ready()
    _pub(mosquitto_bin["pub"], broker, topic, f"hello-{version}-{qos}", version, qos)
    s.wait_line(f"{topic} hello-{version}-{qos}")


@pytest.mark.parametrize("version", VERSIONS)
def test_mosquitto_pub_to_paho(broker, mosquitto_bin, clients, version):
    """mosquitto_pub publishes, a paho subscriber (same protocol version) receives."""
    topic = unique("mqp") + "/t"
    c = clients.connected(broker, protocol=V5 if version == "mqttv5" else V311)
    c.subscribe(topic, 1)
    _pub(mosquitto_bin["pub"], broker, topic, "from-mosquitto", version)
    m = c.expect_message()
    assert (m.topic, m.payload, m.qos) == (topic, b"from-mosquitto", 1)


@pytest.mark.parametrize("version", VERSIONS)
def test_paho_to_mosquitto_sub(broker, mosquitto_bin, clients, subs, version):
    """A paho publisher, a mosquitto_sub subscriber; wildcard filter."""
    p = unique("pm")
    s = Sub(mosquitto_bin["sub"], broker, f"{p}/#", version)
    subs.append(s)
    s.wait_ready()
    c = clients.connected(broker, protocol=V5 if version == "mqttv5" else V311)
    c.publish(f"{p}/a/b", b"from-paho", 1)
    s.wait_line(f"{p}/a/b from-paho")


@pytest.mark.parametrize("version", VERSIONS)
def test_mosquitto_retained(broker, mosquitto_bin, version):
    """mosquitto_pub -r stores a retained message that mosquitto_sub --retained-only -C 1
    receives on subscribe."""
    topic = unique("mqr") + "/t"
    _pub(mosquitto_bin["pub"], broker, topic, "kept", version, extra=("-r",))
    res = subprocess.run(
        [mosquitto_bin["sub"], "-h", broker.host, "-p", str(broker.port), "-t", topic,
         "-V", version, "-C", "1", "-W", "10", "-v", "--retained-only"],
        capture_output=True, text=True, timeout=20,
    )
    assert res.returncode == 0, f"mosquitto_sub: {res.returncode} {res.stderr}"
    assert res.stdout.strip() == f"{topic} kept"


def test_mosquitto_v5_user_property_to_paho(broker, mosquitto_bin, clients):
    """mosquitto_pub -D publish user-property reaches a paho v5 subscriber unaltered
    ([MQTT-3.3.2-17])."""
    topic = unique("mqu") + "/t"
    c = clients.connected(broker, protocol=V5)
    c.subscribe(topic, 1)
    _pub(mosquitto_bin["pub"], broker, topic, "props", "mqttv5",
         extra=("-D", "publish", "user-property", "origin", "mosquitto",
                "-D", "publish", "content-type", "text/plain"))
    m = c.expect_message()
    assert m.properties.UserProperty == [("origin", "mosquitto")]
    assert m.properties.ContentType == "text/plain"


@pytest.mark.parametrize("version", VERSIONS)
def test_mosquitto_sub_count_and_exit(broker, mosquitto_bin, clients, subs, version):
    """mosquitto_sub -C 3 receives three messages in order and exits 0."""
    topic = unique("mqc") + "/t"
    s = Sub(mosquitto_bin["sub"], broker, topic, version, 1, extra=("-C", "3"))
    subs.append(s)
    s.wait_ready()
    c = clients.connected(broker, protocol=V311)
    for i in range(3):
        c.publish(topic, f"n{i}", 1)
    assert s.proc.wait(15) == 0
    s.thread.join(5)
    got = [ln for ln in s.lines if ln.startswith(topic + " ")]
    assert got == [f"{topic} n{i}" for i in range(3)]
