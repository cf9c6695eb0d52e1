"""Node assembly: builds one meshmq node from a validated config and runs it until a signal.

This is the only place that knows every room; each room receives just its own settings. Signals:
SIGTERM/SIGINT drain gracefully (stop accepting, v5 DISCONNECT 0x8B to clients, flush, exit 0);
SIGHUP reloads the password and ACL files and the TLS listener's certificate files (Mosquitto
2.0 reloads the same on SIGHUP).
"""

from __future__ import annotations

import asyncio
import errno
import gc
import ipaddress
import logging
import os
import signal
import ssl
from functools import partial

import uvloop
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from broker.auth import Authenticator
from broker.listener import Listeners
from broker.logrules import LogRules
from broker.pubdedupe import PublisherDedupe, for_router
from broker.router import Router
from broker.sessionstore import SessionPersistence, attach
from broker.stats import BrokerStats
from broker.systopics import SysTopics
from commitlog.groupcommit import GroupCommitter
from commitlog.store import LogStore, LogStoreError
from meshmq import __version__
from meshmq.admin import AdminServer
from meshmq.admin_auth import AdminAuth
from meshmq.config import NodeConfig, parse_bind
from meshmq.dirlock import DataDirInUse, DataDirLock
from meshmq.hwmhold import HighWatermarkHold
from meshmq.metrics import GcPauseMonitor, LoopLagMonitor, MetricsRegistry, fast_paths
from meshmq.preflight import StartupError, check_startup

log = logging.getLogger("meshmq.node")

GC_YOUNG_THRESHOLD = 10_000  # net allocations between young collections (CPython: 700; start())


