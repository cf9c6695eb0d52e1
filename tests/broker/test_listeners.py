"""Listeners: TLS, WebSocket, and a TLS client on the plain port."""

import re
import signal
import socket
import ssl
import subprocess
import time

import pytest
from helpers import raw as R
from helpers.broker import wait_for
from helpers.certs import self_signed
from helpers.clients import V5, V311, unique

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def cert(tmp_path_factory):
    return self_signed(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def lbroker(module_broker_factory, cert):
    return module_broker_factory(tls=cert)


@pytest.mark.parametrize("protocol", [V311, V5], ids=["v311", "v5"])
def test_tls_pub_sub(lbroker, clients, cert, protocol):
    """MQTT over TLS (5.0 section 5.4.9): a client verifying the server certificate connects
    to the TLS port and exchanges messages with a plain-TCP client."""
    topic = unique("tls") + "/t"
    tls_client = clients(lbroker, protocol=protocol, port=lbroker.tls_port)
    tls_client.mqtt.tls_set(ca_certs=cert[0])
    tls_client.connect()
    assert tls_client.subscribe(topic, 1) == [1]
    plain = clients.connected(lbroker, protocol=protocol)
    plain.publish(topic, b"over-tls", 1)
    assert tls_client.expect_message().payload == b"over-tls"
    tls_client.publish(topic + "/back", b"x", 1)
    plain.subscribe(topic + "/back2", 1)
    tls_client.publish(topic + "/back2", b"from-tls", 1)
    assert plain.expect_message().payload == b"from-tls"


def test_tls_raw_handshake_and_connect(lbroker, cert):
    """TLS handshake with certificate verification, then a raw CONNECT/CONNACK inside it."""
    ctx = ssl.create_default_context(cafile=cert[0])
    s = socket.create_connection((lbroker.host, lbroker.tls_port), timeout=10)
    t = ctx.wrap_socket(s, server_hostname="localhost")
    c = R.RawClient(lbroker.host, lbroker.tls_port, sock=t)
    try:
        assert c.connect(unique("tlsraw")).raw == b"\x20\x02\x00\x00"
    finally:
        c.close()


def test_plain_mqtt_on_tls_port_rejected(lbroker):
    """A plain MQTT CONNECT on the TLS port does not get a CONNACK; the connection closes."""
    c = R.RawClient(lbroker.host, lbroker.tls_port, timeout=10)
    try:
        c.try_send(R.connect(unique("plain-on-tls")))
        got = c.wait_closed(timeout=15)
        assert not [p for p in got if p.type == R.CONNACK], got
    except R.MalformedError:
        pass  # a TLS alert is not MQTT: fine, as long as it is not a CONNACK
    finally:
        c.close()


def test_tls_client_hello_on_plain_port_closed_and_logged(lbroker, clients):
    """A TLS ClientHello on the plain MQTT port is closed and the broker logs a line saying
    the client speaks TLS to a plain port; the broker keeps serving."""
    offset = lbroker.log_size()
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    s = socket.create_connection((lbroker.host, lbroker.port), timeout=10)
    try:
        ctx.wrap_socket(s, server_hostname="localhost")
        raise AssertionError("TLS handshake succeeded on the plain MQTT port")
    except TimeoutError:
        raise AssertionError("the plain port neither answered nor closed a TLS ClientHello"
                             ) from None
    except (ssl.SSLError, ConnectionError, OSError):
        pass
    finally:
        s.close()
    wait_for(lambda: re.search(r"tls|ssl", lbroker.log_since(offset), re.IGNORECASE),
             timeout=5, message="a log line naming TLS on the plain port")
    c = clients.connected(lbroker, protocol=V311)
    assert c.is_connected()


@pytest.mark.parametrize("protocol", [V311, V5], ids=["v311", "v5"])
def test_websocket_pub_sub(lbroker, clients, protocol):
    """MQTT over WebSocket at path /mqtt ([MQTT-6.0.0-1..4]: binary frames, subprotocol "mqtt")
    interoperates with TCP clients both ways."""
    topic = unique("ws") + "/t"
    ws = clients(lbroker, protocol=protocol, transport="websockets", port=lbroker.ws_port)
    ws.mqtt.ws_set_options(path="/mqtt")
    ws.connect()
    assert ws.subscribe(topic, 1) == [1]
    tcp = clients.connected(lbroker, protocol=protocol)
    tcp.subscribe(topic + "/up", 1)
    tcp.publish(topic, b"to-ws", 1)
    assert ws.expect_message().payload == b"to-ws"
    ws.publish(topic + "/up", b"from-ws" * 2000, 1)  # spans several WebSocket frames/reads
    assert tcp.expect_message().payload == b"from-ws" * 2000


def test_websocket_wrong_path_refused(lbroker):
    """A WebSocket upgrade on a path other than the configured one is refused (not 101)."""
    s = socket.create_connection((lbroker.host, lbroker.ws_port), timeout=10)
    try:
        s.sendall(
            b"GET /not-mqtt HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\n"
            b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: mqtt\r\n\r\n"
        )
        resp = s.recv(4096)
    finally:
        s.close()
    assert resp and b" 101 " not in resp.split(b"\r\n", 1)[0], resp[:200]


def test_websocket_upgrade_selects_mqtt_subprotocol(lbroker):
    """[MQTT-6.0.0-4]: the server's 101 response selects the "mqtt" subprotocol."""
    s = socket.create_connection((lbroker.host, lbroker.ws_port), timeout=10)
    try:
        s.sendall(
            b"GET /mqtt HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\n"
            b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: mqtt\r\n\r\n"
        )
        resp = b""
        while b"\r\n\r\n" not in resp:
            chunk = s.recv(4096)
            if not chunk:
                break
            resp += chunk
    finally:
        s.close()
    head = resp.split(b"\r\n\r\n", 1)[0].decode("latin-1")
    assert " 101 " in head.split("\r\n", 1)[0], head
    assert re.search(r"(?im)^sec-websocket-protocol:\s*mqtt\s*$", head), head


def _openssl(*args: str) -> None:
    res = subprocess.run(["openssl", *args], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, f"openssl {args[0]} failed: {res.stderr}"


@pytest.fixture(scope="module")
def client_pki(tmp_path_factory):
    """A CA, a client certificate it signed, and a self-signed client certificate it did not."""
    d = tmp_path_factory.mktemp("mtls")
    ca_key, ca = str(d / "ca.key"), str(d / "ca.pem")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", ca_key, "-out", ca,
             "-days", "2", "-subj", "/CN=meshmq test CA")
    key, csr, crt = str(d / "dev.key"), str(d / "dev.csr"), str(d / "dev.pem")
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr,
             "-subj", "/CN=device-1")
    _openssl("x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial",
             "-out", crt, "-days", "2")
    rogue_key, rogue = str(d / "rogue.key"), str(d / "rogue.pem")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", rogue_key, "-out",
             rogue, "-days", "2", "-subj", "/CN=device-1")
    return {"ca": ca, "client": (crt, key), "rogue": (rogue, rogue_key)}


