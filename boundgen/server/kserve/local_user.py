"""Which local user sent a request: the owner of the client's TCP socket, as the kernel lists it in
/proc/net/tcp and /proc/net/tcp6 (the `uid` of the row whose local address is the client's end of
the connection). System shared memory (shared_memory.py) gives each region to the user who
registered it and lets a user register only objects it owns, so that one local process cannot
read, overwrite or unregister another user's memory through the server.

A client that is not on this host, or whose socket the tables do not list (another network
namespace), has no local user: None. A client behind a proxy on this host is the proxy's user.
Reading the tables costs about a microsecond a listed socket; only shared memory requests ask.
"""

from __future__ import annotations

import ipaddress
import re
import sys

TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
ESTABLISHED = "01"  # the `st` column of a connected socket
_GRPC_PEER = re.compile(r"^ipv([46]):\[?([0-9A-Fa-f.:]+?)\]?:(\d+)$")  # grpc's context.peer(): "ipv4:127.0.0.1:5000"


def _address(field: str) -> tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]:
    """A /proc/net/tcp address, "0100007F:1F90": the IP in 32-bit words of the host's byte order, the port in hex."""
    ip_hex, port_hex = field.split(":")
    raw = bytes.fromhex(ip_hex)
    if sys.byteorder == "little":
        raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return ipaddress.ip_address(raw), int(port_hex, 16)


def _plain(ip: ipaddress.IPv4Address | ipaddress.IPv6Address):
    """An IPv4-mapped IPv6 address (::ffff:127.0.0.1) as the IPv4 address it maps."""
    mapped = getattr(ip, "ipv4_mapped", None)
    return mapped if mapped is not None else ip


def socket_owner(host: str, port: int, tables=TABLES) -> int | None:
    """The uid owning the connected TCP socket whose local end is host:port (a client's end, seen
    from the server as its peer), if exactly one user has such a socket; else None. A remote client's
    socket is on its own host: no row here has its address as the local one."""
    try:
        wanted = _plain(ipaddress.ip_address(host.split("%")[0]))
    except ValueError:
        return None
    owners = set()
    for table in tables:
        try:
            with open(table) as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 8 or fields[3] != ESTABLISHED:  # a closed socket's TIME_WAIT row says uid 0
                continue
            try:
                ip, at = _address(fields[1])
            except ValueError:
                continue
            if at == port and _plain(ip) == wanted:
                owners.add(int(fields[7]))
    return owners.pop() if len(owners) == 1 else None


def http_user(request) -> int | None:
    """The local user of an aiohttp request's client (None: not on this host, or not known)."""
    transport = getattr(request, "transport", None)
    peer = transport.get_extra_info("peername") if transport is not None else None
    if not isinstance(peer, tuple) or len(peer) < 2:
        return None
    return socket_owner(str(peer[0]), int(peer[1]))


def grpc_user(context) -> int | None:
    """The local user of a gRPC call's client (None: not on this host, or not known)."""
    try:
        peer = context.peer()
    except Exception:  # noqa: BLE001 - a context without a peer (another transport)
        return None
    match = _GRPC_PEER.match(peer) if isinstance(peer, str) else None
    if match is None:
        return None
    return socket_owner(match.group(2), int(match.group(3)))
