"""The router mesh: links between routers, route exchange, device-log ownership, the supervisor.

``mesh.Mesh`` is the forwarder the node wiring hands a router (``meshmq/cluster_wiring.py``):
``frames`` and ``handshake`` are the sans-I/O link protocol, ``link.MeshLink`` one peer's link
across reconnects, ``routes.RouteTable`` the peers' filters, ``ownership.Ownership`` who owns a
device log (rendezvous hashing until Raft holds leaders), ``supervisor`` the N router processes
of a node. Raft-held metadata and ISR replication come next; ``frames`` already has the fetch
frames a follower will use. Nothing here is imported by a single node.
"""
