"""Lab 12 (training across a slow link): a second "host" joined to this one by a shaped link,
and the checks of the bytes and seconds that DDP, LocalSGD and DiLoCo measured on it.

:class:`SlowLink` (notebook side) is a network namespace and a ``tc``-shaped veth pair whose
counters are the bytes on the wire; :func:`on_host` (rank side) moves a rank's sockets into
the namespace. A watchdog process removes both when the link is closed or the kernel that
made it dies. Never imports torch."""

from __future__ import annotations

import contextlib
import ctypes
import os
import pathlib
import subprocess
import threading

from workbench.labs.checking import CheckFailed, checker
from workbench.labs.hints import mismatch, number

__all__ = ["SlowLink", "check_ddp_link_bytes", "check_sync_ratio", "on_host"]

CLONE_NEWNET = 0x40000000  # sched.h: setns(2) into a network namespace

# the watchdog: waits for its stdin to close (the link closed, or the kernel gone: the pipe's
# only writer), then removes what the link made, whatever state it got to
_WATCHDOG = """
trap '' INT
read _ || true
ip link del "$1" 2>/dev/null
ip netns del "$2" 2>/dev/null
exit 0
"""


class LinkError(RuntimeError):
    """The link could not be made (not root, no ``ip``/``tc``, a qdisc the kernel lacks)."""


def _ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True)


def _run(*args: str) -> None:
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != 0:
        raise LinkError(f"`{' '.join(args)}` failed: {(r.stderr or r.stdout).strip()}")


class SlowLink:
    """Two hosts: this one (the ``here`` end, ``addr_here``) and network namespace ``netns``
    (the ``there`` end, ``addr_there``), joined by a veth pair shaped to ``mbit`` Mbit/s each
    way, plus ``delay_ms`` each way where the kernel has ``netem`` (else ``delay_ms`` is 0 and
    ``delay_error`` says what ``tc`` answered). Both ends are rate-limited by ``tc``'s
    ``tbf``; a watchdog process removes the namespace and the veth when the link is closed or
    the kernel that made it dies, whichever comes first."""

    def __init__(self, mbit: float = 16.0, delay_ms: float = 5.0):
        self.mbit, self.delay_ms, self.delay_error = mbit, delay_ms, None
        if os.geteuid() != 0:
            raise LinkError("a network namespace needs root (ip netns add); run the lab as root, as the suite does")
        if not (self.mbit > 0 and self.delay_ms >= 0):
            raise LinkError(f"mbit must be > 0 and delay_ms >= 0, got mbit={self.mbit!r}, delay_ms={self.delay_ms!r}")
        self.tag, subnet = _free_names()
        self.netns = f"wblab12-{self.tag}"
        self.veth_here, self.veth_there = f"wb12a{self.tag}", f"wb12b{self.tag}"
        self.addr_here, self.addr_there = f"10.232.{subnet}.1", f"10.232.{subnet}.2"
        self._watchdog = subprocess.Popen(
            ["sh", "-c", _WATCHDOG, "lab12-link", self.veth_here, self.netns],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # an interrupt of the kernel does not reach it
        )
        try:
            self._make()
        except BaseException:
            self.close()
            raise

    def _make(self) -> None:
        _run("ip", "netns", "add", self.netns)
        _run("ip", "link", "add", self.veth_here, "type", "veth", "peer", "name", self.veth_there)
        _run("ip", "link", "set", self.veth_there, "netns", self.netns)
        _run("ip", "addr", "add", f"{self.addr_here}/24", "dev", self.veth_here)
        _run("ip", "link", "set", self.veth_here, "up")
        ns = ("ip", "netns", "exec", self.netns)
        _run(*ns, "ip", "addr", "add", f"{self.addr_there}/24", "dev", self.veth_there)
        _run(*ns, "ip", "link", "set", self.veth_there, "up")
        _run(*ns, "ip", "link", "set", "lo", "up")
        delays = [self._shape((), self.veth_here), self._shape(ns, self.veth_there)]
        if not all(delays):
            self.delay_ms = 0.0

    def _shape(self, ns: tuple, dev: str) -> bool:
        """Rate-limit ``dev``'s sending side (both ends: both directions); True if delayed too."""
        # tbf: a token bucket at `mbit`, a queue deep enough that a burst waits instead of
        # being dropped (drops would make TCP's retransmissions, not the rate, the lesson)
        tbf = ["tbf", "rate", f"{self.mbit}mbit", "burst", "32kb", "latency", "1s"]
        if self.delay_ms > 0:
            netem = [
                *ns,
                "tc",
                "qdisc",
                "add",
                "dev",
                dev,
                "root",
                "handle",
                "1:",
                "netem",
                "delay",
                f"{self.delay_ms}ms",
            ]
            r = subprocess.run(netem, capture_output=True, text=True)
            if r.returncode == 0:
                _run(*ns, "tc", "qdisc", "add", "dev", dev, "parent", "1:1", "handle", "10:", *tbf)
                return True
            self.delay_error = f"tc qdisc add ... netem: {(r.stderr or r.stdout).strip()}"
        _run(*ns, "tc", "qdisc", "add", "dev", dev, "root", *tbf)
        return False

    def counters(self) -> dict:
        """Bytes and packets through this end of the link (sent + received: both directions)."""
        stats = pathlib.Path("/sys/class/net") / self.veth_here / "statistics"
        read = {n: int((stats / n).read_text()) for n in ("tx_bytes", "rx_bytes", "tx_packets", "rx_packets")}
        return {
            "bytes": read["tx_bytes"] + read["rx_bytes"],
            "packets": read["tx_packets"] + read["rx_packets"],
            **read,
        }

    def info(self) -> dict:
        """What the ranks need to reach each other over the link (pushed to them)."""
        keys = ("netns", "veth_here", "veth_there", "addr_here", "addr_there", "mbit", "delay_ms")
        return {k: getattr(self, k) for k in keys}

    def qdiscs(self) -> str:
        """What ``tc`` says is on each end (the shaping the lab set)."""
        here = subprocess.run(["tc", "qdisc", "show", "dev", self.veth_here], capture_output=True, text=True).stdout
        there = _ip("netns", "exec", self.netns, "tc", "qdisc", "show", "dev", self.veth_there).stdout
        return f"{self.veth_here}: {here.strip()}\n{self.veth_there}: {there.strip()}"

    def exists(self) -> bool:
        return (
            self.netns in _ip("netns", "list").stdout.split()
            or pathlib.Path(f"/sys/class/net/{self.veth_here}").exists()
        )

    def close(self) -> None:
        """Remove the namespace and the veth (the watchdog does it: one way out, also for a dead kernel)."""
        w = self._watchdog
        if w.poll() is None:
            with contextlib.suppress(OSError):
                w.stdin.close()
            try:
                w.wait(10)
            except subprocess.TimeoutExpired:
                w.kill()
                w.wait(5)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        delay = f" + {self.delay_ms:g} ms" if self.delay_ms else ""
        return f"SlowLink({self.addr_here} <-> {self.addr_there} in {self.netns}: {self.mbit:g} Mbit/s{delay} each way)"


