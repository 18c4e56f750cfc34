"""The egress proxy's relay (egress_conn.relay): every byte both ways, in order, each end
passed on, and nothing of it left open when it returns."""
from __future__ import annotations

import os
import socket
import threading

from lcp_sandbox.backends.local.confine import egress_conn

SIZE = 8 << 20


def _open_fds() -> set[int]:
    return {int(fd) for fd in os.listdir("/proc/self/fd")}


def _relayed(client_bytes: bytes, server_bytes: bytes) -> tuple[bytes, bytes]:
    """A relay between two socket pairs, the tool's and the server's: what the server read
    of what the tool wrote, and what the tool read of what the server wrote (each shuts its
    end for writing after its bytes)."""
    tool, proxy_client = socket.socketpair()
    proxy_upstream, server = socket.socketpair()
    relay = threading.Thread(target=egress_conn.relay, args=(proxy_client, proxy_upstream))
    relay.start()
    read: dict[str, bytes] = {}

    def side(name: str, sock: socket.socket, data: bytes) -> None:
        reader = threading.Thread(target=lambda: read.__setitem__(name, _read_all(sock)))
        reader.start()
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        reader.join(60)

    threads = [threading.Thread(target=side, args=("tool", tool, client_bytes)),
               threading.Thread(target=side, args=("server", server, server_bytes))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    relay.join(60)
    assert not relay.is_alive()
    for sock in (tool, proxy_client, proxy_upstream, server):
        sock.close()
    return read["server"], read["tool"]


def _read_all(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


def test_every_byte_both_ways_in_order_and_each_end_passed_on():
    up, down = os.urandom(SIZE), os.urandom(SIZE // 2)
    got_up, got_down = _relayed(up, down)
    assert got_up == up and got_down == down


class _Counted(threading.BoundedSemaphore):
    """The host's large buffers, counting those taken."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.taken = 0

    def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool:
        got = super().acquire(blocking, timeout)
        self.taken += got
        return got


def test_a_bulk_direction_moves_large_reads_while_the_host_has_one_free_and_gives_it_back(
        monkeypatch):
    """Both directions fill a read (8 and 4 MiB): each takes one of the host's LARGE_WAYS and
    gives it back at the end; with none free, every byte still passes, a CHUNK at a time."""
    large = _Counted(2)
    monkeypatch.setattr(egress_conn, "_LARGE", large)
    up, down = os.urandom(SIZE), os.urandom(SIZE // 2)
    assert _relayed(up, down) == (up, down)
    assert large.taken == 2 and large._value == 2
    assert large.acquire(blocking=False) and large.acquire(blocking=False)
    large.taken = 0
    assert _relayed(up, down) == (up, down)
    assert large.taken == 0 and large._value == 0


# In a process of its own: the test session's other threads (the Ray cluster's client)
# open and close descriptors of their own at any moment.
_LEFT_OPEN = """
import os, sys
sys.path.insert(0, sys.argv[1])
import test_egress_relay as t
before = t._open_fds()
up, down = os.urandom(1 << 20), os.urandom(1 << 19)
assert t._relayed(up, down) == (up, down)
print(sorted(t._open_fds() - before))
"""


def test_the_relay_leaves_no_descriptor_open():
    """The four sockets are closed by the test; the relay opened nothing that stays."""
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", _LEFT_OPEN, os.path.dirname(__file__)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