def _mtls_connect(broker, server_ca: str, client: tuple[str, str] | None) -> R.RawClient:
    ctx = ssl.create_default_context(cafile=server_ca)
    if client is not None:
        ctx.load_cert_chain(*client)
    s = socket.create_connection((broker.host, broker.tls_port), timeout=10)
    return R.RawClient(broker.host, broker.tls_port,
                       sock=ctx.wrap_socket(s, server_hostname="localhost"))


def test_tls_client_certificates_required_when_cafile_set(start_broker, cert, client_pki):
    """listener.tls.cafile: a client must present a certificate signed by that CA (Mosquitto's
    require_certificate + cafile); one signed by it gets a CONNACK, a self-signed one or none
    at all never reaches MQTT, and the broker keeps serving."""
    b = start_broker(tls=cert, listener={"tls": {"cafile": client_pki["ca"]}})
    ok = _mtls_connect(b, cert[0], client_pki["client"])
    try:
        assert ok.connect(unique("mtls")).raw == b"\x20\x02\x00\x00"
    finally:
        ok.close()
    for who in ("rogue", None):
        try:
            c = _mtls_connect(b, cert[0], client_pki[who] if who else None)
        except (ssl.SSLError, OSError):
            continue  # refused during the handshake (TLS 1.2)
        try:  # TLS 1.3: the server's verdict arrives after the client's handshake returns
            with pytest.raises((ssl.SSLError, OSError, R.MalformedError, AssertionError)):
                c.connect(unique("mtls-bad"))
        finally:
            c.close()
    again = _mtls_connect(b, cert[0], client_pki["client"])
    try:
        assert again.connect(unique("mtls2")).raw == b"\x20\x02\x00\x00"
    finally:
        again.close()


def _failures(b, reason: str) -> float:
    return b.metric("meshmq_tls_handshake_failures_total", listener="tls", reason=reason)


def _warned(b, offset: int, pattern: str) -> bool:
    return any(re.search(pattern, line) and "WARNING" in line
               for line in b.log_since(offset).splitlines())


