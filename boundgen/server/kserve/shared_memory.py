"""System shared memory, Triton's extension: a client on this host passes input and output
tensors through POSIX shared memory instead of the request and response bodies
(`perf_analyzer --shared-memory=system`, tritonclient.utils.shared_memory).

    HTTP                                                     gRPC                          here
    GET  /v2/systemsharedmemory[/region/{r}]/status          SystemSharedMemoryStatus      status()
    POST /v2/systemsharedmemory/region/{r}/register          SystemSharedMemoryRegister    register()
    POST /v2/systemsharedmemory[/region/{r}]/unregister      SystemSharedMemoryUnregister  unregister()
    GET  /v2/cudasharedmemory[/region/{r}]/status            CudaSharedMemoryStatus        cuda_status()
    POST /v2/cudasharedmemory/region/{r}/register            CudaSharedMemoryRegister      cuda_register()
    POST /v2/cudasharedmemory[/region/{r}]/unregister        CudaSharedMemoryUnregister    (nothing to do)

A region is a named part [offset, offset + byte_size) of a shared memory object: `key` is the
name shm_open takes ("/input0" is /dev/shm/input0; tritonclient's create_shared_memory_region
makes one). A tensor names its place in a region with its parameters `shared_memory_region`,
`shared_memory_byte_size` (both required) and `shared_memory_offset` (default 0, from the
region's start): `tensor_ref`. An input is read from there in the raw layout of tensors.py
(BYTES elements length-prefixed, as tritonclient's serialize_byte_tensor writes them) and must
fill the slice exactly; an output is written there (it must fit) and its response entry carries
these parameters (shared_memory_byte_size: the bytes written) instead of data.

Client shared memory is off unless the server runs with --allow-client-shm (Triton's flag of the
same name): a client that registers a region makes the server read and write that object with
the server's own permissions, so only objects whose key starts with the server's prefix
(`ServerConfig.shm_prefix`, "/boundgen" by default) may be registered, and an input read from a
region is held to the body limit (--max-body-bytes) as one in the request would be. Regions
belong to users: the local user of the client's connection (local_user.py: the owner of the
client's socket) may register only an object it owns (root: any), and sees, uses and unregisters
only the regions it registered (region names are per user; "unregister all" is all of one's
own). A client with no local user (another host) may register nothing. Objects are
opened without following symbolic links and are never mapped: each access checks the object's
size now (os.fstat) and copies with os.pread / os.pwrite on the open descriptor. A mapping would
let a client that truncates its object while the server copies from it kill the server with
SIGBUS; a short read instead fails that one request (400 naming the region). Every call happens
on the event loop's thread. Unregistering a region that requests still use lets them finish:
each holds its Region, whose descriptor closes when the last one lets go.

CUDA shared memory is not supported (CUDA says why): its status lists no region, register is refused.

Errors: 400 / INVALID_ARGUMENT (an unknown region, a slice outside its region, a size that does
not match the tensor, a key that is not a shared memory object or is outside the prefix or
another user's, a client with no local user, an object shrunk under the region, an input over
the body limit, a user's MAX_REGIONS_PER_USER-th region or the server's MAX_REGIONS-th: each holds
an open descriptor), with the region in the message;
501 / UNIMPLEMENTED for register and unregister while client shared memory is off (status then
lists no region), and for a CUDA register; all as Triton answers them. Unregistering a region
that is not registered succeeds, as Triton's does.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from boundgen.errors import InvalidInput
from boundgen.server.config import SHM_PREFIX
from boundgen.server.status import Unsupported
from boundgen.server.kserve.tensors import Tensor, from_raw, to_raw

SHM_DIR = "/dev/shm"  # where Linux keeps POSIX shared memory objects (shm_open's namespace)
# Each region holds an open descriptor: without a bound, one client registering regions in a loop ran the
# server out of descriptors (its listeners then failed to accept connections, for good)
MAX_REGIONS_PER_USER = 256
MAX_REGIONS = 1024  # all users together
DISABLED = ("client shared memory is off on this server: start it with --allow-client-shm to let clients on its "
            "host pass tensors through shared memory")
CUDA = ("this server does not support CUDA shared memory: its inputs are texts, tokenized on the CPU, and its "
        "models may run on the CPU (as a CPU artifact does), so tensors in GPU memory would only be copied back; "
        "send tensors in the request, or from this host in system shared memory (--allow-client-shm)")
PARAMS = ("shared_memory_region", "shared_memory_byte_size", "shared_memory_offset")


@dataclass(frozen=True)
class TensorRef:
    """Where a tensor's bytes are: `byte_size` bytes from `offset` within the region `region`."""
    region: str
    byte_size: int
    offset: int = 0


