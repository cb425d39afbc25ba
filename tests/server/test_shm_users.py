"""System shared memory belongs to local users (server/kserve/local_user.py, shared_memory.py): a
client registers only objects its user owns, and sees, uses and unregisters only its own user's
regions. The kernel's socket tables say which user a connection's client is."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import uuid

import pytest
import tritonclient.utils.shared_memory as shm

from boundgen.server.kserve.local_user import diag_owner, socket_owner

OTHER_UID = 65534  # nobody


def test_the_owner_of_a_clients_socket_is_its_user():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        with socket.create_connection(listener.getsockname()) as client:
            connection, peer = listener.accept()
            with connection:
                assert peer == client.getsockname()
                assert socket_owner(*peer) == os.geteuid()
    assert socket_owner("127.0.0.1", peer[1]) is None  # closed: no such socket any more
    assert socket_owner("203.0.113.9", 40000) is None  # another host's client: not in this host's tables


def test_the_kernel_names_a_connections_owner_by_its_four_addresses(tmp_path):
    """diag_owner asks NETLINK_SOCK_DIAG for the one socket (microseconds where the tables take
    milliseconds); it agrees with the tables, finds nothing for a closed connection or a wrong server
    end, and socket_owner falls back to the tables where it finds nothing."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        server = listener.getsockname()
        with socket.create_connection(server):
            connection, peer = listener.accept()
            with connection:
                found = diag_owner(*peer, *server)
                if found is None:
                    pytest.skip("no NETLINK_SOCK_DIAG here: the tables alone")
                assert found == os.geteuid() == socket_owner(*peer)
                assert diag_owner(*peer, server[0], server[1] + 1 or 1) is None  # another server end: none
                assert diag_owner(f"::ffff:{peer[0]}", peer[1], f"::ffff:{server[0]}", server[1]) == found  # dual-stack
                empty = tmp_path / "empty"
                empty.write_text("header\n")
                assert socket_owner(*peer, tables=(str(empty),), server=server) == found  # not the tables'
                assert socket_owner(*peer, server=(server[0], server[1] + 1 or 1)) == found  # the tables'
    assert diag_owner(*peer, *server) is None  # closed


def test_the_tables_are_read_in_the_hosts_byte_order(tmp_path):
    """Rows as the kernel writes them on a little-endian host: 127.0.0.1:40000 (uid 1000) in
    tcp, ::1:40001 (uid 1001) and ::ffff:127.0.0.1:40002 (uid 1002) in tcp6; two users listing
    one address and port is no answer."""
    if sys.byteorder != "little":
        pytest.skip("the rows below are a little-endian host's")
    head = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
    tcp, tcp6 = tmp_path / "tcp", tmp_path / "tcp6"
    tcp.write_text(head + "   0: 0100007F:9C40 0100007F:1F90 01 00000000:00000000 00:00000000 00000000  1000        0 1\n"
                   + "   1: 0100007F:9C43 0100007F:1F90 01 00000000:00000000 00:00000000 00000000  1003        0 2\n")
    tcp6.write_text(head + "   0: 00000000000000000000000001000000:9C41 00000000000000000000000001000000:1F90 01 "
                    "00000000:00000000 00:00000000 00000000  1001        0 3\n"
                    + "   1: 0000000000000000FFFF00000100007F:9C42 0000000000000000FFFF00000100007F:1F90 01 "
                    "00000000:00000000 00:00000000 00000000  1002        0 4\n"
                    + "   2: 0000000000000000FFFF00000100007F:9C43 0000000000000000FFFF00000100007F:1F90 01 "
                    "00000000:00000000 00:00000000 00000000  1004        0 5\n")
    tables = (str(tcp), str(tcp6))
    assert socket_owner("127.0.0.1", 40000, tables) == 1000
    assert socket_owner("::ffff:127.0.0.1", 40000, tables) == 1000
    assert socket_owner("::1", 40001, tables) == 1001
    assert socket_owner("127.0.0.1", 40002, tables) == 1002
    assert socket_owner("127.0.0.1", 40003, tables) is None  # uid 1003 and 1004: ambiguous
    assert socket_owner("127.0.0.1", 40004, tables) is None


