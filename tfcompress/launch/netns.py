"""Bandwidth-limited local clusters: one Linux network namespace per worker.

``tfcompress launch -n N --bandwidth 100mbit [--latency 20] -- python train.py`` runs
each worker in a network namespace of its own, wired to a software switch::

    tfc-<pid>-<k>-w0            tfc-<pid>-<k>-sw (the switch)        tfc-<pid>-<k>-w1
    lo    127.0.0.1             bridge br0                           lo    127.0.0.1
    eth0  10.213.X.1 === veth === w0 (port)     (port) w1 === veth === eth0  10.213.X.2
    egress: [netem] tbf         egress: tbf     egress: tbf          egress: [netem] tbf

* Every link is shaped in both directions with a token bucket (``tbf``): the worker
  side's egress limits what the worker sends (upload), the switch side's egress what it
  receives (download). So each worker has a full-duplex link of ``rate``, as if each had
  a NIC of that speed on a dedicated switch.
* ``latency_ms`` adds a ``netem`` delay on the worker side only, as the parent of that
  ``tbf``: every packet between two workers crosses exactly one worker-side egress, so a
  one-way trip takes ``latency_ms`` longer and a round trip ``2 * latency_ms``.
* Workers get addresses ``.1``, ``.2``, ... in a private ``/24`` of ``10.213.0.0/16``
  that overlaps no address or route of the host. A worker's namespace holds only ``lo``
  and its link to the switch, with no default route: its traffic goes to its own
  loopback or to the other workers, never to the host or beyond.
* Namespace names carry the prefix ``tfc-``, the launcher's pid and a per-process
  counter. On a start, namespaces of launchers that no longer run (after a ``kill -9`` or
  a crash) are deleted, with any process still inside them; nothing else is touched.
  Interfaces are created inside the namespaces and never exist in the host's, so
  deleting the namespaces deletes them.

Needs root, ``ip`` and ``tc`` (Debian package ``iproute2``), and a kernel with
``sch_tbf`` (and ``sch_netem`` for a latency).

This module must not import TensorFlow: ``tfcompress launch`` should start at once.
"""

from __future__ import annotations

import atexit
import contextlib
import ipaddress
import itertools
import json
import math
import os
import re
import shutil
import signal
import subprocess
import threading
from collections.abc import Iterator, Sequence
from typing import Self

from tfcompress.planner.link import format_rate, parse_rate

__all__ = [
    "MAX_WORKERS",
    "NAMESPACE_PREFIX",
    "BandwidthLimitedCluster",
    "NetnsError",
    "check_prerequisites",
    "format_rate",
    "parse_rate",
    "qdisc_commands",
    "remove_stale_namespaces",
]

#: Every namespace this module creates is named ``tfc-<pid>-<k>-<role>``.
NAMESPACE_PREFIX = "tfc-"

#: Worker addresses are hosts of one ``/24``.
MAX_WORKERS = 254

_NAME_PATTERN = re.compile(r"^tfc-(?P<pid>\d+)-(?P<serial>\d+)-(?P<role>sw|w\d+)$")

# Private /24s are taken from this /16; the first one tried depends on the pid, so that
# concurrent launchers usually show different addresses in their logs. Namespaces keep
# them apart either way.
_SUBNET_POOL = ipaddress.IPv4Network("10.213.0.0/16")

_BRIDGE = "br0"
_WORKER_DEVICE = "eth0"

# The Debian package that provides ``ip`` and ``tc``.
_IPROUTE2 = "iproute2"

# root's PATH normally has these, but a sudo'd or minimal PATH may not.
_SBIN_DIRECTORIES = ("/usr/local/sbin", "/usr/sbin", "/sbin")

_LOOPBACK_HINT = "drop --bandwidth for unlimited loopback mode"

# One ``ip`` or ``tc`` call never takes long; a hang means something is badly wrong.
_COMMAND_TIMEOUT = 30.0

# Token bucket sizing. The bucket holds 1 ms of traffic, at least ten full-size frames
# (tbf's watchdog is a high-resolution timer, so it needs no more); the queue behind it
# holds 100 ms of traffic, enough for TCP to keep the link busy without drops. A bucket of
# 10 ms (125 KB at 100 Mbit/s, on each side of the switch) let a message of that size
# through at memory speed: a 180 KB all-gather took 7 ms at "100 Mbit/s" instead of 15.
_BURST_SECONDS = 0.001
_MIN_BURST_BYTES = 10 * 1514
_QUEUE_SECONDS = 0.1
_MAX_QUEUE_BYTES = 2**30

