"""What a router needs to know about the cluster: who is in it, where, and the link limits.

Parsed and validated once by ``meshmq/config.py`` (the ``[cluster]`` section and its
``[[cluster.nodes]]`` tables); this module only holds the typed result and the naming rules every
part of the mesh shares, so the supervisor, the links and the ownership hash cannot disagree on
what a router is called.

A router's id is ``"<node id>/<r>"``: node ids cannot contain ``/`` (config checks that), so the
id is unambiguous and sorts by node, then index. Router *r* of a node listens for mesh links on
the node's base port + *r* (the issue's rule: nothing else to configure per router).
"""

from __future__ import annotations

from dataclasses import dataclass, field

# the mesh protocol versions this build speaks (cluster/frames.py's VERSION and MIN_VERSION;
# frames asserts they agree: settings is read by the config and must not pull the codecs in)
PROTOCOL_VERSION = 4
MIN_PROTOCOL_VERSION = 2
# seconds a router's leader lease may outlive what the controller waits for before it elects
# elsewhere (cluster/controller.py): config requires node_timeout > leader_lease + this. It
# covers a follower's one-message delay in learning its leader's majority time, the router's
# lease poll interval (leader_lease / 5) and scheduling under load.
LEASE_SLACK = 0.2


@dataclass(frozen=True)
class NodeAddress:
    """One ``[[cluster.nodes]]`` entry: a node's id and its mesh base address."""

    id: str
    host: str
    port: int  # router r of this node accepts mesh links on port + r
    # its metadata process's Raft port (cluster.placement = "raft"); 0 in a config entry:
    # derived as port + routers by meshmq/config.py; 0 here: none (static placement)
    raft_port: int = 0
    # "host:port" MQTT clients can reach this node at (""; unknown): what a router whose
    # leader lease ran out names in its v5 Server Reference (cluster/lease.py)
    mqtt: str = ""


def router_id(node_id: str, index: int) -> str:
    return f"{node_id}/{index}"


def split_router_id(rid: str) -> tuple[str, int]:
    node, _, index = rid.rpartition("/")
    return node, int(index)


def router_sort_key(rid: str) -> tuple[str, int]:
    """The order that decides who dials (the lower id) and breaks duplicate-link ties."""
    return split_router_id(rid)