def test_refused_tls_handshakes_are_logged_and_counted(start_broker, cert, client_pki):
    """Every way a TLS handshake fails leaves a WARNING naming the reason and the peer, and a
    count in meshmq_tls_handshake_failures_total{reason}: a client certificate the CA did not
    sign, no certificate, plain MQTT on the TLS port, a client that never finishes. A TCP probe
    that connects and leaves is counted (closed) but not warned about. The listener keeps
    serving throughout."""
    b = start_broker(tls=cert, listener={"tls": {"cafile": client_pki["ca"]}},
                     mqtt={"connect_timeout": 1.0})
    assert _failures(b, "client_certificate") == 0  # exported from the start, zeros included

    def attempt(who):
        try:
            c = _mtls_connect(b, cert[0], client_pki[who] if who else None)
        except (ssl.SSLError, OSError):
            return
        try:
            c.connect(unique("mtls-bad"))
        except (ssl.SSLError, OSError, R.MalformedError, AssertionError):
            pass
        finally:
            c.close()

    off = b.log_size()
    attempt("rogue")
    wait_for(lambda: _warned(b, off, r"TLS handshake failed: client certificate refused.*"
                                     r"127\.0\.0\.1"), timeout=10,
             message="a warning naming the refused client certificate and the peer")
    assert _failures(b, "client_certificate") == 1

    off = b.log_size()
    attempt(None)
    wait_for(lambda: _warned(b, off, r"TLS handshake failed: the client sent no certificate"),
             timeout=10, message="a warning saying the client sent no certificate")
    assert _failures(b, "client_certificate") == 2

    off = b.log_size()
    c = R.RawClient(b.host, b.tls_port, timeout=10)
    try:
        c.try_send(R.connect(unique("plain-on-tls")))
        wait_for(lambda: _warned(b, off, r"TLS handshake failed: the client is not speaking TLS"),
                 timeout=10, message="a warning that plain MQTT reached the TLS port")
    finally:
        c.close()
    assert _failures(b, "not_tls") == 1

    off = b.log_size()
    s = socket.create_connection((b.host, b.tls_port), timeout=10)
    try:  # says nothing: the handshake deadline (mqtt.connect_timeout, 1 s here) closes it
        wait_for(lambda: _warned(b, off, r"did not finish the handshake within 1 s"), timeout=10,
                 message="a warning that the handshake timed out")
        assert s.recv(1) == b""
    finally:
        s.close()
    assert _failures(b, "timeout") == 1

    off = b.log_size()
    socket.create_connection((b.host, b.tls_port), timeout=10).close()
    wait_for(lambda: _failures(b, "closed") == 1, timeout=10, message="the probe counted")
    assert not _warned(b, off, r"TLS handshake failed"), b.log_since(off)

    ok = _mtls_connect(b, cert[0], client_pki["client"])
    try:
        assert ok.connect(unique("mtls-after")).raw == b"\x20\x02\x00\x00"
    finally:
        ok.close()
    assert _failures(b, "tls_error") == 0


def test_sigterm_with_a_tls_handshake_pending_exits_promptly(start_broker, cert):
    """A connection on the TLS port that never says hello is not a client to drain: SIGTERM
    cancels its handshake and the node exits 0. With a 60 s handshake deadline, a node that
    waited for it would still be running when ``stop`` gives up and SIGKILLs it (20 s)."""
    b = start_broker(tls=cert, mqtt={"connect_timeout": 60.0})
    s = socket.create_connection((b.host, b.tls_port), timeout=10)
    try:
        time.sleep(0.5)  # accepted and waiting for its ClientHello (nothing to observe yet)
        code = b.stop(timeout=20)
    finally:
        s.close()
    assert code == 0, f"exit {code}: SIGTERM waited on a pending TLS handshake\n{b.log_tail()}"
    assert "Traceback" not in b.log_text(), b.log_tail()


def _self_signed(d, name: str) -> tuple[str, str]:
    key, crt = str(d / f"{name}.key"), str(d / f"{name}.pem")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", crt,
             "-days", "2", "-subj", "/CN=localhost",
             "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1")
    return crt, key


def _tls_connack(broker, trust: str) -> bytes:
    c = _mtls_connect(broker, trust, None)
    try:
        return c.connect(unique("reload")).raw
    finally:
        c.close()


def test_sighup_reloads_the_tls_certificate_and_keeps_the_old_one_when_broken(start_broker,
                                                                             tmp_path):
    """A renewed certificate needs no restart (Mosquitto 2.0 reloads on SIGHUP): after the files
    are replaced and SIGHUP sent, new handshakes present the new certificate. Files that do not
    load leave the previous certificate serving, with an error naming the settings to check."""
    old = _self_signed(tmp_path, "old")
    new = _self_signed(tmp_path, "new")
    live_crt, live_key = tmp_path / "live.pem", tmp_path / "live.key"
    live_crt.write_bytes(open(old[0], "rb").read())
    live_key.write_bytes(open(old[1], "rb").read())
    b = start_broker(tls=(str(live_crt), str(live_key)))
    assert _tls_connack(b, old[0]) == b"\x20\x02\x00\x00"

    live_crt.write_bytes(open(new[0], "rb").read())
    live_key.write_bytes(open(new[1], "rb").read())
    off = b.log_size()
    b.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: "TLS certificate reloaded" in b.log_since(off), timeout=10,
             message="the reload logged")
    assert _tls_connack(b, new[0]) == b"\x20\x02\x00\x00"
    off = b.log_size()
    with pytest.raises(ssl.SSLCertVerificationError):
        _tls_connack(b, old[0])
    # The device that does not trust the new certificate is named in the log too.
    wait_for(lambda: _warned(b, off, r"the client refused this server's certificate"),
             timeout=10, message="a warning that the client refused the server certificate")
    assert _failures(b, "server_certificate") == 1

    live_key.write_bytes(open(old[1], "rb").read())  # a key that does not match the certificate
    off = b.log_size()
    b.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: "TLS files not reloaded" in b.log_since(off), timeout=10,
             message="an error saying the TLS files were not reloaded")
    assert "listener.tls.certfile" in b.log_since(off)
    assert _tls_connack(b, new[0]) == b"\x20\x02\x00\x00"
    assert b.alive