# The other user's client: stdlib only, loaded by one request before it drops to that user (the
# interpreter's files may not be readable by it). Prints one JSON object of what it saw.
OTHER_CLIENT = textwrap.dedent("""
    import http.client, json, os, sys
    port, mine, theirs, their_key = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    def call(method, path, body=None):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request(method, path, json.dumps(body) if body is not None else None,
                     {{"Content-Type": "application/json"}})
        answer = conn.getresponse()
        return answer.status, json.loads(answer.read() or b"null")
    call("GET", "/v2/health/live")  # loads what a request needs (codecs), while the files are readable
    os.setgid({uid}); os.setuid({uid})
    out = {{}}
    out["status"] = call("GET", "/v2/systemsharedmemory/status")
    out["status_theirs"] = call("GET", f"/v2/systemsharedmemory/region/{{theirs}}/status")
    out["register_their_object"] = call("POST", f"/v2/systemsharedmemory/region/{{mine}}/register",
                                        {{"key": their_key, "offset": 0, "byte_size": 64}})
    out["infer_from_theirs"] = call("POST", "/v2/models/fscore/infer", {{"inputs": [{{
        "name": "TEXT", "datatype": "BYTES", "shape": [1],
        "parameters": {{"shared_memory_region": theirs, "shared_memory_byte_size": 64}}}}]}})
    out["unregister_all"] = call("POST", "/v2/systemsharedmemory/unregister")
    print(json.dumps(out))
""").format(uid=OTHER_UID)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root, to run a client as another user")
def test_another_user_can_neither_see_use_nor_unregister_a_region_nor_register_the_object(shm_server):
    name, theirs = f"r{uuid.uuid4().hex[:12]}", f"r{uuid.uuid4().hex[:12]}"
    key = f"/boundgen-{name}"
    handle = shm.create_shared_memory_region(name, key, 64, create_only=True)
    try:
        os.chmod(f"/dev/shm/{key[1:]}", 0o600)
        import tritonclient.http as thttp

        client = thttp.InferenceServerClient(shm_server.http_url)
        client.register_system_shared_memory(theirs, key, 64)
        done = subprocess.run([sys.executable, "-c", OTHER_CLIENT, str(shm_server.http_port), name, theirs, key],
                              capture_output=True, text=True, timeout=60, cwd="/")
        assert done.returncode == 0, done.stderr
        seen = json.loads(done.stdout)
        assert seen["status"] == [200, []]
        assert seen["status_theirs"][0] == 400 and "unknown shared memory region" in seen["status_theirs"][1]["error"]
        assert seen["register_their_object"][0] == 400
        assert "belongs to another user" in seen["register_their_object"][1]["error"]
        assert seen["infer_from_theirs"][0] == 400
        assert "unknown shared memory region" in seen["infer_from_theirs"][1]["error"]
        assert seen["unregister_all"][0] == 200
        # The owner's region is untouched by all of it.
        assert [r["name"] for r in client.get_system_shared_memory_status()] == [theirs]
        client.unregister_system_shared_memory(theirs)
    finally:
        shm.destroy_shared_memory_region(handle)


def test_a_grpc_calls_server_end_is_known_only_for_one_listening_address():
    from boundgen.server.kserve.local_user import listening_end

    assert listening_end("127.0.0.1", 8001) == ("127.0.0.1", 8001)
    assert listening_end("::1", 8001) == ("::1", 8001)
    for host in ("0.0.0.0", "::", "localhost"):  # every address, or a name: the tables
        assert listening_end(host, 8001) is None
    assert listening_end("127.0.0.1", 0) is None  # not bound yet
