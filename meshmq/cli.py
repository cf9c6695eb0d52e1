"""The ``meshmq`` command line: ``serve``, ``passwd``, ``log``, ``cluster``, ``dev-cluster``,
``clients``, ``sessions``, ``retained`` (``meshmq.admincli``), ``version``.

Why argparse subcommands: one binary for the daemon and its operator tools, like
``mosquitto``/``mosquitto_passwd`` folded together. ``log list|tail|inspect`` lives in
``meshmq.logcli``; ``cluster status`` in ``meshmq.clustercli``; ``dev-cluster`` (a loopback
cluster for trying it out) in ``meshmq.devcluster``. With ``[cluster]`` in the config, ``serve``
runs the node's supervisor (``meshmq.cluster_node``), which starts each router as ``serve
--router R`` (an internal flag, hidden from ``--help``).

Exit codes: 0 ok, 1 the operation failed (e.g. unknown user), 2 bad usage or bad configuration
(argparse's convention; systemd's ``RestartPreventExitStatus=2`` can then avoid restart loops on
a config typo).
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import inspect
import os
import sys
from collections.abc import Sequence

from meshmq.logcli import add_log_parser, run_log
from meshmq.logs import FORMATS, LEVELS

__all__ = ["main", "build_parser"]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


def _version() -> str:
    try:
        from importlib.metadata import PackageNotFoundError, version

        return version("meshmq")
    except PackageNotFoundError:  # running from a source tree that was never installed
        from meshmq import __version__

        return __version__


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (separate so docs and tests can inspect it)."""
    parser = argparse.ArgumentParser(
        prog="meshmq",
        description="meshmq: an MQTT 3.1/3.1.1/5.0 broker with per-device commit logs")
    parser.add_argument("--version", action="version", version=f"meshmq {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    serve = sub.add_parser("serve", help="run a broker node",
                           description="Run a broker node. Settings come from the config file, "
                           "then MESHMQ_<SECTION>__<KEY> environment variables, then these "
                           "flags.")
    serve.add_argument("-c", "--config", metavar="CONFIG",
                       help="TOML config file (default: built-in single-node defaults)")
    serve.add_argument("--log-format", choices=FORMATS, help="override log.format")
    serve.add_argument("--log-level", choices=tuple(LEVELS), type=str.lower,
                       help="override log.level")
    # Internal: the cluster supervisor starts router R of this node with it (router_proc.py).
    serve.add_argument("--router", type=int, metavar="R", help=argparse.SUPPRESS)
    # Internal: the supervisor's PID, so a router can tell that it was orphaned before it could
    # ask the kernel to be told (router_proc._die_with_parent).
    serve.add_argument("--supervisor-pid", type=int, metavar="PID", help=argparse.SUPPRESS)

    passwd = sub.add_parser(
        "passwd", help="add, change or delete a user in a password file",
        description="Set USER's password in FILE (created with mode 0600). The password is read "
        "from stdin (one line) when stdin is not a terminal, else prompted for twice.")
    passwd.add_argument("file", metavar="FILE")
    passwd.add_argument("user", metavar="USER")
    passwd.add_argument("--delete", action="store_true", help="remove USER instead")

    add_log_parser(sub)
    from meshmq.clustercli import add_cluster_parser
    from meshmq.devcluster import add_dev_cluster_parser

    add_cluster_parser(sub)
    add_dev_cluster_parser(sub)
    from meshmq.admincli import add_admin_parsers

    add_admin_parsers(sub)  # clients, sessions, retained (issue 27)

    sub.add_parser("version", help="print the version")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``meshmq`` console script; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "serve":
        return _serve(args)
    if args.command == "passwd":
        return _passwd(args)
    if args.command == "log":
        return run_log(args)
    if args.command == "cluster":
        from meshmq.clustercli import run_cluster

        return run_cluster(args)
    if args.command == "dev-cluster":
        from meshmq.devcluster import run_dev_cluster

        return run_dev_cluster(args)
    if args.command in ("clients", "sessions", "retained"):
        from meshmq.admincli import run_admin

        return run_admin(args)
    if args.command == "version":
        print(f"meshmq {_version()}")
        return EXIT_OK
    parser.print_help(sys.stderr)
    return EXIT_USAGE


def _serve(args: argparse.Namespace) -> int:
    import dataclasses

    from meshmq.config import ConfigError, load_config
    from meshmq.logs import setup_logging

    try:
        config = load_config(args.config, os.environ)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return EXIT_USAGE
    overrides = {}
    if args.log_format:
        overrides["log_format"] = args.log_format
    if args.log_level:
        overrides["log_level"] = args.log_level
    if overrides:
        config = dataclasses.replace(config, **overrides)
    setup_logging(config.log_level, config.log_format)
    if args.router is not None:
        if config.cluster is None or not 0 <= args.router < config.cluster.routers:
            print("meshmq serve: --router is internal to a cluster node's supervisor (index "
                  "below cluster.routers, with [cluster] set)", file=sys.stderr)
            return EXIT_USAGE
        from meshmq.router_proc import run_router

        return run_router(config, args.router, args.supervisor_pid)
    if config.cluster is not None:
        from meshmq.cluster_node import run_supervisor

        passed = []  # the routers get the same overrides the supervisor got
        if args.log_format:
            passed += ["--log-format", args.log_format]
        if args.log_level:
            passed += ["--log-level", args.log_level]
        try:
            return run_supervisor(config, args.config, passed)
        except KeyboardInterrupt:
            return 130

    # Imported here: the node pulls in every room, which `passwd` and `version` do not need.
    from meshmq.node import run_node

    try:
        result = run_node(config)
        if inspect.iscoroutine(result):
            result = asyncio.run(result)
    except KeyboardInterrupt:
        return 130
    return int(result or 0)


def _read_password(user: str) -> str | None:
    if not sys.stdin.isatty():
        line = sys.stdin.readline()
        return line.rstrip("\r\n")
    first = getpass.getpass(f"Password for {user}: ")
    second = getpass.getpass("Repeat password: ")
    if first != second:
        print("meshmq passwd: passwords do not match", file=sys.stderr)
        return None
    return first


def _passwd(args: argparse.Namespace) -> int:
    from broker.auth import delete_user, write_password

    try:
        if args.delete:
            delete_user(args.file, args.user)
            return EXIT_OK
        password = _read_password(args.user)
        if password is None:
            return EXIT_FAILED
        write_password(args.file, args.user, password)
    except KeyError:
        print(f"meshmq passwd: no user {args.user!r} in {args.file}", file=sys.stderr)
        return EXIT_FAILED
    except ValueError as exc:
        print(f"meshmq passwd: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except OSError as exc:
        print(f"meshmq passwd: {args.file}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK
