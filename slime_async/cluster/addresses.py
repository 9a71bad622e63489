"""This node's address, and the environment that makes every transport bind to it.

gloo, NCCL and TensorPipe (torch RPC) each pick a network interface on their own, from the
host name, which on a multi-homed node is often the wrong one (or loopback). Children placed on
a node get that node's interface named explicitly, unless the user already chose one.
"""

from __future__ import annotations

import socket

import psutil

LOOPBACK = "127.0.0.1"
NODE_IP_ENV = "SLIME_NODE_IP"  # read by the trainer ranks to report their node's address
_IFNAME_VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "TP_SOCKET_IFNAME")


def detect_node_ip(towards: str | None = None) -> str:
    """The address this node uses to reach ``towards`` (default: a public address, no packet is
    sent: a UDP ``connect`` only asks the kernel for a route); loopback when there is no route."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((towards or "192.0.2.1", 9))
            return probe.getsockname()[0]
        except OSError:
            return LOOPBACK


def interface_of(ip: str) -> str | None:
    """The name of the interface that holds ``ip`` (``lo`` for any 127.x address), or None."""
    for name, addresses in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == ip for a in addresses):
            return name
    if ip.startswith("127."):  # the whole 127/8 is on the loopback interface
        return next((n for n, addrs in psutil.net_if_addrs().items()
                     if any(a.family == socket.AF_INET and a.address.startswith("127.") for a in addrs)), None)
    return None


def node_environment(ip: str, inherited: dict[str, str]) -> dict[str, str]:
    """Variables to add to a child's environment on the node at ``ip``: its address, and the
    interface for gloo / NCCL / TensorPipe where ``inherited`` does not name one already."""
    env = {NODE_IP_ENV: ip}
    interface = interface_of(ip)
    if interface is not None:
        env.update({name: interface for name in _IFNAME_VARIABLES if not inherited.get(name)})
    return env


def split_host_port(address: str, what: str) -> tuple[str, int]:
    """``HOST:PORT`` -> (host, port); a ValueError naming ``what`` otherwise."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{what} must be HOST:PORT, got {address!r}")
    return host, int(port)
