"""Which address the notebook's listeners (controller, event stream, lifeline) bind.

Ranks on this host only: loopback, nothing reachable from outside. Ranks on other
hosts: ``--ip`` if given, else the address of this host's interface toward the first
remote host (the kernel's route lookup: a UDP ``connect`` sends no packet). Never
``0.0.0.0`` by default, and never loopback while any rank is remote.
"""

from __future__ import annotations

import ipaddress
import socket
import subprocess


class AddressError(ValueError):
    """No usable address, or one the remote ranks could not reach."""


def is_loopback(ip: str) -> bool:
    try:
        return ipaddress.ip_address(ip).is_loopback
    except ValueError:
        return False


def check_ip(ip: str) -> str:
    """``ip`` if it is an address of this host; a clear error otherwise."""
    try:
        ipaddress.ip_address(ip)
    except ValueError:
        raise AddressError(
            f"--ip {ip!r} is not an IP address: give one of this host's addresses ({', '.join(local_addresses())})"
        ) from None
    if ip in ("0.0.0.0", "::"):
        return ip  # asked for explicitly: every interface
    if ip not in local_addresses():
        raise AddressError(f"--ip {ip} is not an address of this host: use one of {', '.join(local_addresses())}")
    return ip


def local_addresses() -> list[str]:
    import psutil

    return sorted({a.address for addrs in psutil.net_if_addrs().values() for a in addrs if a.family == socket.AF_INET})


def toward(host: str) -> str:
    """This host's address on the route to ``host`` (a name or an address)."""
    try:
        target = socket.getaddrinfo(host, None, socket.AF_INET)[0][4][0]
    except socket.gaierror as exc:
        raise AddressError(f"cannot resolve host {host!r} ({exc}): give its address or pass --ip") from None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((target, 9))  # a route lookup only: UDP connect sends nothing
        except OSError as exc:
            raise AddressError(f"no route from this host to {host} ({target}): {exc}; pass --ip") from None
        return s.getsockname()[0]


def ssh_hostname(host: str, ssh_config: str | None = None) -> str:
    """The host name ssh would connect to for ``host`` (its ``HostName`` in the ssh config)."""
    target = host.split("@", 1)[-1]
    cmd = ["ssh", "-G"] + (["-F", ssh_config] if ssh_config else []) + [target]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return target
    for line in out.splitlines():
        key, _, value = line.partition(" ")
        if key == "hostname" and value:
            return value.strip()
    return target


def listen_address(ip: str | None, remote_hosts: list[str]) -> str:
    """The address to bind: ``ip`` checked, or loopback / the route toward the remote hosts."""
    if ip:
        ip = check_ip(ip)
        if remote_hosts and is_loopback(ip):
            raise AddressError(
                f"--ip {ip} is loopback, which ranks on {', '.join(remote_hosts)} cannot reach: "
                f"give this host's address toward them (one of {', '.join(local_addresses())})"
            )
        return ip
    if not remote_hosts:
        return "127.0.0.1"
    return toward(remote_hosts[0])


def free_port() -> int:
    """A TCP port free on this host right now (asked of the kernel), for ranks on this host."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]
