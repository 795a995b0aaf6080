"""Ports a command listens on, checked before any work: a port another process holds is a
:class:`~hsextract.errors.ConfigError` (exit 2) naming the port, how to find its holder and the setting
that chooses another, never an ``OSError`` traceback once the work has started."""

from __future__ import annotations

import socket
from collections.abc import Callable

from hsextract.errors import ConfigError

#: how a user chooses another metrics port: the flag, the config key, the make variable
METRICS_PORT_SETTING = "--metrics-port (metrics_port in a --config file; HSX_METRICS_PORT for make extract)"


def busy_port_error(host: str, port: int, exc: OSError, what: str, setting: str) -> ConfigError:
    return ConfigError(
        f"cannot listen on {host}:{port} for {what}: {exc.strerror or exc}; nothing was done. Find the process holding "
        f"port {port} with `fuser {port}/tcp` (or `ss -ltnp 'sport = :{port}'`), stop it, or choose another port with "
        f"{setting}"
    )


def check_port_free(host: str, port: int, what: str, setting: str) -> None:
    """A bind test: raise :func:`busy_port_error` when ``host:port`` cannot be listened on now."""
    try:
        with socket.create_server((host, port)):
            pass
    except OSError as exc:
        raise busy_port_error(host, port, exc, what, setting) from None


def serve_metrics(start: Callable[[], object], host: str, port: int) -> None:
    """Start a metrics endpoint (``start`` binds ``host:port``); a port taken since the check is the same error."""
    try:
        start()
    except OSError as exc:
        raise busy_port_error(host, port, exc, "the metrics endpoint", METRICS_PORT_SETTING) from None


def check_metrics_port(host: str, port: int | None) -> None:
    """The metrics port of extract or regenerate, when one is asked for (0 or None: no endpoint)."""
    if port:
        check_port_free(host, port, "the metrics endpoint", METRICS_PORT_SETTING)
