"""format("meshmq") reads a whole 3-node cluster through ONE node's admin URL (issue 15): the
node lists every router's logs and its many-device fetch reaches every owner over the mesh.
A listing that lacks an unreachable router fails planning naming it, instead of reading as
"those logs are gone"."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from helpers.broker import wait_for
from helpers.cluster import Cluster
from helpers.spark import admin, device_messages, publish, unique_device

from spark_connector.client import LogClient, ServerUnavailable

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path_factory.mktemp("spark-mesh"), n=3)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def test_one_nodes_url_reads_devices_owned_on_every_node(spark: Any, mesh: Cluster) -> None:
    tag = unique_device("sc")
    devs = [mesh.device_owned_by(k, f"{tag}n{k}-") for k in (0, 1, 2)]
    counts = {devs[0]: 30, devs[1]: 45, devs[2]: 60}
    for k, d in enumerate(devs):  # publish at another node than the owner's
        publish(mesh.nodes[(k + 1) % 3], device_messages(d, 0, counts[d]))
    rows = spark.read.format("meshmq").option("servers", admin(mesh.nodes[0])) \
        .option("devices", ",".join(devs)).option("fetchMaxBytes", "2000").load().collect()
    got = sorted((r["device"], r["offset"], bytes(r["payload"])) for r in rows)
    assert got == sorted((d, i, f"{d}:{i}".encode()) for d, n in counts.items()
                         for i in range(n))  # every record of every owner, exactly once

    mesh.nodes[2].stop(timeout=15)
    wait_for(lambda: mesh.link(0, 2)["state"] != "up", 20, message="n0's link to n2 down")
    client = LogClient((("127.0.0.1", mesh.nodes[0].admin_port),), timeout_s=30)
    try:
        with pytest.raises(ServerUnavailable, match="n2/0"):
            client.list_logs()
    finally:
        client.close()