# netem holds every packet for the delay: its queue (in packets) must cover what the rate
# sends meanwhile. Packets of 1000 bytes on average, and room to spare.
_NETEM_MIN_LIMIT = 1000
_NETEM_BYTES_PER_PACKET = 1000


class NetnsError(RuntimeError):
    """The bandwidth-limited network cannot be set up here.

    The message says what is missing (root, ``ip``/``tc``, a kernel qdisc) or quotes the
    failing command's error, and offers the unlimited loopback mode.
    """


def qdisc_commands(device: str, rate: int, latency_ms: float | None = None) -> list[list[str]]:
    """The ``tc`` arguments that shape the egress of ``device``.

    Args:
        device: The interface.
        rate: Bits per second.
        latency_ms: Delay added to every packet first, in milliseconds; ``None`` or 0
            for none.

    Returns:
        One argument list per ``tc`` call (without ``tc`` itself), in order.

    >>> for args in qdisc_commands("eth0", 20_000_000, latency_ms=50):
    ...     print(" ".join(args))
    qdisc add dev eth0 root handle 1: netem delay 50ms limit 1000
    qdisc add dev eth0 parent 1:1 handle 10: tbf rate 20000000bit burst 15140 limit 250000
    """
    bytes_per_second = rate / 8
    burst = min(max(math.ceil(bytes_per_second * _BURST_SECONDS), _MIN_BURST_BYTES), 2**30)
    limit = min(max(math.ceil(bytes_per_second * _QUEUE_SECONDS), 2 * burst), _MAX_QUEUE_BYTES)
    tbf = ["tbf", "rate", f"{rate}bit", "burst", str(burst), "limit", str(limit)]
    if not latency_ms:
        return [["qdisc", "add", "dev", device, "root", "handle", "10:", *tbf]]
    in_flight = bytes_per_second * latency_ms / 1000 / _NETEM_BYTES_PER_PACKET
    netem_limit = max(_NETEM_MIN_LIMIT, math.ceil(2 * in_flight))
    netem = ["netem", "delay", f"{latency_ms:g}ms", "limit", str(netem_limit)]
    return [
        ["qdisc", "add", "dev", device, "root", "handle", "1:", *netem],
        ["qdisc", "add", "dev", device, "parent", "1:1", "handle", "10:", *tbf],
    ]


def check_prerequisites() -> tuple[str, str]:
    """Checks that this process may create network namespaces and shape links.

    Returns:
        The paths of ``ip`` and ``tc``.

    Raises:
        NetnsError: If this process is not root, or ``ip`` or ``tc`` is missing; the
            message says which, and how to do without.
    """
    if os.geteuid() != 0:
        raise NetnsError(
            f"needs root to create network namespaces (run as root, or {_LOOPBACK_HINT})"
        )
    tools = {name: _find_tool(name) for name in ("ip", "tc")}
    missing = [name for name, path in tools.items() if path is None]
    if missing:
        raise NetnsError(
            f"needs {' and '.join(f'`{name}`' for name in missing)} to create network "
            f"namespaces and shape their links: install the Debian package {_IPROUTE2} "
            f"(apt-get install {_IPROUTE2}), or {_LOOPBACK_HINT}"
        )
    return tools["ip"], tools["tc"]


def _find_tool(name: str) -> str | None:
    search_path = os.pathsep.join([os.environ.get("PATH", os.defpath), *_SBIN_DIRECTORIES])
    return shutil.which(name, path=search_path)


