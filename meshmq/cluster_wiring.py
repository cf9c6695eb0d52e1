"""Wires a router process into the mesh: builds cluster.mesh.Mesh and hands the router its
forwarder. The only place that knows both the router and the cluster (broker/ never imports
cluster/, see shared/notes/architecture.md)."""

from __future__ import annotations

from typing import Any


async def attach_mesh(node: Any) -> Any:
    """Start this router's mesh links; returns the Mesh (``close()``, ``status()``)."""
    from cluster.mesh import Mesh  # not imported by single nodes

    mesh = Mesh(node.config.cluster, node.router_index, node.router, node.store, node.stats)
    await mesh.start()
    return mesh
