"""Address helpers: which local address to advertise, tcp:// endpoints and the IPv6 bracket rule (the one
copy of it: ZMQ endpoints and HTTP URLs both write IPv6 literals in brackets)."""

from __future__ import annotations

import socket

# Hosts that mean "every interface" when binding, so a peer cannot dial them (ZMQ spells it "*").
WILDCARD_HOSTS = ("0.0.0.0", "::", "*", "")


def split_tcp_address(address: str) -> tuple[str, int]:
    """("host", port) of "tcp://host:port" (IPv6 hosts in brackets); ValueError naming the address."""
    if not isinstance(address, str) or not address.startswith("tcp://"):
        raise ValueError(f"address must look like tcp://host:port, got {address!r}")
    host, sep, port = address[len("tcp://") :].rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"address must look like tcp://host:port, got {address!r}")
    return host.strip("[]"), int(port)


def resolve_host(host: str, router_addr: str) -> str:
    """`host`, or for "auto" the local address this machine uses to reach the router.

    A UDP socket's connect() only picks a route (no packet is sent), so this works offline too.
    """
    if host != "auto":
        return host
    router_host, router_port = split_tcp_address(router_addr)
    family = socket.AF_INET6 if ":" in router_host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect((router_host, router_port))
            return s.getsockname()[0]
    except OSError:
        return "127.0.0.1" if family == socket.AF_INET else "::1"


def bracket(host: str) -> str:
    """`host` as it goes into an endpoint or URL: IPv6 literals need brackets (given once)."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def names_ipv6_literal(endpoint: str) -> bool:
    """Whether a tcp:// endpoint (or URL) names an IPv6 literal host, i.e. carries brackets."""
    return "[" in endpoint


def tcp_endpoint(host: str, port: int | str = "*") -> str:
    """A ZMQ tcp endpoint ("*": an ephemeral port when binding)."""
    return f"tcp://{bracket(host)}:{port}"


def split_addresses(text: str) -> list[str]:
    """The addresses of a comma-separated list (one router front's inbox each), in order, no blanks."""
    return [part.strip() for part in text.split(",") if part.strip()]
