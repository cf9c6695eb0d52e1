"""The router mesh: links between routers, route exchange, who leads each device log.

``mesh.Mesh`` is the forwarder the node wiring hands a router (``meshmq/cluster_wiring.py``):
``frames`` and ``handshake`` are the sans-I/O link protocol, ``link.MeshLink`` one peer's link
across reconnects (``connection.LinkConnection`` one TCP connection of it), ``requests`` the
mesh's request/response table, ``routes.RouteTable`` the peers' filters,
``placement.Placement`` who leads each device log (rendezvous hashing, or with
``cluster.placement = "raft"`` the leaders Raft holds: ``raftplace`` feeds it and places new
logs). The supervisor of a node's router processes is ``meshmq/supervisor.py``. ISR replication
comes next; ``frames`` already has the fetch frames a follower will use. Nothing here is
imported by a single node.
"""
