"""Connecting to a Ray cluster, or starting one on this machine ('auto')."""

from __future__ import annotations

from kernelloop.sandbox.cluster.jobs import ClusterUnavailable

CONNECT_TIMEOUT_S = 15.0  # an unreachable address fails within this, not Ray's minute of retries
INSTALL_HINT = '--cluster needs Ray: pip install "kernelloop[ray]"'


def import_ray():  # noqa: ANN201  (the ray module)
    try:
        import ray
    except ImportError:
        raise ClusterUnavailable(INSTALL_HINT) from None
    return ray


def _loopback(address: str | None = None) -> str:
    return "127.0.0.1"


def keep_loopback() -> None:
    """Make this process's Ray take 127.0.0.1 as this node's address. Ray turns a node address of
    127.0.0.1 into the machine's routable one (it asks the kernel which source address a packet to
    the internet would leave from); a cluster of one machine needs no other address than loopback.
    Only for processes that start their own node (Ray 2.60's internals, hence the pinned version)."""
    from ray._private import services

    services.node_ip_address_from_perspective = _loopback


def _use_token_if_any() -> None:
    """A cluster started by `ray start` has token authentication on, its token in ~/.ray/auth_token;
    a driver connecting to it must send it (Ray's own `ray.init()` only does so for clusters it starts)."""
    try:
        from ray._private.authentication.authentication_token_setup import (
            maybe_enable_token_auth_if_token_available,
        )
    except ImportError:  # another Ray version: its own defaults
        return
    maybe_enable_token_auth_if_token_available(warn_if_disabled=False)


def _reachable(address: str) -> None:
    """A TCP connect to host:port within CONNECT_TIMEOUT_S, so a wrong address is one quick line."""
    import socket

    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S):
            return
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc) or type(exc).__name__
        raise ClusterUnavailable(f"cannot reach the Ray cluster at {address}: {reason}") from None


def _running_here() -> str | None:
    """The address of the Ray cluster running on this machine ($RAY_ADDRESS, else Ray's record of the
    latest one it started), or None when there is none."""
    from ray._private import services

    try:
        found = services.get_ray_address_from_environment("auto", None)
    except ConnectionError:
        return None
    return None if found in (None, "", "auto", "local") else found


def _is_loopback(address: str) -> bool:
    return address.rpartition(":")[0].strip("[]") in ("127.0.0.1", "localhost", "::1")


def connect(address: str) -> bool:
    """'auto': connect to the Ray cluster running on this machine, else start a local one
    (127.0.0.1, dashboard off); 'ray://host:port' or 'host:port': that existing cluster.
    Returns True when it started Ray itself (the caller then shuts it down). Raises
    ClusterUnavailable with one line when Ray is missing or the cluster cannot be reached."""
    ray = import_ray()
    if ray.is_initialized():
        return False
    quiet = {"log_to_driver": False, "configure_logging": False}
    if address == "auto":
        found = _running_here()
        if found is None:  # nothing running here: start one
            keep_loopback()
            try:
                ray.init(include_dashboard=False, _node_ip_address="127.0.0.1", **quiet)
            except Exception as exc:  # noqa: BLE001  (Ray's own errors, many kinds)
                raise ClusterUnavailable(f"cannot start a local Ray cluster: {str(exc).splitlines()[0][:200]}") from None
            return True
        address = found
    target = address.removeprefix("ray://")
    _reachable(target)
    if not address.startswith("ray://") and _is_loopback(target):
        keep_loopback()  # a cluster on loopback: this driver's node is 127.0.0.1 too, not the routable address
    _use_token_if_any()
    try:
        ray.init(address=address, **quiet)
    except Exception as exc:  # noqa: BLE001
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise ClusterUnavailable(f"cannot reach the Ray cluster at {address}: {first}") from None
    return False
