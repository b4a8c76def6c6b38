"""Set-up across ranks through the rendezvous store: arrivals, the config check, failures.

Every rank of a launched world reaches the same key-value store (torchrun's agent store, or
the one rank 0 hosts at MASTER_ADDR:MASTER_PORT) before any process group exists. meshconf
keeps its own keys there, under ``meshconf/<n>/`` for the n-th context of the job:

- ``<phase>/<rank>``: the rank got through the phase (``joined``, ``checked``, ``built``);
  the last rank to arrive sets ``<phase>/done``.
- ``failed``: the first failure, ``<kind>`` and a reason in words on the next line (a rank's
  own failure, or a timeout naming the ranks that did not come); the failing rank also sets
  every ``<phase>/done`` to wake the others at once, and each of them raises it.
- ``acknowledged`` and ``gone``: counts that tell the rank hosting the store how many ranks
  have yet to read a failure, and ``bound_ms``, the longest set-up bound of any rank, for a
  host that could not read its own config.

Every wait is bounded by ``runtime.setup_timeout_s``. A rank that hosts the store waits,
after a failure, until every rank not known to be gone has read it, or until the bound
passes, since the store ends with its process.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Mapping

import torch.distributed as dist
from torch.distributed.distributed_c10d import PrefixStore, Store

from meshconf.core.errors import MeshconfError
from meshconf.runtime.launch import Launch, stated_rank
from meshconf.runtime.store import (
    Address,
    GuardedStore,
    RuntimeSetupError,
    SetupTimeoutError,
    StoreGoneError,
    connect,
    store_address,
)

PHASES = ("joined", "checked", "built")
_FAILED = "failed"
_FAILURE, _TIMEOUT = "failure", "timeout"
_MISSING_SHOWN = 8  # ranks named in a message; the rest are counted
#: What ranks that did not get through a phase in time did not do.
_NOT_THROUGH = {
    "joined": "{ranks} did not join {rule}: did every rank start?",
    "checked": "{ranks} did not finish checking the config {rule}",
    "built": "{ranks} did not finish creating their process groups {rule}",
}
# A waiting rank asks the store again after 1 ms, then after twice as long each time, up to a
# pause that grows with the world (50 ms at least, 1 s at most): W ranks pausing W * 50 us
# send one store at most 40,000 requests a second (two per pause: a failure, then the keys),
# and no rank sees the last arrival more than a second late.
_FIRST_PAUSE_S = 0.001
_PAUSE_PER_RANK_S = 50e-6
_LONGEST_PAUSE_RANGE_S = (0.05, 1.0)


class RankFailedError(RuntimeSetupError):
    """Another rank failed during set-up; the message is its reason."""


class RankReasonError(RuntimeSetupError):
    """A set-up failure whose message already names this rank: published as it is."""


def ranks_named(ranks: list[int]) -> str:
    """``rank 3``, ``ranks 3, 5``, or the first few and how many more."""
    shown = ", ".join(str(rank) for rank in ranks[:_MISSING_SHOWN])
    more = len(ranks) - _MISSING_SHOWN
    return f"rank{'s' if len(ranks) > 1 else ''} {shown}" + (
        f" and {more} more" if more > 0 else ""
    )


class Rendezvous:
    """This rank's handle on meshconf's keys in the rendezvous store."""

    def __init__(
        self,
        store: Store,
        launch: Launch,
        timeout_s: float,
        *,
        hosts_store: bool,
        address: Address | None = None,
        bound_known: bool = True,
    ) -> None:
        self.root_store = store
        self.launch = launch
        self.timeout_s = timeout_s
        self.hosts_store = hosts_store
        gone = (
            "the default process group's store is gone"
            if address is None
            else f"the store at {address} is gone: {address.host_is} stopped"
        )
        # The n-th context of every rank shares one key space, even in a job that makes several.
        generation = GuardedStore(store, gone).add(f"meshconf/contexts/{launch.rank}", 1)
        self.store = GuardedStore(PrefixStore(f"meshconf/{generation}", store), gone)
        #: Set-up failed, on this rank or another (published, read, or timed out).
        self.failed = False
        shortest, longest = _LONGEST_PAUSE_RANGE_S
        self._longest_pause_s = min(longest, max(shortest, launch.world_size * _PAUSE_PER_RANK_S))
        if bound_known:
            self._publish_bound()

    def _publish_bound(self) -> None:
        """Raise ``bound_ms`` to this rank's bound if it is longer."""
        mine, seen = int(self.timeout_s * 1000), ""
        for _ in range(16):  # each retry means another rank raised it meanwhile
            now = self.store.compare_set("bound_ms", seen, str(mine)).decode()
            if now == str(mine) or int(now) >= mine:
                return
            seen = now

    def check_failures(self) -> None:
        """Raise the first failure if there is one.

        Raises:
            RankFailedError: with the failing rank's reason.
            SetupTimeoutError: ranks did not come in time; the message names them.
        """
        if self.store.check([_FAILED]):
            self._raise_failure()

    def _raise_failure(self) -> None:
        self.failed = True
        published = self.store.get(_FAILED).decode()
        self.store.add("acknowledged", 1)
        self._keep_store_until_read()
        raise failure_error(published)

    def _keep_store_until_read(self) -> None:
        # Every rank not known to be gone acknowledges a failure once it has read it (the
        # failing ranks as they publish), within the longest bound of any rank.
        if not self.hosts_store:
            return
        start = time.monotonic()
        while True:
            readers = self.launch.world_size - self.store.add("gone", 0)
            if self.store.add("acknowledged", 0) >= readers:
                return
            # Ranks that arrive publish their bounds meanwhile.
            published_ms = self.store.add("bound_ms", 0)
            bound_s = published_ms / 1000 if published_ms else self.timeout_s
            if time.monotonic() - start >= bound_s:
                return
            time.sleep(0.05)

    def wait_for(self, keys: list[str], what: str, *, failures_first: bool = True) -> None:
        """Wait until every key exists, or another rank fails, within the set-up bound.

        With ``failures_first=False`` keys that all exist win over a failure elsewhere. The
        store is asked with ``check``, which answers at once, at growing intervals: torch's
        ``wait`` logs two warning lines on every rank each time it times out, the very lines
        a user reading the logs of a slow or missing rank does not need.

        Raises:
            RankFailedError, SetupTimeoutError: a failure was published (check_failures).
            SetupTimeoutError: the keys did not all appear in time; ``what`` says what waited.
            StoreGoneError: the store went away.
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
                raise SetupTimeoutError(
                    f"{what} within {self.timeout_s:g} s (runtime.setup_timeout_s)"
                )
            time.sleep(min(pause, remaining))
            pause = min(2 * pause, self._longest_pause_s)

    def phase(self, name: str, value: str = "") -> None:
        """Mark this rank through ``name`` and wait for every rank to be.

        Raises:
            RankFailedError: another rank failed.
            SetupTimeoutError: names the ranks that did not get there in time; every rank
                waiting raises it too.
            StoreGoneError: the store went away.
        """
        rank, world_size = self.launch.rank, self.launch.world_size
        self.store.set(f"{name}/{rank}", value)
        if self.store.add(f"{name}/count", 1) == world_size:
            self.store.set(f"{name}/done", "")
        try:
            self.wait_for([f"{name}/done"], f"{name}")
        except SetupTimeoutError:
            missing = [r for r in range(world_size) if not self.store.check([f"{name}/{r}"])]
            message = _NOT_THROUGH.get(name, _NOT_THROUGH["built"]).format(
                ranks=ranks_named(missing),
                rule=f"within {self.timeout_s:g} s (runtime.setup_timeout_s)",
            )
            raise failure_error(self.publish(message, kind=_TIMEOUT, gone=missing)) from None
        if self.store.get(f"{name}/done") == b"failed":
            self._raise_failure()

    def closed(self) -> None:
        """After the closing barrier: wait, within the bound, until every rank has left it.

        A rank that finished the barrier has everything it needs, but another may still be
        reading the barrier's last messages from it; closing the connection under it makes
        gloo abort that rank ("Connection closed by peer"). The store is not a connection of
        any process group. A rank that never comes is not waited for past the bound.
        """
        with contextlib.suppress(RuntimeSetupError):
            self.phase("closed")

    def publish(self, reason: str, *, kind: str = _FAILURE, gone: Iterable[int] = ()) -> str:
        """Publish a failure for every other rank to raise, wake them, and, if this rank
        hosts the store, keep it up until they have read it; ``gone`` are ranks known not to
        read it (they did not come). Returns the first failure published, this one or another
        rank's, as stored (``<kind>``, then the reason on the next line)."""
        self.failed = True
        text = f"{kind}\n{reason}"
        try:
            first = str(self.store.compare_set(_FAILED, "", text).decode())
            for rank in gone:
                if self.store.compare_set(f"gone/{rank}", "", "1").decode() == "1":
                    self.store.add("gone", 1)
            for name in PHASES:
                self.store.set(f"{name}/done", "failed")
            self.store.add("acknowledged", 1)
            self._keep_store_until_read()
        except StoreGoneError:
            first = text  # this rank's own reason is all there is to say
        return first


