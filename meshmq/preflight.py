"""Start-up checks that run before anything listens: each failure names its config key.

Why a separate pass: a node that opens its TCP and admin listeners, then finds its TLS key does
not match its certificate, has already told load balancers it is there; and a failure that exits
1 makes systemd's ``Restart=on-failure`` loop on a mistake only an operator can fix. Everything an
operator must fix exits 2 (``deploy/meshmq.service`` has ``RestartPreventExitStatus=2``), like a
bad config value, and names the key to change, as Mosquitto's and EMQX's config errors do not.
"""

from __future__ import annotations

import os
import ssl

from meshmq.config import NodeConfig


class StartupError(Exception):
    """A setting the node cannot start with; ``key`` is the config key to change."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key


def check_startup(config: NodeConfig) -> None:
    """Raise StartupError for the first setting that cannot work."""
    _check_dir("node.data_dir", config.data_dir)
    if config.commitlog.enabled:
        _check_dir("commitlog.dir", config.commitlog.directory)
    lst = config.broker.listeners
    if lst.tls_bind:
        _check_tls(lst.tls_certfile, lst.tls_keyfile, lst.tls_cafile)


def _check_dir(key: str, path: str) -> None:
    """``path`` is (or can be created as) a directory this process may write in."""
    probe = os.path.abspath(path)
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    if not os.path.isdir(probe):
        where = "is" if probe == os.path.abspath(path) else f"is under {probe!r}, which is"
        raise StartupError(key, f"{path!r} {where} a file, not a directory: point {key} at a "
                                f"directory (or remove the file)")
    if not os.access(probe, os.W_OK | os.X_OK):
        uid = os.geteuid()
        raise StartupError(key, f"no write permission in {probe!r} for uid {uid} (or the "
                                f"filesystem is read-only): give this user write access or "
                                f"point {key} elsewhere")


def _check_tls(certfile: str | None, keyfile: str | None, cafile: str | None) -> None:
    """The TLS listener's files load as the listener will load them."""
    for key, path in (("listener.tls.certfile", certfile), ("listener.tls.keyfile", keyfile),
                      ("listener.tls.cafile", cafile)):
        if path and not os.path.isfile(path):
            raise StartupError(key, f"{path!r} is not a readable file")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        ctx.load_cert_chain(certfile or "", keyfile)
    except ssl.SSLError as exc:
        if "KEY_VALUES_MISMATCH" in str(exc) or "key values mismatch" in str(exc):
            raise StartupError("listener.tls.keyfile", f"{keyfile!r} is not the private key of "
                                                       f"the certificate in {certfile!r}") from None
        raise StartupError("listener.tls.keyfile", f"cannot load the certificate {certfile!r} "
                                                   f"with the key {keyfile!r} ({exc.reason or exc}"
                                                   f"): is keyfile a PEM private key and "
                                                   f"certfile a PEM certificate?") from None
    if cafile:
        try:
            ctx.load_verify_locations(cafile)
        except ssl.SSLError as exc:
            why = exc.reason or exc
            raise StartupError("listener.tls.cafile",
                               f"{cafile!r} holds no usable CA certificate ({why})") from None
