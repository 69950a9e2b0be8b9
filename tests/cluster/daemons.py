"""Real cluster daemons for the tests: munge + a single-node Slurm, and a second host.

The second host is a network namespace with its own hostname (``unshare --uts``) and
sshd, joined to this one by a veth pair on a private /24 used only between its two ends.
It shares the file system and pid space with this host (the same venv path works there),
not the network: its 127.0.0.1 is its own, and so are its ``~/.cache`` and ``/dev/shm``
(tmpfs in its mount namespace; a host may hide more folders, ``SecondHost(hide=...)``). Every daemon is ended by the pid started
here; the namespace and the veth are deleted by the names made here; ports are free
ones asked of the kernel, so two suites can run at once.
"""

from __future__ import annotations

import os
import pathlib
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import psutil

CACHE = os.path.expanduser("~/.cache")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def processes_of(profile_dirs) -> dict[int, str]:
    """pid -> command line of every live process started for these ipyparallel profiles.

    Marked by the environment ipyparallel gives the controller, its forked schedulers and
    the engines on every host (``IPP_PROFILE_DIR``; an SSH host's profile lies under it),
    which survives re-parenting to init where ancestry does not.
    """
    roots = [str(d) for d in profile_dirs]
    out = {}
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            where = p.environ().get("IPP_PROFILE_DIR", "")
            if where and any(where == r or where.startswith(r + os.sep) for r in roots):
                if p.status() != psutil.STATUS_ZOMBIE:
                    out[p.pid] = " ".join(p.info["cmdline"] or [])
        except psutil.Error:
            continue
    return out


def end_leftovers(pids, timeout: float = 10.0) -> dict[int, str]:
    """Wait up to ``timeout`` for these pids to end; kill (by pid) and return those left."""
    deadline = time.monotonic() + timeout
    left: dict[int, str] = {}
    while True:
        left = {}
        for pid, cmd in dict(pids).items():
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    left[pid] = cmd
            except psutil.NoSuchProcess:
                pass
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    for pid in left:
        try:
            psutil.Process(pid).kill()
        except psutil.Error:
            pass
    return left


# each tool the tier runs, with the Debian package that has it; found where the tests run it
# from: on PATH, or at the full path for the two daemons started by theirs
TOOLS = {
    "munged": "munge",
    "slurmctld": "slurm-wlm",
    "slurmd": "slurm-wlm",
    "sbatch": "slurm-wlm",
    "squeue": "slurm-wlm",
    "scancel": "slurm-wlm",
    "sshd": "openssh-server",
    "ssh": "openssh-client",
    "ip": "iproute2",
    "unshare": "util-linux",
}
BY_PATH = {"munged": "/usr/sbin/munged", "sshd": "/usr/sbin/sshd"}


def missing_tools() -> list[str]:
    """The tools of :data:`TOOLS` not where the tests run them from, each as ``tool (package)``."""
    return [
        f"{t} ({pkg})"
        for t, pkg in TOOLS.items()
        if not (os.access(BY_PATH[t], os.X_OK) if t in BY_PATH else shutil.which(t))
    ]


def _spawn(args, log: pathlib.Path, env=None) -> subprocess.Popen:
    out = open(log, "ab")  # noqa: SIM115 - the daemon owns it
    return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env)


def _end(procs) -> None:
    """SIGTERM every daemon at once, SIGKILL what is left after 3 s; reap them."""
    procs = [p for p in procs if p is not None and p.poll() is None]
    for p in procs:
        try:
            p.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 3
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)