def failure_error(published: str) -> RuntimeSetupError:
    """The error a failure as stored is raised as."""
    kind, _, reason = published.partition("\n")
    return SetupTimeoutError(reason) if kind == _TIMEOUT else RankFailedError(reason)


def join(
    launch: Launch, environ: Mapping[str, str], timeout_s: float, *, bound_known: bool = True
) -> Rendezvous | None:
    """This rank's handle on the rendezvous store, when it is one of several ranks: the
    default group's, or the one at MASTER_ADDR:MASTER_PORT, which rank 0 hosts unless the
    launcher's agent already does (torchrun sets TORCHELASTIC_USE_AGENT_STORE).
    ``bound_known`` False: ``timeout_s`` is a default, since this rank could not read its
    config.

    Raises:
        MeshconfError: MASTER_ADDR or MASTER_PORT is missing or not a host and a port.
        RuntimeSetupError: rank 0 cannot host the store.
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
        return Rendezvous(store, launch, timeout_s, hosts_store=False, bound_known=bound_known)
    if launch.world_size == 1 or launch.source not in ("torchrun", "slurm"):
        return None
    address = store_address(environ, f"rank {launch.rank}")
    hosts = launch.rank == 0 and address.host_is == "rank 0"
    store = connect(address, hosts=hosts, world_size=launch.world_size, timeout_s=timeout_s)
    return Rendezvous(
        store, launch, timeout_s, hosts_store=hosts, address=address, bound_known=bound_known
    )


#: How long a rank whose launch environment is wrong tries to reach the store to say so.
_REPORT_CONNECT_S = 10.0


def report_launch_error(environ: Mapping[str, str], error: MeshconfError) -> None:
    """Tell the other ranks what is wrong with this rank's launch environment, when it can
    reach the store as a client (torchrun's agent store, or rank 0's when this is another
    rank): they then fail with this message instead of waiting for this rank. A rank that
    cannot say which rank it is writes where the first context of every rank reads."""
    stated = stated_rank(environ)
    rank = -1 if stated is None else stated
    try:
        address = store_address(environ, "this rank")
    except MeshconfError:
        return
    if rank <= 0 and address.host_is == "rank 0":
        return  # this may be rank 0, which would host the store: the others name it
    launch = Launch(rank, 1, 0, None, "torchrun")
    with contextlib.suppress(RuntimeSetupError):
        store = connect(address, hosts=False, world_size=None, timeout_s=_REPORT_CONNECT_S)
        Rendezvous(
            store, launch, _REPORT_CONNECT_S, hosts_store=False, address=address, bound_known=False
        ).publish(str(error))


def publish_failure(rendezvous: Rendezvous, rank: int, error: BaseException) -> None:
    """Tell the other ranks why this one failed; a torch error caused by another rank's
    failure (its peers gone) becomes that rank's reason instead.

    Raises:
        RankFailedError, SetupTimeoutError: another rank failed first and ``error`` is not
            meshconf's own.
    """
    if not isinstance(error, MeshconfError):
        with contextlib.suppress(StoreGoneError):
            rendezvous.check_failures()
    if isinstance(error, RankReasonError):
        rendezvous.publish(str(error))
    else:
        rendezvous.publish(f"rank {rank} could not set up: {error}")
