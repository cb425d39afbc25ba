"""Which local user sent a request: the owner of the client's TCP socket, as the kernel lists it in
/proc/net/tcp and /proc/net/tcp6 (the `uid` of the row whose local address is the client's end of
the connection). System shared memory (shared_memory.py) gives each region to the user who
registered it and lets a user register only objects it owns, so that one local process cannot
read, overwrite or unregister another user's memory through the server.

A client that is not on this host, or whose socket the tables do not list (another network
namespace), has no local user: None. A client behind a proxy on this host is the proxy's user.
Reading the tables is the kernel's walk of its whole connection table: ~5 ms each of the two on a
2-core VM whether it lists 40 sockets or a thousand. Where the server's end of the connection is
known too, the kernel is first asked for that one socket by its four addresses (NETLINK_SOCK_DIAG,
as `ss` asks: ~13 us on the same VM); the tables are read only where it has no answer (no netlink
here, another host's client). Only requests that use shared memory ask, an HTTP connection once
(its server end is its socket's); a gRPC call each time (gRPC does not say which connection a call
came on: its server end is the address the server listens on, where that is one address; one
listening on every address reads the tables, which alone see whether two users hold sockets of
the client's address and port).
"""

from __future__ import annotations

import ipaddress
import re
import socket
import struct
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


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """A host's address without its scope (%eth0), an IPv4-mapped IPv6 one as the IPv4 address its
    socket has (a dual-stack server sees an IPv4 client so); ValueError if it is no address."""
    ip = ipaddress.ip_address(host.split("%")[0])
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip if mapped is None else mapped


def _table_forms(host: str, port: int) -> set[str]:
    """Every way the tables may list a socket whose local end is host:port (an IPv4 address also
    as IPv4-mapped IPv6, in tcp6: a dual-stack socket's)."""
    ip = _ip(host)
    forms = {_table_form(ip, port)}
    if ip.version == 4:
        forms.add(_table_form(ipaddress.IPv6Address(f"::ffff:{ip}"), port))
    return forms


# NETLINK_SOCK_DIAG (linux/sock_diag.h, linux/inet_diag.h): one request for one TCP socket by its addresses
_NETLINK_SOCK_DIAG, _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST, _NLMSG_ERROR = 4, 20, 1, 2
_NO_COOKIE = struct.pack("=II", 0xFFFFFFFF, 0xFFFFFFFF)
_DIAG_UID_AT = 16 + 4 + 48 + 12  # nlmsghdr, inet_diag_msg's family..retrans, its sockid, expires..wqueue


def diag_owner(host: str, port: int, server_host: str, server_port: int) -> int | None:
    """The uid owning the TCP socket connected from host:port to server_host:server_port (a client's
    socket, asked of the kernel by its four addresses), or None: no such socket, or no netlink."""
    try:
        src, dst = _ip(host), _ip(server_host)
    except ValueError:
        return None
    if src.version != dst.version:
        return None
    family = socket.AF_INET if src.version == 4 else socket.AF_INET6
    sockid = (struct.pack("!HH", port, server_port) + src.packed.ljust(16, b"\0") + dst.packed.ljust(16, b"\0")
              + struct.pack("=I", 0) + _NO_COOKIE)
    request = struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 0, 0, 0xFFFFFFFF) + sockid  # every state
    message = struct.pack("=IHHII", 16 + len(request), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST, 1, 0) + request
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG) as nl:
            nl.settimeout(1.0)
            nl.sendto(message, (0, 0))
            answer = nl.recv(8192)
    except (OSError, AttributeError):  # no netlink (not Linux, a sandbox): the tables
        return None
    if len(answer) < _DIAG_UID_AT + 4 or struct.unpack_from("=H", answer, 4)[0] == _NLMSG_ERROR:
        return None  # the kernel has no such socket
    state = answer[17]
    if state != 1:  # TCP_ESTABLISHED only, as the tables are read (a TIME_WAIT socket says uid 0)
        return None
    return struct.unpack_from("=I", answer, _DIAG_UID_AT)[0]


def socket_owner(host: str, port: int, tables=TABLES, server: tuple[str, int] | None = None) -> int | None:
    """The uid owning the connected TCP socket whose local end is host:port (a client's end, seen
    from the server as its peer), if exactly one user has such a socket; else None. A remote client's
    socket is on its own host: no row here has its address as the local one. `server`: the
    connection's server end where it is known, asked of the kernel first (diag_owner)."""
    if server is not None:
        owner = diag_owner(host, port, *server)
        if owner is not None:
            return owner
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


def listening_end(host: str, port: int) -> tuple[str, int] | None:
    """(host, port) where the server listens on that one IP address; None for every address (0.0.0.0,
    ::) or a name: a call's server end is then not known."""
    try:
        ip = _ip(host)
    except ValueError:
        return None
    return None if ip.is_unspecified or not port else (host, port)


def http_user(request) -> int | None:
    """The local user of an aiohttp request's client (None: not on this host, or not known),
    looked up once a connection: its client's socket, and so its owner, is the same for its life."""
    protocol = getattr(request, "protocol", None)
    cached = isinstance(protocol, LimitedRequestHandler)
    if cached and hasattr(protocol, "local_user"):
        return protocol.local_user
    transport = getattr(request, "transport", None)
    peer = transport.get_extra_info("peername") if transport is not None else None
    own = transport.get_extra_info("sockname") if transport is not None else None
    server = (str(own[0]), int(own[1])) if isinstance(own, tuple) and len(own) >= 2 else None
    user = None
    if isinstance(peer, tuple) and len(peer) >= 2:
        user = socket_owner(str(peer[0]), int(peer[1]), server=server)
    if cached:
        protocol.local_user = user
    return user


def grpc_user(context, server: tuple[str, int] | None = None) -> int | None:
    """The local user of a gRPC call's client (None: not on this host, or not known); `server`: the
    one address and port the server listens on for gRPC (None: not one address, the tables alone)."""
    try:
        peer = context.peer()
    except Exception:  # noqa: BLE001 - a context without a peer (another transport)
        return None
    match = _GRPC_PEER.match(peer) if isinstance(peer, str) else None
    if match is None:
        return None
    return socket_owner(match.group(2), int(match.group(3)), server=server)
