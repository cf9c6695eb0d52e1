"""``[cluster]`` configuration: what a cluster member loads, and every misconfiguration the issue
lists stopping ``meshmq serve`` with exit 2 and one line naming the key to change.

The exit-2 cases run the real CLI: systemd's ``RestartPreventExitStatus=2`` relies on the code,
and the operator reads the line in ``journalctl``, so both are the contract, not ``ConfigError``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.broker import REPO_ROOT
from helpers.cluster import free_port_range

from cluster.settings import NodeAddress
from meshmq.config import load_config

pytestmark = pytest.mark.timeout(60)

SECRET = "0123456789abcdef-secret"
THREE_NODES = """
[[cluster.nodes]]
id = "n0"
host = "10.0.0.10"
port = 7883
[[cluster.nodes]]
id = "n1"
host = "10.0.0.11"
port = 7883
[[cluster.nodes]]
id = "n2"
host = "10.0.0.12"
port = 7883
"""


def _write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "meshmq.toml"
    path.write_text(text)
    return str(path)


def _config(node_id: str = "n0", cluster: str = "", nodes: str = THREE_NODES,
            extra: str = "") -> str:
    return (f'[node]\nid = "{node_id}"\n{extra}\n[cluster]\nname = "c1"\nsecret = "{SECRET}"\n'
            f"{cluster}\n{nodes}")


def test_three_node_cluster_loads(tmp_path):
    cfg = load_config(_write(tmp_path, _config(cluster="routers = 2\nlink_window = 64")), {})
    c = cfg.cluster
    assert c is not None
    assert (c.name, c.node_id, c.routers, c.link_window) == ("c1", "n0", 2, 64)
    # no placement, no raft_port: Raft placement, each Raft port derived as port + routers
    assert c.placement == "raft"
    assert c.nodes == (NodeAddress("n0", "10.0.0.10", 7883, 7885),
                       NodeAddress("n1", "10.0.0.11", 7883, 7885),
                       NodeAddress("n2", "10.0.0.12", 7883, 7885))
    assert c.secret == SECRET.encode()
    assert c.router_ids() == ["n0/0", "n0/1", "n1/0", "n1/1", "n2/0", "n2/1"]
    assert cfg.broker.listeners.reuse_port is True


def test_single_node_has_no_cluster_and_no_reuse_port():
    cfg = load_config(None, {})
    assert cfg.cluster is None
    assert cfg.broker.listeners.reuse_port is False


def test_shorthand_one_node_n_routers_on_loopback(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text(SECRET + "\n")
    cfg = load_config(None, {"MESHMQ_NODE__ID": "solo", "MESHMQ_CLUSTER__NAME": "c1",
                             "MESHMQ_CLUSTER__ROUTERS": "4", "MESHMQ_CLUSTER__PORT": "17000",
                             "MESHMQ_CLUSTER__SECRET_FILE": str(secret)})
    c = cfg.cluster
    assert c is not None
    assert c.placement == "raft"  # the default; Raft port: the first after the mesh ports
    assert c.nodes == (NodeAddress("solo", "127.0.0.1", 17000, 17004),)
    assert c.secret == SECRET.encode()  # the file's newline is not part of the key
    assert c.address_of("solo/3") == ("127.0.0.1", 17003)


def test_placement_defaults_to_raft_and_static_is_explicit(tmp_path):
    """Issue 24's promise is the default: a config with no ``placement`` is Raft placement,
    and a node entry's Raft port left out is derived (port + routers), one given is kept.
    ``placement = "static"`` stays an explicit choice, with no Raft port derived."""
    nodes = THREE_NODES.replace("port = 7883\n", "port = 7883\nraft_port = 9100\n", 1)
    c = load_config(_write(tmp_path, _config(cluster="routers = 3", nodes=nodes)), {}).cluster
    assert c is not None and c.placement == "raft"
    assert [n.raft_port for n in c.nodes] == [9100, 7886, 7886]
    s = load_config(_write(tmp_path, _config(cluster='placement = "static"')), {}).cluster
    assert s is not None and s.placement == "static"
    assert [n.raft_port for n in s.nodes] == [0, 0, 0]
    e = load_config(_write(tmp_path, _config()), {"MESHMQ_CLUSTER__PLACEMENT": "static"}).cluster
    assert e is not None and e.placement == "static"


def test_one_router_needs_no_secret(tmp_path):
    cfg = load_config(_write(tmp_path, '[cluster]\nname = "c1"\n'), {})
    assert cfg.cluster is not None and cfg.cluster.secret == b""


# Cases whose ports are on this machine use free ones: should a planted bug let such a config
# through, the node it starts must not take a port someone else uses (or a default one).
_FREE = free_port_range(4)


def _n0_port(port: int) -> str:
    return THREE_NODES.replace("port = 7883", f"port = {port}", 1)


def _secret_file(tmp_path: Path) -> Path:
    path = tmp_path / "short.secret"
    path.write_text("short\n")
    return path


def _raft_nodes(nodes: str) -> str:
    """Every entry without a raft_port gets one (7999), clear of its mesh ports."""
    out = []
    for entry in nodes.split("[[cluster.nodes]]"):
        if entry.strip() and "raft_port" not in entry:
            entry = entry.rstrip("\n") + "\nraft_port = 7999\n"
        out.append(entry)
    return "[[cluster.nodes]]".join(out)


# (case id, config text, environment, key that the one line must name, words it must say)
CASES = [
    ("duplicate-id", _config(nodes=THREE_NODES.replace('"n2"', '"n1"')), {},
     "cluster.nodes[2].id", "duplicate node id"),
    ("own-id-not-listed", _config(node_id="n9"), {}, "node.id", "own address not in the list"),
    ("own-id-from-env-not-listed", _config(), {"MESHMQ_NODE__ID": "x7"}, "node.id",
     "own address not in the list"),
    ("slash-in-id", _config(nodes=THREE_NODES.replace('"n2"', '"n/2"')), {},
     "cluster.nodes[2].id", 'must not contain "/"'),
    ("routers-zero", _config(cluster="routers = 0"), {}, "cluster.routers",
     "between 1 and 64"),
    ("port-out-of-range", _config(nodes=THREE_NODES.replace("port = 7883", "port = 70000", 1)),
     {}, "cluster.nodes[0].port", "between 1 and 65535"),
    ("ports-beyond-65535", _config(cluster="routers = 4",
                                   nodes=THREE_NODES.replace("port = 7883", "port = 65534", 1)),
     {}, "cluster.nodes[0].port", "beyond 65535"),
    ("ranges-overlap-on-one-host",
     _config(cluster="routers = 3", nodes=THREE_NODES.replace("10.0.0.1", "127.0.0.1")
             .replace("port = 7883", f"port = {_FREE}", 1)
             .replace("port = 7883", f"port = {_FREE + 2}", 1)),
     {}, "cluster.nodes[1].port", "overlap"),
    ("clash-with-mqtt-port", _config(cluster="routers = 2", nodes=_n0_port(_FREE),
                                     extra=f'[listener.tcp]\nbind = "127.0.0.1:{_FREE + 1}"'),
     {}, "cluster.nodes[0].port", "listener.tcp.bind"),
    ("clash-with-admin-port", _config(nodes=_n0_port(_FREE),
                                      extra=f'[admin]\nbind = "127.0.0.1:{_FREE}"'), {},
     "cluster.nodes[0].port", "admin.bind"),
    ("no-secret", _config().replace(f'secret = "{SECRET}"', ""), {}, "cluster.secret",
     "required"),
    ("short-secret", _config().replace(SECRET, "short"), {}, "cluster.secret", "too short"),
    ("secret-and-file", _config(cluster='secret_file = "/etc/hostname"'), {},
     "cluster.secret_file", "not both"),
    ("unknown-node-key", _config(nodes=THREE_NODES.replace('host = "10.0.0.12"',
                                                           'hots = "10.0.0.12"')),
     {}, "cluster.nodes[2].hots", "unknown key"),
    ("missing-node-port", _config(nodes=THREE_NODES.replace("port = 7883\n[[", "\n[[", 1)),
     {}, "cluster.nodes[0].port", "required"),
    ("nodes-without-name", '[node]\nid = "n0"\n' + THREE_NODES, {}, "cluster.name",
     "required"),
    ("port-with-nodes-list", _config(cluster="port = 9000"), {}, "cluster.port",
     "only for one node"),
    ("nodes-from-env", _config(), {"MESHMQ_CLUSTER__NODES": "n0"}, "MESHMQ_CLUSTER__NODES",
     "config file"),
    ("reconnect-min-above-max", _config(cluster="reconnect_min = 5.0\nreconnect_max = 1.0"), {},
     "cluster.reconnect_min", "must not exceed"),
    ("append-timeout-zero", _config(cluster="append_timeout = 0"), {},
     "cluster.append_timeout", "a number > 0"),
    ("append-timeout-env", _config(), {"MESHMQ_CLUSTER__APPEND_TIMEOUT": "-5"},
     "cluster.append_timeout", "(from MESHMQ_CLUSTER__APPEND_TIMEOUT)"),
    ("placement-unknown", _config(cluster='placement = "paxos"'), {}, "cluster.placement",
     "static"),
    # Raft ports derived from the mesh ports (placement left at its default, "raft"): nodes
    # on one host spaced only `routers` apart collide, and the line says it was derived
    ("derived-raft-port-in-next-mesh-range",
     _config(nodes=THREE_NODES.replace("10.0.0.1", "127.0.0.1")
             .replace("port = 7883", f"port = {_FREE}", 1)
             .replace("port = 7883", f"port = {_FREE + 1}", 1)
             .replace("port = 7883", f"port = {_FREE + 3}", 1)), {},
     "cluster.nodes[0].raft_port", "derived: port + cluster.routers"),
    ("derived-raft-port-beyond-65535",
     _config(nodes=THREE_NODES.replace("port = 7883", "port = 65535", 1)), {},
     "cluster.nodes[0].raft_port", "beyond 65535"),
    ("derived-raft-port-is-admin-port",
     _config(nodes=_n0_port(_FREE), extra=f'[admin]\nbind = "127.0.0.1:{_FREE + 1}"'), {},
     "cluster.nodes[0].raft_port", "admin.bind"),
    ("shorthand-derived-raft-port-is-mqtt-port",
     f'[node]\nid = "solo"\n[listener.tcp]\nbind = "127.0.0.1:{_FREE + 2}"\n[cluster]\n'
     f'name = "c1"\nsecret = "{SECRET}"\nrouters = 2\nport = {_FREE}\n', {},
     "cluster.raft_port", "listener.tcp.bind"),
    ("raft-ports-equal-on-one-host",
     _config(nodes=THREE_NODES.replace("10.0.0.1", "127.0.0.1")
             .replace("port = 7883\n", f"port = {_FREE}\nraft_port = {_FREE + 3}\n", 1)
             .replace("port = 7883\n", f"port = {_FREE + 1}\nraft_port = {_FREE + 3}\n", 1)
             .replace("port = 7883\n", f"port = {_FREE + 2}\nraft_port = {_FREE + 4}\n", 1)),
     {}, "cluster.nodes[0].raft_port", "also node"),
    ("placement-from-env-unknown", _config(), {"MESHMQ_CLUSTER__PLACEMENT": "hash"},
     "cluster.placement", "(from MESHMQ_CLUSTER__PLACEMENT)"),
    # failover (cluster/controller.py): a node is declared dead only after its lease ran out
    ("node-timeout-within-lease", _config(cluster="node_timeout = 0.6\nleader_lease = 0.5"), {},
     "cluster.node_timeout", "must exceed cluster.leader_lease"),
    ("leader-lease-zero", _config(cluster="leader_lease = 0"), {}, "cluster.leader_lease", ""),
    ("node-mqtt-not-an-address", _config(nodes=THREE_NODES.replace(
        'port = 7883\n', 'port = 7883\nmqtt = "nowhere"\n', 1)), {},
     "cluster.nodes[0].mqtt", "host:port"),
    ("raft-port-in-mesh-range",
     _config(cluster='placement = "raft"\nrouters = 2', nodes=_raft_nodes(
         THREE_NODES.replace("port = 7883\n", "port = 7883\nraft_port = 7884\n", 1))), {},
     "cluster.nodes[0].raft_port", "mesh ports"),
    ("raft-too-many-voters", _config(cluster='placement = "raft"', nodes=_raft_nodes(
        THREE_NODES + THREE_NODES.replace('"n', '"m').replace("10.0.0.", "10.0.1."))), {},
     "cluster.placement", "at most 5"),
    ("raft-port-with-nodes-list", _config(cluster="raft_port = 9000"), {}, "cluster.raft_port",
     "only for one node"),
    ("replication-factor-zero", _config(cluster="replication_factor = 0"), {},
     "cluster.replication_factor", "between 1 and 5"),
    ("placement-max-held-zero", _config(cluster="placement_max_held = 0"), {},
     "cluster.placement_max_held", ">= 1"),
    ("session-checkpoint-interval-zero", _config(cluster="session_checkpoint_interval = 0"),
     {}, "cluster.session_checkpoint_interval", "a number > 0"),
    ("log-floor-interval-zero", _config(cluster="log_floor_interval = 0"), {},
     "cluster.log_floor_interval", "> 0"),
    # replication (cluster/replication.py)
    ("acks-unknown", _config(cluster='acks = "one"'), {}, "cluster.acks", "leader"),
    ("min-insync-zero", _config(cluster="min_insync_replicas = 0"), {},
     "cluster.min_insync_replicas", "between 1 and 5"),
    ("fetch-wait-past-lag-max",
     _config(cluster="replica_lag_time_max = 1.0\nreplica_fetch_wait = 1.0"), {},
     "cluster.replica_fetch_wait", "below cluster.replica_lag_time_max"),
    # leadership follows the device (cluster/affinity.py)
    ("affinity-stable-negative", _config(cluster="leader_affinity_stable = -1"), {},
     "cluster.leader_affinity_stable", ">= 0"),
    ("affinity-min-interval-negative", _config(cluster="leader_affinity_min_interval = -5"),
     {}, "cluster.leader_affinity_min_interval", ">= 0"),
    ("affinity-max-devices-zero", _config(cluster="leader_affinity_max_devices = 0"), {},
     "cluster.leader_affinity_max_devices", ">= 1"),
]


@pytest.mark.parametrize(("text", "env", "key", "words"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_misconfiguration_exits_2_naming_the_key(tmp_path, text, env, key, words):
    path = _write(tmp_path, text)
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("MESHMQ_")}
    # Should a broken check let the config through, the node must not bind the default ports
    # (or write outside tmp_path) before the test fails: override what the case leaves default.
    child_env["MESHMQ_NODE__DATA_DIR"] = str(tmp_path / "data")
    if "[listener.tcp]" not in text:
        child_env["MESHMQ_LISTENER__TCP__BIND"] = "127.0.0.1:0"
    if "[admin]" not in text:
        child_env["MESHMQ_ADMIN__BIND"] = "127.0.0.1:0"
    child_env.update(env)
    child_env["PYTHONPATH"] = str(REPO_ROOT)
    try:
        proc = subprocess.run([sys.executable, "-m", "meshmq", "serve", "-c", path],
                              capture_output=True, text=True, timeout=20, env=child_env,
                              cwd=str(tmp_path))
    except subprocess.TimeoutExpired:  # it started serving: the check under test is broken
        pytest.fail(f"meshmq serve accepted the configuration ({key} not refused)")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"config error: {key}: "), lines[0]
    assert words in lines[0], lines[0]
    assert SECRET not in lines[0]  # a secret never reaches a log line


def test_short_secret_file_names_the_file_key(tmp_path):
    text = _config(cluster=f'secret_file = "{_secret_file(tmp_path)}"').replace(
        f'secret = "{SECRET}"', "")
    with pytest.raises(Exception, match=r"cluster\.secret_file: too short"):
        load_config(_write(tmp_path, text), {})


# ---------------------------------------------------------------------------- deploy/ files


def test_compose_cluster_config_loads_for_every_service(tmp_path):
    yaml = pytest.importorskip("yaml")
    compose = yaml.safe_load((REPO_ROOT / "deploy" / "docker-compose.yml").read_text())
    config = str(REPO_ROOT / "deploy" / "cluster" / "meshmq.toml")
    secret = tmp_path / "secret"
    secret.write_text(SECRET)
    services = compose["services"]
    for name, service in services.items():
        env = {**service["environment"], "MESHMQ_CLUSTER__SECRET_FILE": str(secret),
               "MESHMQ_NODE__DATA_DIR": str(tmp_path)}
        cluster = load_config(config, env).cluster
        assert cluster is not None and cluster.node_id == name == service["hostname"]
        assert sorted(n.id for n in cluster.nodes) == sorted(services)


def test_kubernetes_statefulset_matches_its_config(tmp_path):
    yaml = pytest.importorskip("yaml")
    docs = {d["kind"] + "/" + d["metadata"]["name"]: d for d in yaml.safe_load_all(
        (REPO_ROOT / "deploy" / "kubernetes" / "meshmq-cluster.yaml").read_text())}
    sts = docs["StatefulSet/meshmq"]
    config = tmp_path / "meshmq.toml"
    config.write_text(docs["ConfigMap/meshmq"]["data"]["meshmq.toml"])
    secret = tmp_path / "secret"
    secret.write_text(SECRET)
    headless = docs["Service/" + sts["spec"]["serviceName"]]
    assert headless["spec"]["clusterIP"] == "None"
    mesh_ports = {p["port"] for p in headless["spec"]["ports"] if p["name"].startswith("mesh")}
    for ordinal in range(sts["spec"]["replicas"]):
        pod = f"{sts['metadata']['name']}-{ordinal}"  # what metadata.name gives MESHMQ_NODE__ID
        cluster = load_config(str(config), {"MESHMQ_NODE__ID": pod,
                                            "MESHMQ_CLUSTER__SECRET_FILE": str(secret),
                                            "MESHMQ_NODE__DATA_DIR": str(tmp_path)}).cluster
        assert cluster is not None
        own = cluster.node(pod)
        assert own.host == f"{pod}.{headless['metadata']['name']}"
        assert {own.port + r for r in range(cluster.routers)} == mesh_ports
        # Raft placement (the default): the derived Raft port is published too
        assert cluster.placement == "raft"
        assert [p["port"] for p in headless["spec"]["ports"] if p["name"] == "raft"] \
            == [own.raft_port]
    assert len(cluster.nodes) == sts["spec"]["replicas"]


def test_failover_keys_load(tmp_path):
    """cluster.node_timeout, cluster.leader_lease and [[cluster.nodes]] mqtt (failover)."""
    nodes = THREE_NODES.replace('port = 7883\n', 'port = 7883\nmqtt = "10.0.0.10:1883"\n', 1)
    c = load_config(_write(tmp_path, _config(cluster="node_timeout = 3.0\nleader_lease = 2.0",
                                             nodes=nodes)), {}).cluster
    assert c is not None and (c.node_timeout, c.leader_lease) == (3.0, 2.0)
    assert c.nodes[0].mqtt == "10.0.0.10:1883" and c.nodes[1].mqtt == ""
    d = load_config(_write(tmp_path, _config()), {}).cluster
    assert d is not None and (d.node_timeout, d.leader_lease) == (1.0, 0.5)
