"""The rendezvous store: where it is, reaching it within the set-up bound, and what a rank
says when it goes away.

torch's ``TCPStore`` client waits without end for an answer when something else than a store
listens at the address (its own timeout does not apply to that first exchange), and reports
a store that went away as ``DistNetworkError: Broken pipe``. Here a connection that does not
complete within the bound is a :class:`SetupTimeoutError` naming the address, and any
operation on a store that is gone is a :class:`StoreGoneError` naming who hosted it.
"""

from __future__ import annotations

import re
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch.distributed as dist
from torch.distributed.distributed_c10d import Store

from meshconf.core.errors import MeshconfError
from meshconf.core.messages import first_line, shorten

_PORT = re.compile(r"[0-9]{1,5}")
_HOST = re.compile(r"[A-Za-z0-9_.:\[\]%-]{1,253}")


class RuntimeSetupError(MeshconfError):
    """The process group, the device or the meshes cannot be set up as the config asks."""


class SetupTimeoutError(RuntimeSetupError):
    """Ranks did not reach a step of set-up within ``runtime.setup_timeout_s``."""


class StoreGoneError(RuntimeSetupError):
    """The rendezvous store stopped answering: the process that hosted it ended."""


@dataclass(frozen=True)
class Address:
    """Where the store is, and who hosts it, in words (``rank 0``, ``torchrun's agent``)."""

    host: str
    port: int
    host_is: str

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def store_address(environ: Mapping[str, str], who: str) -> Address:
    """MASTER_ADDR and MASTER_PORT, checked before anything connects; ``who`` names this
    rank in the messages (``rank 3``).

    Raises:
        MeshconfError: either is missing, or is not a host name and a port from 1 to 65535.
    """
    host, port = environ.get("MASTER_ADDR", ""), environ.get("MASTER_PORT", "")
    if not host or not port:
        raise MeshconfError(
            f"{who} has no MASTER_ADDR and MASTER_PORT (torchrun sets them; under SLURM, export "
            "the host and port of rank 0)"
        )
    if _HOST.fullmatch(host) is None:
        raise MeshconfError(f"{who} has MASTER_ADDR={shorten(host)!r}, which is not a host name")
    if _PORT.fullmatch(port) is None or not 1 <= int(port) <= 65535:
        raise MeshconfError(f"{who} has MASTER_PORT={shorten(port)!r}, not a port (1 to 65535)")
    agent = environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    return Address(host, int(port), "torchrun's agent" if agent else "rank 0")


def connect(address: Address, *, hosts: bool, world_size: int | None, timeout_s: float) -> Store:
    """Host the store at ``address``, or connect to it, within ``timeout_s``.

    A client first waits, with its own connection attempts, until something listens at the
    address: torch's client logs a warning on every rank for every attempt that fails, the
    lines a user reading the logs of a late rank 0 does not need.

    Raises:
        RuntimeSetupError: this rank should host the store and cannot (the port is taken).
        SetupTimeoutError: no store answered there within ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    unreachable = SetupTimeoutError(
        f"{address.host_is} did not start within {timeout_s:g} s, or stopped: no rendezvous "
        f"store answered at {address} (runtime.setup_timeout_s; are MASTER_ADDR and "
        f"MASTER_PORT those of {address.host_is}, with no other program listening there?)"
    )
    if not hosts and not _listening(address, deadline):
        raise unreachable
    result: list[Any] = []

    def open_store() -> None:
        try:
            store = dist.TCPStore(  # type: ignore[attr-defined]
                address.host,
                address.port,
                world_size,
                is_master=hosts,
                timeout=timedelta(seconds=max(deadline - time.monotonic(), 1.0)),
                wait_for_workers=False,
            )
            store.set_timeout(timedelta(seconds=timeout_s))
            result.append(store)
        except (RuntimeError, dist.DistError) as error:
            result.append(error)

    # In a thread, so that a listener that never answers as a store cannot hold this rank.
    opener = threading.Thread(target=open_store, name="meshconf-store-connect", daemon=True)
    opener.start()
    opener.join(max(deadline - time.monotonic(), 0) + 1)
    if not result:
        raise unreachable
    if isinstance(result[0], Exception):
        if not hosts:
            raise unreachable
        first = first_line(result[0])
        raise RuntimeSetupError(f"rank 0 could not host the rendezvous store at {address}: {first}")
    store: Store = result[0]
    return store


def _listening(address: Address, deadline: float) -> bool:
    """Whether something accepts connections at ``address`` before ``deadline``."""
    pause = 0.01
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        try:
            with socket.create_connection((address.host, address.port), min(remaining, 1.0)):
                return True
        except OSError:
            time.sleep(min(pause, max(deadline - time.monotonic(), 0)))
            pause = min(2 * pause, 0.5)


class GuardedStore:
    """A store whose operations raise :class:`StoreGoneError` with ``gone`` (``the store at
    10.0.0.1:29500 is gone: rank 0 stopped``) when the store went away; anything else is
    torch's own error."""

    def __init__(self, store: Store, gone: str) -> None:
        self._store = store
        self._gone = gone

    def __getattr__(self, name: str) -> Callable[..., Any]:
        operation = getattr(self._store, name)

        def guarded(*args: Any, **kwargs: Any) -> Any:
            try:
                return operation(*args, **kwargs)
            except dist.DistNetworkError as error:
                raise StoreGoneError(f"{self._gone} ({first_line(error)})") from None

        return guarded