def remove_stale_namespaces(ip: str = "ip") -> list[str]:
    """Deletes the namespaces left behind by launchers that no longer run.

    A namespace is stale when its name has this module's form and the pid in it is not
    a live process, or is this process but no open cluster of this process owns it (a
    previous holder of the pid left it). Processes still inside a stale namespace, the
    orphaned workers of a launcher killed with SIGKILL, are killed first. Should a dead
    launcher's pid belong to another process by now, its namespaces wait until that
    process is gone too.

    Args:
        ip: The ``ip`` program.

    Returns:
        The names deleted.
    """
    listing = _run([ip, "-json", "netns", "list"], "list network namespaces", check=False)
    try:
        names = [entry["name"] for entry in json.loads(listing.stdout or "[]")]
    except (ValueError, TypeError, KeyError):
        names = []
    with _registry_lock:
        owned = set().union(*(cluster.namespace_names for cluster in _open_clusters))
    removed = []
    for name in names:
        match = _NAME_PATTERN.match(name)
        if match is None or name in owned:
            continue
        pid = int(match["pid"])
        if pid != os.getpid() and _process_alive(pid):
            continue
        if _delete_namespace(ip, name):
            removed.append(name)
    return removed


class BandwidthLimitedCluster:
    """Network namespaces for ``num_workers`` workers behind a rate-limited switch.

    Use as a context manager; the namespaces exist between ``__enter__`` and
    ``__exit__``. Teardown is idempotent and also runs at interpreter exit, so an
    exception or a ``SystemExit`` (which :func:`~tfcompress.launch.launch` makes of
    SIGTERM and SIGHUP) leaves nothing behind; what a SIGKILL leaves, the next start
    removes (see :func:`remove_stale_namespaces`).

    Attributes:
        num_workers: How many workers.
        rate: Each worker's link speed in both directions, bits per second.
        latency_ms: One-way delay added between any two workers, in milliseconds, or
            ``None``.
        subnet: The workers' ``/24``; set by :meth:`open`.
        addresses: Worker ``i``'s IPv4 address, as a string; set by :meth:`open`.
        worker_namespaces: Worker ``i``'s namespace name.
        switch_namespace: The name of the namespace holding the bridge.
        removed_stale: Namespaces of dead launchers that :meth:`open` deleted.

    Example::

        with BandwidthLimitedCluster(2, rate="20mbit") as cluster:
            subprocess.run(cluster.command(0, ["python", "server.py"]))
    """

    _serials = itertools.count()

    def __init__(
        self, num_workers: int, rate: str = "100mbit", latency_ms: float | None = None
    ) -> None:
        """Validates the arguments; creates nothing yet.

        Args:
            num_workers: How many workers, 1 to :data:`MAX_WORKERS`.
            rate: Each link's speed in tc's syntax (see :func:`parse_rate`).
            latency_ms: One-way delay between workers, in milliseconds (needs the
                kernel's ``sch_netem``); ``None`` or 0 for none.

        Raises:
            ValueError: On a bad ``num_workers``, ``rate`` or ``latency_ms``.
        """
        if not 1 <= num_workers <= MAX_WORKERS:
            raise ValueError(
                f"num_workers must be in [1, {MAX_WORKERS}] with --bandwidth, got {num_workers}"
            )
        if latency_ms is not None and not (math.isfinite(latency_ms) and latency_ms >= 0):
            raise ValueError(f"--latency must be a number of milliseconds >= 0, got {latency_ms}")
        self.num_workers = num_workers
        self.rate = parse_rate(rate)
        self.latency_ms = latency_ms or None
        with _registry_lock:
            serial = next(self._serials)
        stem = f"{NAMESPACE_PREFIX}{os.getpid()}-{serial}"
        self.switch_namespace = f"{stem}-sw"
        self.worker_namespaces = [f"{stem}-w{index}" for index in range(num_workers)]
        self.subnet: ipaddress.IPv4Network | None = None
        self.addresses: list[str] = []
        self.removed_stale: list[str] = []
        self._ip = "ip"
        self._tc = "tc"
        self._created: list[str] = []
        self._lock = threading.Lock()

    @property
    def namespace_names(self) -> set[str]:
        """Every namespace this cluster creates, the switch's included."""
        return {self.switch_namespace, *self.worker_namespaces}

    def __enter__(self) -> Self:
        self.open()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def open(self) -> None:
        """Creates the namespaces, the switch and the shaped links.

        Raises:
            NetnsError: If a prerequisite is missing or a command fails (with its
                error); whatever was created is deleted first.
            RuntimeError: If the cluster is open already.
        """
        if self._created:
            raise RuntimeError(f"{self.switch_namespace} is open already")
        self._ip, self._tc = check_prerequisites()
        with _registry_lock:
            _open_clusters.add(self)
            _register_atexit()
        try:
            self.removed_stale = remove_stale_namespaces(self._ip)
            self.subnet = _choose_subnet(self._ip, seed=os.getpid())
            hosts = self.subnet.hosts()
            self.addresses = [str(next(hosts)) for _ in range(self.num_workers)]
            self._create_switch()
            for index in range(self.num_workers):
                self._create_worker(index)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Deletes every namespace this cluster created, and kills what runs in them.

        Safe to call more than once, from ``__exit__`` and from the exit handler alike.
        Ctrl-C and SIGTERM are held back until it is done.
        """
        with _termination_signals_deferred(), self._lock:
            while self._created:
                _delete_namespace(self._ip, self._created.pop())
            with _registry_lock:
                _open_clusters.discard(self)

    def describe(self) -> str:
        """One line saying what :meth:`open` set up: workers, namespaces, links, rate, delay.

        Returns:
            e.g. ``2 workers in network namespaces tfc-7-0-w0..w1 (10.213.7.1..10.213.7.2),
            each on a veth link to a bridge in tfc-7-0-sw, shaped to 100 Mbit/s each way
            (tbf), no added delay``; before :meth:`open`, without the addresses.
        """
        first, last = self.worker_namespaces[0], self.worker_namespaces[-1]
        names = first if first == last else f"{first}..{last.rsplit('-', 1)[1]}"
        where = ""
        if self.addresses:
            first_address, last_address = self.addresses[0], self.addresses[-1]
            span = (
                first_address
                if first_address == last_address
                else f"{first_address}..{last_address}"
            )
            where = f" ({span})"
        delay = (
            f"{self.latency_ms:g} ms one-way delay (netem)" if self.latency_ms else "no added delay"
        )
        workers = (
            "1 worker in network namespace"
            if self.num_workers == 1
            else f"{self.num_workers} workers in network namespaces"
        )
        return (
            f"{workers} {names}{where}, each on a veth link to a "
            f"bridge in {self.switch_namespace}, shaped to {format_rate(self.rate)} each way "
            f"(tbf), {delay}"
        )

    def command(self, index: int, command: Sequence[str]) -> list[str]:
        """The command line that runs ``command`` as worker ``index``.

        ``ip netns exec`` enters the namespace and then execs ``command`` with the same
        pid, environment and process group.

        Args:
            index: The worker.
            command: The program and its arguments.

        Returns:
            ``ip netns exec <namespace> <command...>``.
        """
        return [self._ip, "netns", "exec", self.worker_namespaces[index], *command]

    def _create_switch(self) -> None:
        namespace = self.switch_namespace
        self._add_namespace(namespace)
        self._ip_in(namespace, "link", "add", _BRIDGE, "type", "bridge")
        self._ip_in(namespace, "link", "set", _BRIDGE, "addrgenmode", "none", "up")

    def _create_worker(self, index: int) -> None:
        namespace = self.worker_namespaces[index]
        port = f"w{index}"
        self._add_namespace(namespace)
        self._ip_in(namespace, "link", "set", "lo", "up")
        veth = ["type", "veth", "peer", "name", _WORKER_DEVICE, "netns", namespace]
        self._ip_in(self.switch_namespace, "link", "add", port, *veth)
        # No IPv6 link-local addresses: their neighbour discovery would share the links.
        self._ip_in(self.switch_namespace, "link", "set", port, "addrgenmode", "none")
        self._ip_in(namespace, "link", "set", _WORKER_DEVICE, "addrgenmode", "none")
        address = f"{self.addresses[index]}/{self.subnet.prefixlen}"
        self._ip_in(namespace, "address", "add", address, "dev", _WORKER_DEVICE)
        for args in qdisc_commands(_WORKER_DEVICE, self.rate, self.latency_ms):
            self._tc_in(namespace, args)
        for args in qdisc_commands(port, self.rate):
            self._tc_in(self.switch_namespace, args)
        self._ip_in(self.switch_namespace, "link", "set", port, "master", _BRIDGE, "up")
        self._ip_in(namespace, "link", "set", _WORKER_DEVICE, "up")

    def _add_namespace(self, name: str) -> None:
        # Recorded first: if ``ip`` made the namespace and then failed, close() still
        # tries to delete it.
        self._created.append(name)
        _run([self._ip, "netns", "add", name], f"create network namespace {name}")

    def _ip_in(self, namespace: str, *args: str) -> None:
        _run([self._ip, "-n", namespace, *args], f"ip {' '.join(args)}")

    def _tc_in(self, namespace: str, args: Sequence[str]) -> None:
        kind = "netem" if "netem" in args else "tbf"
        hint = _LOOPBACK_HINT
        if kind == "netem":
            hint = f"drop --latency to run without a delay, or {hint}"
        _run(
            [self._tc, "-n", namespace, *args],
            f"tc cannot add a {kind} qdisc (does the kernel lack sch_{kind}?): "
            f"`tc {' '.join(args)}` says",
            hint=hint,
        )


# Clusters between open() and close(), for the exit handler and the stale check.
_open_clusters: set[BandwidthLimitedCluster] = set()
_registry_lock = threading.RLock()
_atexit_registered = False


def _register_atexit() -> None:
    global _atexit_registered
    if not _atexit_registered:
        atexit.register(_close_open_clusters)
        _atexit_registered = True


def _close_open_clusters() -> None:
    with _registry_lock:
        clusters = list(_open_clusters)
    for cluster in clusters:
        cluster.close()


def _run(
    args: Sequence[str], what: str, *, check: bool = True, hint: str = _LOOPBACK_HINT
) -> subprocess.CompletedProcess:
    try:
        completed = subprocess.run(
            list(args),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=_COMMAND_TIMEOUT,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        if not check:
            return subprocess.CompletedProcess(args, -1, "", str(error))
        raise NetnsError(f"{what}: {error}; {hint}") from error
    if check and completed.returncode != 0:
        detail = completed.stderr.strip().rstrip(".") or f"exit status {completed.returncode}"
        raise NetnsError(f"{what}: {detail}; {hint}")
    return completed


def _delete_namespace(ip: str, name: str) -> bool:
    """Kills every process in namespace ``name``, then deletes it; never raises."""
    pids = _run([ip, "netns", "pids", name], f"list processes in {name}", check=False)
    for token in pids.stdout.split():
        if token.isdigit() and int(token) != os.getpid():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(token), signal.SIGKILL)
    deleted = _run([ip, "netns", "delete", name], f"delete {name}", check=False)
    return deleted.returncode == 0


def _process_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat_file:
            state = stat_file.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    return state not in ("Z", "X")


def _choose_subnet(ip: str, seed: int) -> ipaddress.IPv4Network:
    """A ``/24`` of the pool that overlaps no address or route of this namespace."""
    taken = _host_networks(ip)
    candidates = list(_SUBNET_POOL.subnets(new_prefix=24))
    start = seed % len(candidates)
    for subnet in candidates[start:] + candidates[:start]:
        if not any(subnet.overlaps(network) for network in taken):
            return subnet
    raise NetnsError(
        f"every /24 of {_SUBNET_POOL} overlaps an address or route of this machine; "
        f"{_LOOPBACK_HINT}"
    )


def _host_networks(ip: str) -> list[ipaddress.IPv4Network]:
    """The IPv4 networks of this namespace's addresses and (non-default) routes."""
    networks = []
    addresses = _run([ip, "-json", "-4", "address", "show"], "list addresses", check=False)
    routes = _run([ip, "-json", "-4", "route", "show", "table", "all"], "list routes", check=False)
    with contextlib.suppress(ValueError, TypeError):
        for link in json.loads(addresses.stdout or "[]"):
            for info in link.get("addr_info", []):
                networks.append(
                    ipaddress.IPv4Network(f"{info['local']}/{info['prefixlen']}", strict=False)
                )
    with contextlib.suppress(ValueError, TypeError):
        for route in json.loads(routes.stdout or "[]"):
            destination = route.get("dst", "default")
            # A default route covers everything, yet sends nothing of ours anywhere: the
            # subnet only exists inside the namespaces, which have no route out.
            if destination == "default":
                continue
            with contextlib.suppress(ValueError):
                networks.append(ipaddress.IPv4Network(destination, strict=False))
    return networks


@contextlib.contextmanager
def _termination_signals_deferred() -> Iterator[None]:
    """Blocks SIGINT, SIGTERM and SIGHUP; any that arrive are delivered afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.pthread_sigmask(
        signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
    )
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