def _free_names() -> tuple[str, int]:
    """A tag no interface or namespace here uses (names fit IFNAMSIZ's 15 characters), and a
    10.232.x.0/24 no address here is in: two kernels, or one link made twice, do not clash."""
    netns = set(_ip("netns", "list").stdout.split())
    addrs = _ip("-o", "-4", "addr", "show").stdout
    base = os.getpid() % 10000
    tags = (f"{base}{n:02d}" for n in range(100))
    tag = next(
        (t for t in tags if f"wblab12-{t}" not in netns and not os.path.exists(f"/sys/class/net/wb12a{t}")), None
    )
    subnet = next((s for s in (1 + (base + k) % 250 for k in range(250)) if f" 10.232.{s}." not in addrs), None)
    if tag is None or subnet is None:
        raise LinkError("no free name or 10.232.x.0/24 subnet for a link: close the links made before (link.close())")
    return tag, subnet


@contextlib.contextmanager
def on_host(netns: str | None, gloo_interface: str | None = None):
    """Run the block with the calling thread's network in namespace ``netns`` (``None``: stay),
    and gloo binding ``gloo_interface`` (``GLOO_SOCKET_IFNAME``, read when a gloo group is made).

    Sockets opened inside stay there after the block (a socket belongs to the namespace it
    was made in); threads started inside inherit it. Both are restored after the block, so
    the workbench's own groups made later bind where they did outside it. Rank side; needs root."""
    with _gloo_interface(gloo_interface):
        if netns is None:
            yield
            return
        libc = ctypes.CDLL(None, use_errno=True)
        try:
            there = os.open(f"/run/netns/{netns}", os.O_RDONLY)
        except FileNotFoundError:
            raise LinkError(f"no network namespace {netns!r} here (`ip netns list`): was its link closed?") from None
        home = os.open(f"/proc/self/task/{threading.get_native_id()}/ns/net", os.O_RDONLY)
        try:
            if libc.setns(there, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), f"setns into {netns}: {os.strerror(ctypes.get_errno())}")
            try:
                yield
            finally:
                if libc.setns(home, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), "setns back to this host's network")
        finally:
            os.close(there)
            os.close(home)