@dataclass(frozen=True)
class ClusterSettings:
    """The ``[cluster]`` section, validated. ``None`` in NodeConfig means a plain single node."""

    name: str
    node_id: str  # this node ([node] id), one of ``nodes``
    routers: int  # routers per node (every node of a cluster runs the same number)
    nodes: tuple[NodeAddress, ...]
    secret: bytes  # HMAC key for the link handshake (cluster.secret or cluster.secret_file)
    # Entries a link may have sent and not had acknowledged: the send window (credits). Past
    # it, publishes wait in the link's queue. 1,024 kept healthy links window-bound in the
    # cluster bench (unacked pinned at the window on every QoS 0 run).
    link_window: int = 8192
    # Bytes a link may queue while its window is shut or its peer is down. Past it, QoS 0
    # publishes are dropped and QoS 1/2 ones refused (see cluster/link.py), each counted in
    # meshmq_link_dropped_total and logged.
    link_max_queued_bytes: int = 64 * 1024 * 1024
    # Reconnect backoff bounds in seconds (full jitter between them, forever: NATS's explicit
    # routes retry forever too).
    reconnect_min: float = 0.05
    reconnect_max: float = 2.0
    # A link with no frame for this long is declared dead (pings go every third of it).
    link_timeout: float = 6.0
    # Seconds a publish on a device log another router owns waits for the owner's outcome
    # (stored or failed) before it is refused as not stored (v5 0x80 naming the owner, a 3.x
    # publisher disconnected): the owner dead, frozen or cut off must not hang publishers for
    # the whole outage. 5 s: well under the ack timeouts clients give up at (10-30 s), so the
    # client hears "not stored, retry" instead of guessing; well over an fsync stall.
    append_timeout: float = 5.0
    # "raft" (the default): every node runs a metadata process (cluster/metaserver.py) and
    # the nodes form a Raft group (issue 24): a device log is placed in Raft on its first
    # publish, at the router its publisher is connected to (cluster/raftplace.py), replicated
    # to replication_factor nodes and stays there when nodes are added. "static": the
    # rendezvous hash places device logs on one router each (no metadata process, no
    # replicas): a node lost with its disk loses its acknowledged messages, and adding a node
    # moves logs. Raft is the default because it is the promise (a PUBACK survives the loss
    # of a minority of nodes), as Kafka made KRaft its default once it was complete.
    placement: str = "raft"
    # Raft placement: how many nodes hold each new device log (the leader's and RF-1 others),
    # capped by the node count; recorded with the log (replication itself is a later step).
    replication_factor: int = 3
    # Raft placement: publishes held per router while their device logs wait for Raft to
    # place them (the first publishes of new devices); past it a publish is refused (v5 0x80
    # naming this key, 3.x: the connection closes), never held without bound (metric
    # meshmq_placement_refused_total{reason="held_full"}).
    placement_max_held: int = 10_000
    # Raft placement: seconds between saves of each persistent session's delivery progress
    # (held log offsets) in the session registry (cluster/sessionreg.py), besides the saves at
    # SUBSCRIBE/UNSUBSCRIBE and at disconnect: a resume on another node after its node is lost
    # reads again what was delivered since the last save (at least once), so shorter means
    # fewer duplicates and more Raft commits (one per tick for every session that moved).
    session_checkpoint_interval: float = 1.0
    # The highest mesh protocol version this router speaks (cluster/frames.py): links use the
    # highest version both ends speak. Pinned to the old version while a cluster is rolled to
    # a new build, then raised (Kafka's inter.broker.protocol.version). Default: the newest.
    protocol_version: int = PROTOCOL_VERSION
    # Raft placement: seconds between a router's batches of device-log floors (how far each
    # log it leads was acknowledged, kept in Raft: cluster/logfloor.py). A node back with a
    # lost disk finds its logs short of their floor and reports them lost instead of
    # restarting them at offset 0; a loss within the last interval is not seen.
    log_floor_interval: float = 5.0
    # Raft placement, failover (cluster/controller.py): seconds a node's Raft voter may go
    # unheard by the Raft leader before the node is dead and its logs' leadership moves to
    # live ISR members (Kafka's broker.session.timeout.ms). Must exceed leader_lease plus the
    # controller's LEASE_SLACK (0.2 s), so a partitioned leader stopped acking first.
    node_timeout: float = 1.0
    # Raft placement: seconds a router keeps acknowledging publishes after its node's voter
    # last heard from a Raft majority (cluster/lease.py); then QoS>=1 publishes are refused
    # (v5 DISCONNECT 0x9C Use another server, 3.x: connection closed) until contact is back.
    leader_lease: float = 0.5
    # Raft placement: seconds a QoS>=1 publish is held (not refused) after the lease ran out,
    # riding over a Raft election (broker/gatehold.py); 0 refuses at once. At most
    # lease_hold_max held per router (refused past it).
    lease_hold: float = 2.0
    lease_hold_max: int = 10_000
    # Replication (Raft placement, issue 24 step 3, cluster/replication.py). "all": a QoS>=1
    # publish is acknowledged once every ISR member holds it (the high-water mark passed it)
    # and the ISR has min_insync_replicas members; "leader": once the leader's fsync holds it
    # (Kafka's acks=1: faster, and an acknowledged message dies with its leader).
    acks: str = "all"
    # The high-water mark advances only while the ISR has this many members (leader
    # included), capped by the log's replication factor (Kafka's min.insync.replicas, KIP-966).
    min_insync_replicas: int = 2
    # A follower not caught up for this long leaves the ISR (Kafka's replica.lag.time.max.ms,
    # 30 s there; 2 s here: the failover target is 2 s, and an ISR member that is gone stalls
    # acks=all until it is shrunk out).
    replica_lag_time_max: float = 2.0
    # How long a leader parks a follower's fetch that has nothing new (Kafka's
    # replica.fetch.wait.max.ms, the same 500 ms); the answer goes as soon as records are
    # durable or the high-water mark moves, so this bounds only an idle log's fetch rate (one
    # FETCH per device and follower per wait: 0.1 s cost 2,800 frames/s per link at 300 idle
    # devices) and how stale a caught-up follower's "last caught up" time gets.
    replica_fetch_wait: float = 0.5
    # Raft placement, leadership follows the device (cluster/affinity.py): seconds a device must
    # publish through one connection at a router that proxies it to the leader (and is an ISR
    # member of its log) before that router asks Raft to lead the log; 0 turns it off. Long
    # enough that a client bouncing between nodes never qualifies (each reconnect starts over).
    leader_affinity_stable: float = 10.0
    # ... and no such move within this many seconds of the log's last leader change seen by
    # the router (any election): one log's leadership moves at most once per interval.
    leader_affinity_min_interval: float = 30.0
    # devices a router tracks for it (one small entry each, least recently proxied dropped
    # first: its stable time starts over; meshmq_leader_affinity_events_total{event="evicted"})
    leader_affinity_max_devices: int = 100_000
    extra: dict = field(default_factory=dict, compare=False)

    def router_ids(self) -> list[str]:
        """Every configured router of the cluster, in router order."""
        return sorted((router_id(n.id, r) for n in self.nodes for r in range(self.routers)),
                      key=router_sort_key)

    def raft_voters(self) -> list[str]:
        """Every node's Raft address ("host:port"), in node order (all nodes vote)."""
        return [f"{n.host}:{n.raft_port}" for n in self.nodes]

    def node(self, node_id: str) -> NodeAddress:
        for n in self.nodes:
            if n.id == node_id:
                return n
        raise KeyError(node_id)

    def address_of(self, rid: str) -> tuple[str, int]:
        node_id, index = split_router_id(rid)
        n = self.node(node_id)
        return n.host, n.port + index