def _count(value: Any, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidInput(f"{what} must be a non-negative integer, got {value!r}")
    return value


def tensor_ref(tensor: str, parameters: Mapping[str, Any]) -> TensorRef | None:
    """The shared memory place a tensor's `parameters` name (None: they name none)."""
    region = parameters.get("shared_memory_region")
    if region is None:
        given = [p for p in PARAMS[1:] if p in parameters]
        if given:
            raise InvalidInput(f"tensor {tensor}: {' and '.join(given)} given without shared_memory_region")
        return None
    if not isinstance(region, str) or not region:
        raise InvalidInput(f"tensor {tensor}: shared_memory_region must be a region's name, got {region!r}")
    if "shared_memory_byte_size" not in parameters:
        raise InvalidInput(f"tensor {tensor}: shared_memory_region needs shared_memory_byte_size too")
    return TensorRef(region, _count(parameters["shared_memory_byte_size"], f"tensor {tensor}: shared_memory_byte_size"),
                     _count(parameters.get("shared_memory_offset", 0), f"tensor {tensor}: shared_memory_offset"))


def _path(key: str, prefix: str = "/") -> str:
    """/dev/shm/NAME for a key as shm_open takes it (leading slashes, then one name without '/'),
    if "/NAME" starts with `prefix`."""
    name = key.lstrip("/")
    if not name or "/" in name or name in (".", "..") or "\0" in name or not _encodable(name):
        raise InvalidInput(f"shared memory key {key!r} is not a shared memory object's name (like '/input0')")
    if not f"/{name}".startswith(prefix):
        raise InvalidInput(f"shared memory key {key!r} is outside what this server may open: keys must start "
                           f"with {prefix!r} (--shm-prefix)")
    return os.path.join(SHM_DIR, name)


def _encodable(name: str) -> bool:
    """Whether `name` is a file name (UTF-8: no lone surrogate, which JSON's \\ud800 escapes can give)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class Region:
    """A registered region: its part of the object, read and written through the object's open
    descriptor (never mapped: see the module docstring)."""

    def __init__(self, name: str, key: str, offset: int, byte_size: int, prefix: str, user: int):
        """user: the local user registering it, who must own the object (root: any)."""
        self.name, self.key, self.offset, self.byte_size = name, key, offset, byte_size
        path = _path(key, prefix)
        if byte_size == 0:
            raise InvalidInput(f"shared memory region {name!r}: byte_size must be > 0")
        try:
            self._fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            raise InvalidInput(f"cannot open shared memory object {key!r} for region {name!r}: {exc.strerror}") from None
        try:
            info = os.fstat(self._fd)
            if not stat.S_ISREG(info.st_mode):
                raise InvalidInput(f"{key!r} is not a shared memory object (region {name!r})")
            if user != 0 and info.st_uid != user:
                raise InvalidInput(f"shared memory object {key!r} belongs to another user: a client may register "
                                   f"only objects its own user owns (region {name!r})")
            self._check_size()
        except BaseException:
            self.close()
            raise

    def _check_size(self) -> None:
        """The object must still hold the whole region (a client may have shrunk it since)."""
        size = os.fstat(self._fd).st_size
        if self.offset + self.byte_size > size:
            raise InvalidInput(f"shared memory region {self.name!r}: offset {self.offset} + byte_size {self.byte_size} "
                               f"runs past the end of object {self.key!r} ({size} bytes)")

    def status(self) -> dict:
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}

    def read(self, offset: int, size: int) -> bytes:
        self._check_size()
        data = os.pread(self._fd, size, self.offset + offset)
        if len(data) != size:  # shrunk between the check and the copy
            raise InvalidInput(f"shared memory region {self.name!r}: object {self.key!r} shrank while it was read "
                               f"({len(data)} of {size} bytes)")
        return data

    def write(self, offset: int, data: bytes) -> None:
        self._check_size()
        view, at = memoryview(data), self.offset + offset
        while view:
            written = os.pwrite(self._fd, view, at)
            view, at = view[written:], at + written

    def close(self) -> None:
        fd, self._fd = getattr(self, "_fd", -1), -1
        if fd >= 0:
            os.close(fd)

    def __del__(self):
        self.close()


@dataclass(frozen=True)
class Slice:
    """A tensor's place, checked against its region when the request arrived."""
    region: Region
    offset: int
    byte_size: int

    def where(self) -> str:
        return (f"shared memory region {self.region.name!r} (offset {self.offset}, "
                f"shared_memory_byte_size {self.byte_size})")

    def read_tensor(self, name: str, datatype: str, shape: tuple[int, ...], max_bytes: int | None = None) -> Tensor:
        """Input `name` from here; at most `max_bytes` (the body limit) are read."""
        if max_bytes is not None and self.byte_size > max_bytes:
            raise InvalidInput(f"input {name}: {self.where()} is over the server's limit of {max_bytes} bytes "
                               "(--max-body-bytes)")
        try:
            return from_raw(name, datatype, shape, self.region.read(self.offset, self.byte_size))
        except InvalidInput as exc:
            raise InvalidInput(f"{exc} (read from {self.where()})") from None

    def write_tensor(self, tensor: Tensor) -> dict:
        """Write `tensor` here; the response parameters saying so."""
        data = to_raw(tensor)
        if len(data) > self.byte_size:
            raise InvalidInput(f"output {tensor.name} is {len(data)} bytes; it does not fit {self.where()}")
        self.region.write(self.offset, data)
        return {"shared_memory_region": self.region.name, "shared_memory_byte_size": len(data),
                "shared_memory_offset": self.offset}


class SharedMemory:
    """The server's registered regions, shared by its HTTP and gRPC front ends, by local user
    (`user`: local_user.py's uid of the client; None for a client with no local user)."""

    def __init__(self, allowed: bool = False):
        self.allowed = allowed
        self.regions: dict[tuple[int, str], Region] = {}  # (user, name) -> region

    def _require(self, error=Unsupported) -> None:
        if not self.allowed:
            raise error(DISABLED)

    def client(self, user: Callable[[], int | None]) -> "ClientRegions":
        """The regions of the client whose local user `user()` gives (asked once, when first needed)."""
        return ClientRegions(self, user)

    def register(self, name: str, key: str, offset: int, byte_size: int, prefix: str = SHM_PREFIX, *,
                 user: int | None) -> None:
        """`user`'s region `name`: `byte_size` bytes from `offset` of object `key`, which must start
        with `prefix` and be `user`'s."""
        self._require()
        if user is None:
            raise InvalidInput(f"cannot register shared memory region {name!r}: system shared memory is for clients "
                               "on the server's host, and this connection has no local user")
        if not name:
            raise InvalidInput("a shared memory region needs a name")
        if not isinstance(key, str):
            raise InvalidInput(f"shared memory region {name!r}: key must be a shared memory object's name "
                               f"(like '/input0'), got {key!r}")
        if (user, name) in self.regions:
            raise InvalidInput(f"shared memory region {name!r} is already registered "
                               f"({self.regions[user, name].status()}); unregister it first")
        held = sum(1 for owner, _ in self.regions if owner == user)
        if held >= MAX_REGIONS_PER_USER or len(self.regions) >= MAX_REGIONS:
            whose = (f"this client's user holds {held} regions, the most one user may ({MAX_REGIONS_PER_USER})"
                     if held >= MAX_REGIONS_PER_USER else f"the server holds {len(self.regions)} regions, its most")
            raise InvalidInput(f"cannot register shared memory region {name!r}: {whose}; unregister some first")
        self.regions[user, name] = Region(name, key, _count(offset, "offset"), _count(byte_size, "byte_size"), prefix,
                                          user)

    def unregister(self, name: str = "", *, user: int | None) -> None:
        """Forget `user`'s region `name`, or every region of `user` when `name` is empty."""
        self._require()
        if name:
            self.regions.pop((user, name), None)
        else:
            for mine in [k for k in self.regions if k[0] == user]:
                del self.regions[mine]

    def status(self, name: str = "", *, user: int | None) -> list[dict]:
        """`user`'s region `name`, or all of them (none while client shared memory is off, as Triton answers)."""
        if name:
            return [self._region(name, user).status()]
        return [region.status() for (owner, _), region in self.regions.items() if owner == user]

    def close(self) -> None:
        """Forget every region (the server stops)."""
        self.regions.clear()

    def _region(self, name: str, user: int | None) -> Region:
        region = self.regions.get((user, name))
        if region is None:
            known = ", ".join(repr(n) for owner, n in self.regions if owner == user) or "none"
            raise InvalidInput(f"unknown shared memory region {name!r}; registered: {known}")
        return region

    def slice(self, tensor: str, ref: TensorRef, *, user: int | None) -> Slice:
        """The place `ref` names for `tensor` in `user`'s regions, checked to lie within its region."""
        self._require(InvalidInput)
        region = self._region(ref.region, user)
        if ref.offset + ref.byte_size > region.byte_size:
            raise InvalidInput(f"tensor {tensor}: shared_memory_offset {ref.offset} + shared_memory_byte_size "
                               f"{ref.byte_size} runs past the end of region {ref.region!r} ({region.byte_size} bytes)")
        return Slice(region, ref.offset, ref.byte_size)


class ClientRegions:
    """SharedMemory as one client sees it: its local user's regions. The user is looked up (it
    reads the kernel's socket tables) only when a request names shared memory."""

    def __init__(self, shared: SharedMemory, user: Callable[[], int | None]):
        self.shared, self._lookup, self._user, self._known = shared, user, None, False

    @property
    def allowed(self) -> bool:
        return self.shared.allowed

    def user(self) -> int | None:
        """The client's local user, looked up on first use (each method checks that shared memory
        is on before it asks: a server without it reads no socket table)."""
        if not self._known:
            self._user, self._known = self._lookup(), True
        return self._user

    def register(self, name: str, key: str, offset: int, byte_size: int, prefix: str = SHM_PREFIX) -> None:
        self.shared._require()
        self.shared.register(name, key, offset, byte_size, prefix, user=self.user())

    def unregister(self, name: str = "") -> None:
        self.shared._require()
        self.shared.unregister(name, user=self.user())

    def status(self, name: str = "") -> list[dict]:
        if not self.shared.allowed and not name:
            return []
        return self.shared.status(name, user=self.user())

    def slice(self, tensor: str, ref: TensorRef) -> Slice:
        self.shared._require(InvalidInput)
        return self.shared.slice(tensor, ref, user=self.user())


def cuda_status(name: str = "") -> list[dict]:
    """CUDA shared memory regions: none (see CUDA)."""
    if name:
        raise InvalidInput(f"unknown CUDA shared memory region {name!r}: none is registered ({CUDA})")
    return []


def cuda_register(name: str) -> None:
    raise Unsupported(f"cannot register CUDA shared memory region {name!r}: {CUDA}")
