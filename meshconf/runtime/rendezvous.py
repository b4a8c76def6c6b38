"""Set-up across ranks through the rendezvous store: arrivals, the config check, failures.

Every rank of a launched world reaches the same key-value store (torchrun's agent store, or
the one rank 0 hosts at MASTER_ADDR:MASTER_PORT) before any process group exists. meshconf
keeps its own keys there, under ``meshconf/<n>/`` for the n-th context of the job:

- ``<phase>/<rank>``: the rank got through the phase (``joined``, ``checked``, ``built``);
  the last rank to arrive sets ``<phase>/done``.
- ``failed``: the first failing rank's reason, in words; the failing rank also sets every
  ``<phase>/done`` to wake the others at once, and each of them quotes the reason.

Every wait is bounded by ``runtime.setup_timeout_s``, after which the ranks that did not
arrive are named. A rank that hosts the store waits, after failing, until the other ranks
have read the reason (or the bound passes), since the store ends with its process.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from datetime import timedelta

import torch.distributed as dist
from torch.distributed.distributed_c10d import PrefixStore, Store

from meshconf.core.errors import MeshconfError
from meshconf.runtime.launch import Launch, LaunchError

PHASES = ("joined", "checked", "built")
_FAILED = "failed"
_MISSING_SHOWN = 8  # ranks named in a message; the rest are counted
# A waiting rank asks the store again after 1 ms, then after twice as long each time, up to a
# pause that grows with the world (50 ms at least, 1 s at most): W ranks pausing W * 50 us
# send one store at most 40,000 requests a second (two per pause: a failure, then the keys),
# and no rank sees the last arrival more than a second late.
_FIRST_PAUSE_S = 0.001
_PAUSE_PER_RANK_S = 50e-6
_LONGEST_PAUSE_RANGE_S = (0.05, 1.0)


class RuntimeSetupError(MeshconfError):
    """The process group, the device or the meshes cannot be set up as the config asks."""


class RankFailedError(RuntimeSetupError):
    """Another rank failed during set-up; the message is its reason."""


class RankReasonError(RuntimeSetupError):
    """A set-up failure whose message already names this rank: published as it is."""


class SetupTimeoutError(RuntimeSetupError):
    """Ranks did not reach a step of set-up within ``runtime.setup_timeout_s``."""


def _ranks_text(ranks: list[int]) -> str:
    shown = ", ".join(str(rank) for rank in ranks[:_MISSING_SHOWN])
    more = len(ranks) - _MISSING_SHOWN
    return f"{shown} and {more} more" if more > 0 else shown


class Rendezvous:
    """This rank's handle on meshconf's keys in the rendezvous store."""

    def __init__(
        self, store: Store, launch: Launch, timeout_s: float, *, hosts_store: bool
    ) -> None:
        self.root_store = store
        self.launch = launch
        self.timeout_s = timeout_s
        self.hosts_store = hosts_store
        rank = launch.rank
        # The n-th context of every rank shares one key space, even in a job that makes several.
        generation = store.add(f"meshconf/contexts/{rank}", 1)
        self.store: Store = PrefixStore(f"meshconf/{generation}", store)
        #: Set-up failed, on this rank or another (published, read, or timed out).
        self.failed = False
        shortest, longest = _LONGEST_PAUSE_RANGE_S
        self._longest_pause_s = min(longest, max(shortest, launch.world_size * _PAUSE_PER_RANK_S))

    @classmethod
    def connect(cls, launch: Launch, environ: Mapping[str, str], timeout_s: float) -> Rendezvous:
        """Join the store at MASTER_ADDR:MASTER_PORT: rank 0 hosts it unless the launcher's
        agent already does (torchrun sets TORCHELASTIC_USE_AGENT_STORE).

        Raises:
            LaunchError: MASTER_ADDR or MASTER_PORT is not set.
            SetupTimeoutError: the store is not reachable within ``timeout_s``.
        """
        address, port = environ.get("MASTER_ADDR"), environ.get("MASTER_PORT")
        if not address or not port or not port.isdigit():
            raise LaunchError(
                f"{launch.source} gave rank {launch.rank} of {launch.world_size}, but MASTER_ADDR "
                "and MASTER_PORT are not set to a host and a port (torchrun sets them; under "
                "SLURM, export them)"
            )
        hosts = launch.rank == 0 and environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"
        # torch's client tries once more after its timeout, after a back-off of up to the
        # timeout again: half the bound each keeps the whole within it.
        connect_s = timeout_s if hosts else timeout_s / 2
        try:
            store = dist.TCPStore(  # type: ignore[attr-defined]
                address,
                int(port),
                launch.world_size,
                is_master=hosts,
                timeout=timedelta(seconds=connect_s),
                wait_for_workers=False,
            )
            store.set_timeout(timedelta(seconds=timeout_s))
        except (RuntimeError, dist.DistError) as error:
            first = str(error).splitlines()[0] if str(error) else type(error).__name__
            if hosts:
                raise RuntimeSetupError(
                    f"rank 0 could not host the rendezvous store at {address}:{port}: {first}"
                ) from None
            raise SetupTimeoutError(
                f"rank 0 did not start within {timeout_s:g} s: no rendezvous store answered at "
                f"{address}:{port} (runtime.setup_timeout_s; are MASTER_ADDR and MASTER_PORT "
                "those of rank 0?)"
            ) from None
        return cls(store, launch, timeout_s, hosts_store=hosts)

    # Waiting ---------------------------------------------------------------------------

    def check_failures(self) -> None:
        """Raise the first other rank's reason if one has failed.

        Raises:
            RankFailedError: with that rank's reason.
        """
        if self.store.check([_FAILED]):
            self._raise_failure()

    def _raise_failure(self) -> None:
        self.failed = True
        reason = self.store.get(_FAILED).decode()
        self.store.add("acknowledged", 1)
        self._keep_store_until_read()
        raise RankFailedError(reason)

    def _keep_store_until_read(self) -> None:
        # Every rank but the first to fail acknowledges the reason once it has read it.
        if not self.hosts_store:
            return
        readers = self.launch.world_size - 1
        deadline = time.monotonic() + self.timeout_s
        while self.store.add("acknowledged", 0) < readers and time.monotonic() < deadline:
            time.sleep(0.05)

    def wait_for(self, keys: list[str], what: str, *, failures_first: bool = True) -> None:
        """Wait until every key exists, or another rank fails, within the set-up bound.

        With ``failures_first=False`` keys that all exist win over a failure elsewhere. The
        store is asked with ``check``, which answers at once, at growing intervals: torch's
        ``wait`` logs two warning lines on every rank each time it times out, the very lines
        a user reading the logs of a slow or missing rank does not need.

        Raises:
            RankFailedError: another rank published its reason.
            SetupTimeoutError: the keys did not all appear in time; ``what`` says what waited.
        """
        deadline = time.monotonic() + self.timeout_s
        pause = _FIRST_PAUSE_S
        while True:
            if not failures_first and self.store.check(keys):
                return
            self.check_failures()
            if self.store.check(keys):
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.check_failures()
                self.failed = True
                raise SetupTimeoutError(
                    f"{what} within {self.timeout_s:g} s (runtime.setup_timeout_s)"
                )
            time.sleep(min(pause, remaining))
            pause = min(2 * pause, self._longest_pause_s)

    def phase(self, name: str, value: str = "") -> None:
        """Mark this rank through ``name`` and wait for every rank to be.

        Raises:
            RankFailedError: another rank failed.
            SetupTimeoutError: names the ranks that did not get there in time.
        """
        rank, world_size = self.launch.rank, self.launch.world_size
        self.store.set(f"{name}/{rank}", value)
        if self.store.add(f"{name}/count", 1) == world_size:
            self.store.set(f"{name}/done", "")
        try:
            self.wait_for([f"{name}/done"], f"{name}")
        except SetupTimeoutError:
            missing = [r for r in range(world_size) if not self.store.check([f"{name}/{r}"])]
            raise SetupTimeoutError(self._missing_text(name, missing)) from None
        if self.store.get(f"{name}/done") == b"failed":
            self._raise_failure()

    def _missing_text(self, phase: str, missing: list[int]) -> str:
        rule = f"within {self.timeout_s:g} s (runtime.setup_timeout_s)"
        ranks = f"rank{'s' if len(missing) > 1 else ''} {_ranks_text(missing)}"
        if phase == "joined":
            return f"{ranks} did not join {rule}: did every rank start?"
        if phase == "checked":
            return f"{ranks} did not finish checking the config {rule}"
        return f"{ranks} did not finish creating their process groups {rule}"

    def closed(self) -> None:
        """After the closing barrier: wait, within the bound, until every rank has left it.

        A rank that finished the barrier has everything it needs, but another may still be
        reading the barrier's last messages from it; closing the connection under it makes
        gloo abort that rank ("Connection closed by peer"). The store is not a connection of
        any process group. A rank that never comes is not waited for past the bound.
        """
        with contextlib.suppress(SetupTimeoutError, RankFailedError):
            self.phase("closed")

    def value_of(self, key: str) -> str:
        return str(self.store.get(key).decode())

    # Failing ---------------------------------------------------------------------------

    def fail(self, reason: str) -> None:
        """Publish this rank's reason for every other rank to quote, wake them, and, if this
        rank hosts the store, keep it up until they have read it (within the bound)."""
        self.failed = True
        try:
            first = self.store.compare_set(_FAILED, "", reason).decode() == reason
            for name in PHASES:
                self.store.set(f"{name}/done", "failed")
            if not first:
                self.store.add("acknowledged", 1)  # another rank failed first: counted as read
            self._keep_store_until_read()
        except (RuntimeError, dist.DistError):
            pass  # the store is gone; this rank's own error still says what went wrong


def join(launch: Launch, environ: Mapping[str, str], timeout_s: float) -> Rendezvous | None:
    """This rank's handle on the rendezvous store, when it is one of several ranks.

    Raises:
        LaunchError: MASTER_ADDR or MASTER_PORT is missing.
        SetupTimeoutError: the store did not answer within ``timeout_s``.
    """
    if dist.is_initialized():
        # The script's own default group: its store serves, and it says who this rank is.
        if dist.get_world_size() == 1:
            return None
        if launch.source == "none":
            rank, size = dist.get_rank(), dist.get_world_size()
            launch = Launch(rank, size, rank, size, "none")
        store = dist.distributed_c10d._get_default_store()
        return Rendezvous(store, launch, timeout_s, hosts_store=False)
    if launch.world_size == 1 or launch.source not in ("torchrun", "slurm"):
        return None
    return Rendezvous.connect(launch, environ, timeout_s)


def publish_failure(rendezvous: Rendezvous, rank: int, error: BaseException) -> None:
    """Tell the other ranks why this one failed; a torch error caused by another rank's
    failure (its peers gone) becomes that rank's reason instead.

    Raises:
        RankFailedError: another rank failed first and ``error`` is not meshconf's own.
    """
    if not isinstance(error, MeshconfError):
        try:
            rendezvous.check_failures()
        except RankFailedError as first:
            raise first from None
    if isinstance(error, RankReasonError):
        rendezvous.fail(str(error))
    else:
        rendezvous.fail(f"rank {rank} could not set up: {error}")