def _wait_for(check, timeout: float, what: str, log: pathlib.Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    tail = log.read_text(errors="replace")[-2000:] if log and log.exists() else ""
    raise RuntimeError(f"{what} not ready after {timeout} s\n{tail}")


class Slurm:
    """munged + slurmctld + slurmd on this host, configured under a private folder.

    ``ghost`` declares a second node that never comes up, so that a job asking for two
    nodes pends (reason ``Resources``/``ReqNodeNotAvail``) instead of being refused.
    """

    def __init__(self, *, cpus: int = 8, ghost: bool = True):
        self.dir = pathlib.Path(tempfile.mkdtemp(prefix="wb-slurm-"))
        self.dir.chmod(0o700)
        self.procs: list[subprocess.Popen] = []
        self.host = socket.gethostname().split(".")[0]
        self.conf = self.dir / "slurm.conf"
        self.munge_socket = self.dir / "munge.sock"
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))
        try:
            self._munge()
            self._write_conf(cpus, ghost)
            self.procs.append(_spawn(["slurmctld", "-D", "-i", "-f", str(self.conf)], self.dir / "ctld.out", self.env))
            self.procs.append(_spawn(["slurmd", "-D", "-f", str(self.conf)], self.dir / "slurmd.out", self.env))
            _wait_for(self._idle, 30, "slurm node", self.dir / "slurmctld.log")
        except BaseException:
            self.close()
            raise

    def _munge(self) -> None:
        key = self.dir / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        d = self.dir
        self.procs.append(
            _spawn(
                [
                    "/usr/sbin/munged",
                    "-F",
                    "-f",
                    f"--socket={self.munge_socket}",
                    f"--key-file={key}",
                    f"--pid-file={d / 'munged.pid'}",
                    f"--log-file={d / 'munged.log'}",
                    f"--seed-file={d / 'munge.seed'}",
                ],
                d / "munged.out",
            )
        )
        _wait_for(self.munge_socket.exists, 10, "munged", d / "munged.out")

    def _write_conf(self, cpus: int, ghost: bool) -> None:
        d = self.dir
        for sub in ("state", "spool"):
            (d / sub).mkdir()
        lines = [
            f"ClusterName=wb{os.getpid()}",
            f"SlurmctldHost={self.host}(127.0.0.1)",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            "MpiDefault=none",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "SwitchType=switch/none",
            "SchedulerType=sched/backfill",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "SlurmdParameters=config_overrides",
            f"SlurmctldPort={free_port()}",
            f"SlurmdPort={free_port()}",
            f"StateSaveLocation={d / 'state'}",
            f"SlurmdSpoolDir={d / 'spool'}",
            f"SlurmctldPidFile={d / 'slurmctld.pid'}",
            f"SlurmdPidFile={d / 'slurmd.pid'}",
            f"SlurmctldLogFile={d / 'slurmctld.log'}",
            f"SlurmdLogFile={d / 'slurmd.log'}",
            "ReturnToService=2",
            "InactiveLimit=0",
            "MinJobAge=2",
            "KillWait=2",
            "MailProg=/bin/true",
            "SchedulerParameters=sched_interval=1",
            f"NodeName={self.host} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory=1000 State=UNKNOWN",
        ]
        if ghost:  # declared, never started: a second node that is never available
            lines.append(
                f"NodeName=ghost NodeAddr=127.0.0.1 Port={free_port()} CPUs={cpus} RealMemory=1000 State=FUTURE"
            )
        lines.append("PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES")
        self.conf.write_text("\n".join(lines) + "\n")

    def _idle(self) -> bool:
        r = subprocess.run(["sinfo", "-h", "-n", self.host, "-o", "%t"], env=self.env, capture_output=True, text=True)
        return r.stdout.strip() == "idle"

    def squeue(self) -> list[str]:
        r = subprocess.run(["squeue", "-h", "-o", "%i %T %r"], env=self.env, capture_output=True, text=True)
        return [line for line in r.stdout.splitlines() if line.strip()]

    def close(self) -> None:
        r = subprocess.run(["squeue", "-h", "-o", "%i"], env=self.env, capture_output=True, text=True)
        jobs = r.stdout.split()
        if jobs and self.procs and self.procs[-1].poll() is None:
            subprocess.run(["scancel", *jobs], env=self.env, capture_output=True)
        _end(self.procs[::-1])
        shutil.rmtree(self.dir, ignore_errors=True)


