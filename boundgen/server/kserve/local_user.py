"""Which local user sent a request: the owner of the client's TCP socket, as the kernel lists it in
/proc/net/tcp and /proc/net/tcp6 (the `uid` of the row whose local address is the client's end of
the connection). System shared memory (shared_memory.py) gives each region to the user who
registered it and lets a user register only objects it owns, so that one local process cannot
read, overwrite or unregister another user's memory through the server.

A client that is not on this host, or whose socket the tables do not list (another network
namespace), has no local user: None. A client behind a proxy on this host is the proxy's user.
Reading the tables is the kernel's walk of its whole connection table: ~5 ms each of the two on a
2-core VM whether it lists 40 sockets or a thousand. Only requests that use shared memory ask, an
HTTP connection once; a gRPC call each time (gRPC does not say which connection a call came on).
"""

from __future__ import annotations

import ipaddress
import re
import sys

from boundgen.server.connections import LimitedRequestHandler

TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
ESTABLISHED = "01"  # the `st` column of a connected socket
_GRPC_PEER = re.compile(r"^ipv([46]):\[?([0-9A-Fa-f.:]+?)\]?:(\d+)$")  # grpc's context.peer(): "ipv4:127.0.0.1:5000"


def _table_form(ip: ipaddress.IPv4Address | ipaddress.IPv6Address, port: int) -> str:
    """host:port as /proc/net/tcp(6) writes a local address, "0100007F:1F90": the IP in 32-bit words
    of the host's byte order, in hex, then the port in hex."""
    raw = ip.packed
    if sys.byteorder == "little":
        raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return f"{raw.hex().upper()}:{port:04X}"


def _table_forms(host: str, port: int) -> set[str]:
    """Every way the tables may list a socket whose local end is host:port (an IPv4 address also
    as IPv4-mapped IPv6, in tcp6: a dual-stack socket's)."""
    ip = ipaddress.ip_address(host.split("%")[0])
    mapped = getattr(ip, "ipv4_mapped", None)
    if mapped is not None:
        ip = mapped
    forms = {_table_form(ip, port)}
    if ip.version == 4:
        forms.add(_table_form(ipaddress.IPv6Address(f"::ffff:{ip}"), port))
    return forms


def socket_owner(host: str, port: int, tables=TABLES) -> int | None:
    """The uid owning the connected TCP socket whose local end is host:port (a client's end, seen
    from the server as its peer), if exactly one user has such a socket; else None. A remote client's
    socket is on its own host: no row here has its address as the local one."""
    try:
        forms = _table_forms(host, port)
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
            fields = line.split(None, 8)
            # A closed socket's TIME_WAIT row says uid 0: connected sockets only.
            if len(fields) >= 8 and fields[1] in forms and fields[3] == ESTABLISHED:
                owners.add(int(fields[7]))
    return owners.pop() if len(owners) == 1 else None


def http_user(request) -> int | None:
    """The local user of an aiohttp request's client (None: not on this host, or not known),
    looked up once a connection: its client's socket, and so its owner, is the same for its life."""
    protocol = getattr(request, "protocol", None)
    cached = isinstance(protocol, LimitedRequestHandler)
    if cached and hasattr(protocol, "local_user"):
        return protocol.local_user
    transport = getattr(request, "transport", None)
    peer = transport.get_extra_info("peername") if transport is not None else None
    user = socket_owner(str(peer[0]), int(peer[1])) if isinstance(peer, tuple) and len(peer) >= 2 else None
    if cached:
        protocol.local_user = user
    return user


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
