"""Fixtures shared by the cluster tests (one copy instead of one per test file)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from helpers.cluster import Cluster
from helpers.tcpproxy import TcpProxy


@pytest.fixture
def pair_via_proxy(tmp_path) -> Iterator[tuple[Cluster, TcpProxy]]:
    """Two nodes; node 0 reaches node 1 through a proxy the test can cut."""
    cluster = Cluster(tmp_path, n=2)
    proxy = TcpProxy(cluster.mesh_ports[1])
    cluster.dial_via(0, 1, proxy.port)
    try:
        cluster.start()
        yield cluster, proxy
    finally:
        proxy.close()
        cluster.stop()