@contextlib.contextmanager
def _gloo_interface(name: str | None):
    before = os.environ.get("GLOO_SOCKET_IFNAME")
    if name is not None:
        os.environ["GLOO_SOCKET_IFNAME"] = name
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("GLOO_SOCKET_IFNAME", None)
        else:
            os.environ["GLOO_SOCKET_IFNAME"] = before


@checker("lab_12.ddp_link_bytes")
def check_ddp_link_bytes(value, *, measured: float, param_bytes: int) -> str:
    """Bytes on the link per DDP step, both directions together (a number, from `PARAM_BYTES`)."""
    hint = mismatch(
        value,
        measured,
        what="ddp_link_bytes",
        rtol=0.12,  # the wire adds TCP/IP headers and acknowledgements (the answer says their share)
        mistakes=[
            (0.5, "that is one direction: each of the 2 ranks sends its share, and the link carries both"),
            (0.25, "parameters, not bytes: each fp32 parameter is 4 bytes (and both ranks send)"),
            (0.125, "parameters, not bytes (4 per fp32 parameter), and one direction only"),
            (2.0, "a ring all-reduce on 2 ranks sends 2(n-1)/n x B = B bytes per rank, not 2B"),
        ],
    )
    if hint:
        raise CheckFailed(hint)
    wire = measured / (2 * param_bytes) - 1
    return (
        f"{number(value)} bytes per step predicted, {number(round(measured))} measured on the link: each rank "
        f"sends 2(n-1)/n x {number(param_bytes)} gradient bytes, plus {wire:.1%} of headers and acknowledgements"
    )


@checker("lab_12.ddp_step_ms")
def check_ddp_step_ms(value, *, measured_ms: float, param_bytes: int, mbit: float) -> str:
    """The least time in ms a DDP step can take on the link, its gradients' bytes at `mbit` Mbit/s (a number)."""
    bound = param_bytes * 8 / (mbit * 1e6) * 1e3
    hint = mismatch(
        value,
        bound,
        what="ddp_step_ms",
        rtol=0.03,
        mistakes=[
            (1 / 8, "bytes are not bits: 1 Mbit/s carries 125,000 bytes a second"),
            (8, "the link's rate is in bits: multiply the bytes by 8 before dividing by the rate, not after"),
            (2, "each direction has its own Mbit/s (full duplex): the two ranks' shares cross at the same time"),
            (2**20 / 1e6, "a network's Mbit is 10^6 bits, not 2^20"),
            (1e-3, "in milliseconds, not seconds"),
        ],
    )
    if hint:
        raise CheckFailed(hint.replace("the run measured", "the link's rate gives"))
    if measured_ms < 0.9 * bound:
        raise CheckFailed(
            f"the run measured a DDP step of {measured_ms:.0f} ms, faster than the {bound:.0f} ms the link allows: "
            "was the link made with another rate? Run the link and DDP cells again"
        )
    return (
        f"{value:.0f} ms: {number(param_bytes)} bytes each way at {mbit:g} Mbit/s; the run measured "
        f"{measured_ms:.0f} ms per DDP step, the link busy for {bound / measured_ms:.0%} of it"
    )


@checker("lab_12.sync_ratio")
def check_sync_ratio(value, *, ddp_bytes: float, diloco_bytes: float, sync_every: int) -> str:
    """How many times fewer bytes per step DiLoCo puts on the link than DDP, syncing every `H` steps (a number)."""
    measured = ddp_bytes / diloco_bytes
    hint = mismatch(
        value,
        measured,
        what="sync_ratio",
        rtol=0.25,  # DiLoCo's steps also carry torchft's heartbeats and quorum calls
        mistakes=[
            (1 / measured**2, "that is DiLoCo's share of DDP's bytes (1/H); the question is how many times fewer"),
            (2.0, "the outer step all-reduces one pseudo-gradient per parameter, as DDP all-reduces one gradient"),
        ],
    )
    if hint:
        raise CheckFailed(hint)
    return (
        f"DiLoCo sent {measured:.1f}x fewer bytes per step than DDP (H = {sync_every}): one all-reduce of the "
        f"pseudo-gradients every {sync_every} steps instead of one of the gradients every step"
    )