class Bridge:
    """A bridge on this host holding its address on one /24, for several hosts that reach it and
    each other directly (no forwarding on this host)."""

    def __init__(self, net: int = 233):
        tag = f"{os.getpid() % 100000}"
        self.name = f"wbbr{tag}"
        subnet = 100 + os.getpid() % 150
        self.prefix = f"10.{net}.{subnet}."
        self.addr_here = self.prefix + "1"
        self._last = 1
        subprocess.run(["ip", "link", "add", "name", self.name, "type", "bridge"], check=True, capture_output=True)
        try:
            subprocess.run(
                ["ip", "addr", "add", f"{self.addr_here}/24", "dev", self.name], check=True, capture_output=True
            )
            subprocess.run(["ip", "link", "set", self.name, "up"], check=True, capture_output=True)
        except BaseException:
            self.close()
            raise

    def next_address(self) -> str:
        self._last += 1
        return self.prefix + str(self._last)

    def close(self) -> None:
        subprocess.run(["ip", "link", "del", self.name], capture_output=True)


class SecondHost:
    """A network namespace ``hostb`` (own hostname, address, /dev/shm and one private folder) running sshd."""

    def __init__(self, *, name: str = "hostb", net: int = 231, hide=(), binds=(), bridge: Bridge | None = None):
        """``hide``: folders this host does not see (a tmpfs over each, in its mount namespace);
        ``binds``: ``(folder, where)`` pairs it sees at another path, bound before anything is hidden
        (an environment of its own, made of one that lies in a hidden folder); ``net``: the second
        byte of its /24, so that two hosts of one suite do not clash; ``bridge``: on that bridge's
        /24 instead, beside the other hosts there (which it reaches directly)."""
        tag = f"{os.getpid() % 100000}"
        short = name[-1]
        self.netns = f"wb{name}{tag}"
        self.veth_here, self.veth_there = f"wb{short}a{tag}", f"wb{short}b{tag}"
        subnet = 100 + os.getpid() % 150  # one private /24 per suite: two suites do not clash
        self.addr_here, self.addr = f"10.{net}.{subnet}.1", f"10.{net}.{subnet}.2"
        self.bridge = bridge
        if bridge is not None:
            self.addr_here, self.addr = bridge.addr_here, bridge.next_address()
        self.hostname = f"{name}{tag}"
        self.dir = pathlib.Path(tempfile.mkdtemp(prefix=f"wb-{name}-"))
        self.dir.chmod(0o700)
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self._made: list[str] = []
        # its own ~/.cache (a host-local disk): what a rank caches there stays there and goes with it
        os.makedirs(CACHE, exist_ok=True)
        self.hide = tuple(dict.fromkeys([*(str(h) for h in hide), CACHE]))
        self.binds = tuple((str(a), str(b)) for a, b in binds)
        try:
            self._network()
            self._sshd()
        except BaseException:
            self.close()
            raise

    def _ip(self, *args) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True)

    def _network(self) -> None:
        self._ip("netns", "add", self.netns)
        self._made.append("netns")
        self._ip("link", "add", self.veth_here, "type", "veth", "peer", "name", self.veth_there)
        self._made.append("veth")
        self._ip("link", "set", self.veth_there, "netns", self.netns)
        if self.bridge is not None:
            self._ip("link", "set", self.veth_here, "master", self.bridge.name)
        else:
            self._ip("addr", "add", f"{self.addr_here}/24", "dev", self.veth_here)
        self._ip("link", "set", self.veth_here, "up")
        ns = ("netns", "exec", self.netns, "ip")
        self._ip(*ns, "addr", "add", f"{self.addr}/24", "dev", self.veth_there)
        self._ip(*ns, "link", "set", self.veth_there, "up")
        self._ip(*ns, "link", "set", "lo", "up")

    def _sshd(self) -> None:
        d = self.dir
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / "host_key")], check=True)
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / "id")], check=True)
        (d / "authorized_keys").write_text((d / "id.pub").read_text())
        os.makedirs("/run/sshd", exist_ok=True)
        (d / "sshd_config").write_text(
            "\n".join(
                [
                    f"Port {self.port}",
                    f"ListenAddress {self.addr}",
                    f"HostKey {d / 'host_key'}",
                    f"AuthorizedKeysFile {d / 'authorized_keys'}",
                    "PermitRootLogin prohibit-password",
                    "PasswordAuthentication no",
                    "UsePAM no",
                    "MaxStartups 200",  # every engine of a large set logs in at once
                    "StrictModes no",
                    f"PidFile {d / 'sshd.pid'}",
                    "Subsystem sftp /usr/lib/openssh/sftp-server",
                    "",
                ]
            )
        )
        self.ssh_config = d / "ssh_config"
        self.ssh_config.write_text(
            "\n".join(
                [
                    "Host *",
                    f"  Port {self.port}",
                    f"  IdentityFile {d / 'id'}",
                    "  IdentitiesOnly yes",
                    "  StrictHostKeyChecking no",
                    "  UserKnownHostsFile /dev/null",
                    "  BatchMode yes",
                    "  LogLevel ERROR",
                    "",
                ]
            )
        )
        # its own mount namespace too, with one folder only it sees (a host-local disk) and
        # its own /dev/shm (shared memory is per host: ranks here and there cannot share a file)
        self.private = d / "private"
        self.private.mkdir()
        self.proc = _spawn(self.enter(f"exec /usr/sbin/sshd -D -e -f {d / 'sshd_config'}"), d / "sshd.out")
        _wait_for(lambda: self.ssh("true").returncode == 0, 20, "sshd in the namespace", d / "sshd.out")

    def mounts(self) -> str:
        """The shell commands that make a new mount namespace this host's: its host name, its own
        /dev/shm and private folder, the bound folders, then a tmpfs over each hidden one."""
        steps = [f"hostname {self.hostname}", f"mount -t tmpfs none {self.private}", "mount -t tmpfs none /dev/shm"]
        for folder, where in self.binds:
            os.makedirs(where, exist_ok=True)
            steps.append(f"mount --bind {shlex.quote(folder)} {shlex.quote(where)}")
        steps += [f"mount -t tmpfs none {shlex.quote(h)}" for h in self.hide]
        return " && ".join(steps)

    def enter(self, command: str) -> list[str]:
        """``command`` (a shell line) run inside this host: its network and a mount namespace as sshd's."""
        ns = ["ip", "netns", "exec", self.netns, "unshare", "--uts", "--mount", "--propagation", "private"]
        return [*ns, "sh", "-c", f"{self.mounts()} && {command}"]

    def join(self, cmd: list[str]) -> list[str]:
        """``cmd`` run inside this host as it is now: the namespaces of its running sshd (its disk too)."""
        return ["nsenter", "-t", str(self.proc.pid), "-m", "-u", "-n", *cmd]

    def ssh(self, command: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["ssh", "-F", str(self.ssh_config), f"root@{self.addr}", command],
            capture_output=True,
            text=True,
            timeout=30,
        )

    def set_link(self, up: bool) -> None:
        """Take this host's end of the veth down (a cable pulled: nothing ends, nothing is
        told) or up again. Its own end: this host's address on the pair stays reachable
        from here, as a local address is whatever its link does."""
        self._ip("netns", "exec", self.netns, "ip", "link", "set", self.veth_there, "up" if up else "down")

    def pids_in_namespace(self) -> list[int]:
        """Processes whose network namespace is this host's (the ranks launched there, sshd)."""
        r = subprocess.run(["ip", "netns", "pids", self.netns], capture_output=True, text=True)
        return [int(p) for p in r.stdout.split()]

    def close(self) -> None:
        if self.proc is not None:
            # sshd's sessions and anything still running in the namespace, by pid
            left = [p for p in self.pids_in_namespace() if p != self.proc.pid]
            for pid in left:
                try:
                    psutil.Process(pid).kill()
                except psutil.Error:
                    pass
            _end([self.proc])
        if "veth" in self._made:
            subprocess.run(["ip", "link", "del", self.veth_here], capture_output=True)
        if "netns" in self._made:
            subprocess.run(["ip", "netns", "del", self.netns], capture_output=True)
        shutil.rmtree(self.dir, ignore_errors=True)