class Node:
    def __init__(self, config: NodeConfig, router_index: int = 0) -> None:
        self.config = config
        # Which router of this node this process is (0 for a single node); with [cluster] set,
        # the supervisor starts one process per index (meshmq/supervisor.py).
        self.router_index = router_index
        self.mesh = None  # cluster.mesh.Mesh when [cluster] is set (meshmq/cluster_wiring.py)
        self.stats = BrokerStats()
        auth_settings = config.broker.auth
        needs_auth = (not auth_settings.allow_anonymous or auth_settings.password_file
                      or auth_settings.acl_file)
        self.auth = Authenticator(auth_settings) if needs_auth else None
        self.router: Router | None = None
        self.sys_topics: SysTopics | None = None
        self.listeners: Listeners | None = None
        self.metrics = MetricsRegistry()
        self.lag = LoopLagMonitor(self.metrics)
        self.gc_pauses = GcPauseMonitor(self.metrics)
        self.hwm_hold: HighWatermarkHold | None = None  # a test-only failpoint (hwmhold.py)
        self.admin_auth: AdminAuth | None = None
        self.admin = self._admin_server(config)
        self.store: LogStore | None = None
        self.committer: GroupCommitter | None = None
        self.persistence: SessionPersistence | None = None
        self.bridges = None  # meshmq.bridge.Bridges when [[bridge]] sections are configured
        self._ready = False
        self._stop = asyncio.Event()
        self._dirlock: DataDirLock | None = None  # one process per data_dir (meshmq/dirlock.py)

    def ready(self) -> bool:
        """Ready for traffic: started, not draining, and the commit log can store (a broker
        that refuses every publish should be taken out of the load balancer, as a Kafka
        broker with a failed log dir goes offline for it)."""
        return self._ready and (self.committer is None or self.committer.failure is None)

    def not_ready_reason(self) -> str:
        if self.committer is not None and self.committer.failure is not None:
            return (f"the commit log cannot write ({self.committer.failure}); publishes are "
                    f"refused until the volume under {self.config.commitlog.directory} "
                    f"accepts writes again (free disk space there)")
        return "starting" if self.router is None else "not ready (starting or draining)"

    def _admin_server(self, config: NodeConfig) -> AdminServer:
        """The admin HTTP server, with credentials and the read ACL on the fetch API when the
        node authenticates (password file) or has admin tokens; see meshmq/admin_auth.py."""
        auth = config.broker.auth
        if auth.password_file or config.admin_token_file:
            self.admin_auth = AdminAuth(
                asyncio.get_event_loop(), self.auth if auth.password_file else None,
                config.admin_token_file, LogRules(config.commitlog.rules),
                max_failures=auth.max_failures, failure_window=auth.failure_window,
                max_address_failures=auth.max_address_failures)
        ctx = None
        if config.admin_certfile and config.admin_keyfile:
            ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            ctx.load_cert_chain(config.admin_certfile, config.admin_keyfile)
        host = parse_bind(config.admin_bind)[0]
        if self.admin_auth is None and not _is_loopback(host):
            log.warning("the admin server binds %s without authentication: anyone who can reach "
                        "it reads every device log; set auth.password_file or admin.token_file, "
                        "or bind it to loopback", config.admin_bind,
                        extra={"admin": config.admin_bind})
        middlewares = [self.admin_auth.middleware] if self.admin_auth else ()
        return AdminServer(config.admin_bind, self.metrics.registry, self.ready,
                           self.not_ready_reason, middlewares=middlewares, ssl_context=ctx)

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        log_config = self.config.commitlog
        rules = None
        if log_config.enabled:
            # Recovery (scan after the last checkpoint, truncate a torn tail) happens here,
            # before any listener accepts a client.
            self.store = LogStore.open(log_config.directory, log_config.settings)
            self.committer = GroupCommitter(self.store, loop)
            rules = LogRules(log_config.rules)
            self.metrics.add_commitlog(self.store.stats, self.store)
            from meshmq.fetch_api import register_fetch_routes

            register_fetch_routes(self.admin.app, self.store,
                                  self.admin_auth.may_read if self.admin_auth else None)
            log.info("commit log open", extra={"dir": log_config.directory,
                                               "devices": len(self.store.keys())})
            self.hwm_hold = HighWatermarkHold.from_env(os.environ, self.store, loop)
            if self.hwm_hold is not None:
                self.hwm_hold.start()
        self.router = Router(self.config.broker, self.stats, self.auth, loop,
                             self.committer, rules)
        self.metrics.add_broker(self.stats, self.router.gauges)
        if self.config.cluster is not None and self.router.logs is not None \
                and self.committer is not None:  # mqtt.publisher_dedupe = "cluster" (default)
            self.router.logs.dedupe = for_router(self.committer, self.config.broker.mqtt, True)
        if self.router.logs is not None and self.router.logs.dedupe is not None:
            self.metrics.add_collector(partial(_dedupe_metrics, self.router.logs.dedupe),
                                       "publish_dedupe")
        if self.config.cluster is not None and self.router.logs is not None:
            from meshmq.cluster_wiring import owner_lookup

            # before the sessions come back: their cursors on logs other routers own read
            # from those owners (the mesh itself starts below, once they are restored)
            self.router.logs.remote_owner = owner_lookup(self)
        self._attach_persistence()
        self._register_admin_api()
        if self.router.catchup is not None:
            from meshmq.lag_api import register_lag_routes

            register_lag_routes(self.admin.app, self.router.catchup)
        if self.config.cluster is not None:
            from meshmq.cluster_wiring import attach_mesh

            self.mesh = await attach_mesh(self)
        self.listeners = Listeners(self.router, self.config.broker.listeners, self.stats)
        cluster = self.config.cluster
        self.sys_topics = SysTopics(
            self.router, self.stats, self.config.broker.mqtt.sys_interval, __version__, loop,
            # in a cluster, also under this router's name, seen from every router (EMQX's
            # $SYS/brokers/<node>/...): $SYS/broker/... stays this router's own view
            cluster_prefix=(f"$SYS/brokers/{cluster.node_id}/{self.router_index}/"
                            if cluster is not None else None))
        await self.admin.start()
        self.router.start()
        self.sys_topics.start()
        self.lag.start()
        self.gc_pauses.start()
        # Everything built so far (modules, config, the commit log's recovered indexes) lives as
        # long as the process. Freezing it keeps the cyclic GC from walking it again in every
        # full collection: measured here, a full collection over the ~41k start-up objects took
        # 20-40 ms, paid every few seconds under load as one loop stall (the p99 of a
        # 60k msg/s latency run). The CPython docs recommend gc.freeze() for exactly this.
        gc.collect()
        gc.freeze()
        # The young generation is collected after 10,000 net allocations instead of CPython's
        # 700. A QoS 1 group-commit batch keeps ~1,000 publishes (a Message, a Delivery, a
        # tuple each) alive until its fsync: at 700 every batch crossed the threshold several
        # times, each collection walked the batch and promoted it, and gen-1/gen-2 walked it
        # again. Measured in the bench's broker (gc.callbacks timing, issue 25): qos1 3.3 % of
        # its CPU in the collector with 1,558 young collections in 4.5 s, 1.1 % with 7 at
        # 10,000; qos0 3.0 % -> 1.4 %. Nearly everything the broker allocates is acyclic and
        # freed by reference counting, so the higher threshold delays little garbage
        # (Instagram's and CPython's own gc advice for servers, the same reasoning).
        gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])
        slow = [part for part, on in fast_paths().items() if not on]
        if slow:
            log.warning("running the pure-Python %s (its optional C extension is not built or "
                        "is switched off): expect more CPU per message. Reinstall with a C "
                        "compiler and the Python headers (pip install -e .) to build it, and "
                        "unset BROKER_PURE_PYTHON / COMMITLOG_PURE_PYTHON / CLUSTER_PURE_PYTHON",
                        " and ".join(slow), extra={"pure_python": slow})
        # Listeners open last: the first client must not wait behind the start-up work above
        # (gc.collect took ~50 ms), and "ready" is logged as they start accepting.
        await self.listeners.start()
        from meshmq.bridge import attach_bridges

        self.bridges = attach_bridges(self)  # [[bridge]]: after the sessions are restored
        if self.bridges is not None:
            self.bridges.start()
        self._ready = True
        log.info("meshmq node ready", extra={"node_id": self.config.node_id,
                                              "mqtt": self.listeners.bound.get(
                                                  "tcp", self.config.broker.listeners.tcp_bind),
                                              "admin": self.config.admin_bind})

    def _register_admin_api(self) -> None:
        """Clients, sessions, subscriptions and retained messages on the admin port
        (meshmq/admin_api.py), under the fetch API's authentication and ACL."""
        from meshmq.admin_api import register_admin_routes

        cluster = self.config.cluster
        name = (f"{cluster.node_id}/{self.router_index}" if cluster is not None
                else self.config.node_id)
        assert self.router is not None
        register_admin_routes(self.admin.app, self.router, name,
                              self.admin_auth.may if self.admin_auth else None)

    def _attach_persistence(self) -> None:
        """Retained messages and persistent sessions from the state logs (mqtt.persistence),
        restored before any listener opens; a gauge family says what came back."""
        mqtt = self.config.broker.mqtt
        if not mqtt.persistence:
            log.info("mqtt.persistence is off: retained messages and persistent sessions "
                     "do not survive a restart")
            return
        if self.committer is None:
            log.warning("mqtt.persistence needs the commit log (commitlog.enabled = false): "
                        "retained messages and persistent sessions do not survive a restart")
            return
        self.persistence = attach(self.router, self.committer, mqtt.persistence_interval)
        gauges = self.persistence.gauges

        def restored() -> list[GaugeMetricFamily]:
            family = GaugeMetricFamily(
                "meshmq_persistence_restored",
                "State restored at start-up from the state logs (mqtt.persistence), by kind",
                labels=["kind"])
            for kind, value in gauges().items():
                family.add_metric([kind], value)
            return [family]

        self.metrics.add_collector(restored, "persistence")

    async def stop(self) -> None:
        """Graceful drain; safe to call once start() got as far as it did."""
        self._ready = False
        log.info("draining: no new connections, disconnecting clients")
        if self.listeners is not None:
            self.listeners.stop_accepting()
        if self.hwm_hold is not None:
            self.hwm_hold.stop()
        if self.bridges is not None:
            await self.bridges.stop()  # its local session goes offline with a clean DISCONNECT
        if self.router is not None:
            await self.router.drain()
        if self.mesh is not None:
            await self.mesh.close()  # after the drain: wills and last acks still cross links
        if self.persistence is not None:
            self.persistence.close()  # sessions as the drain left them, durable with the close
        if self.listeners is not None:
            await self.listeners.close()
        if self.committer is not None:
            await self.committer.close()  # flush, fsync, checkpoint, close the store
        self.lag.stop()
        self.gc_pauses.stop()
        if self.sys_topics is not None:
            self.sys_topics.stop()
        await self.admin.stop()
        if self.admin_auth is not None:
            self.admin_auth.close()
        if self._dirlock is not None:
            self._dirlock.release()  # last: the store is closed, another process may have it
        log.info("meshmq node stopped")

    async def lock_data_dir(self) -> DataDirLock:
        """This process's hold on its data_dir (raises DataDirInUse); a router waits a while."""
        return DataDirLock.acquire(self.config.data_dir)

    def request_stop(self) -> None:
        self._stop.set()

    def reload(self) -> None:
        tls = self.listeners.reload_tls() if self.listeners is not None else None
        if self.admin_auth is not None:
            self.admin_auth.reload()
        if self.auth is not None:
            log.info("SIGHUP: reloading password and ACL files")
            self.auth.reload()
        elif tls is None:
            log.info("SIGHUP: nothing to reload (no password or ACL file, no TLS listener)")

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop)
        loop.add_signal_handler(signal.SIGHUP, self.reload)
        try:
            check_startup(self.config)
            self._dirlock = await self.lock_data_dir()
        except StartupError as err:
            log.error("cannot start: %s", err, extra={"key": err.key})
            return 2
        except DataDirInUse as err:
            log.error("cannot start: node.data_dir: %s", err,
                      extra={"key": "node.data_dir", "holder_pid": err.holder.get("pid")})
            return 2
        try:
            await self.start()
        except LogStoreError as err:
            if isinstance(err.__cause__, BlockingIOError):
                # The store's own flock: another process on this commitlog.dir (outside
                # data_dir, or the data_dir lock would have said so first). An operator's fix,
                # so 2, like a data_dir in use: systemd must not restart into it.
                log.error("cannot start: commitlog.dir: %s: another meshmq process uses it "
                          "(node.data_dir differs, commitlog.dir is the same); give each node "
                          "its own commitlog.dir", err, extra={"key": "commitlog.dir"})
                await self.stop()
                return 2
            log.error("cannot open the commit log: %s (is another meshmq using this data_dir? "
                      "set node.data_dir or commitlog.dir)", err)
            await self.stop()
            return 1
        except OSError as err:
            hint = (" (is another broker already listening there?)"
                    if err.errno == errno.EADDRINUSE else "")
            log.error("cannot start: %s%s", err, hint)
            await self.stop()
            return 1
        await self._stop.wait()
        await self.stop()
        return 0


def _dedupe_metrics(dedupe: PublisherDedupe) -> list[CounterMetricFamily]:
    """Publisher dedupe's lookups (broker/pubdedupe.py): a hit is a resend acknowledged with
    its stored copy's offset instead of being stored twice."""
    family = CounterMetricFamily(
        "meshmq_publish_dedupe",
        "Publishes that may have been stored already (DUP=1 or a meshmq-message-id) looked up "
        "in their device log's newest records (mqtt.dedupe_window) by its leader: hit = found, "
        "acknowledged with that offset and not stored again; miss = appended.",
        labels=["result"])
    family.add_metric(["hit"], dedupe.hits)
    family.add_metric(["miss"], dedupe.misses)
    return [family]


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: assume it may resolve beyond loopback


def run_node(config: NodeConfig) -> int:
    async def main() -> int:
        return await Node(config).run()

    return uvloop.run(main())
