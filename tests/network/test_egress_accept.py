"""The egress proxy's serving threads (egress_accept.Acceptors): the thread that accepts a
connection serves it, none waits for another's, the idle ones are bounded, and close()
leaves no thread, listener or descriptor behind."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading

import pytest
from conftest import poll

from lcp_sandbox.backends.local.confine import egress_accept
from lcp_sandbox.backends.local.confine.egress_accept import Acceptors


class Held:
    """A serve() that records which thread serves each connection, and holds it until
    released."""

    def __init__(self) -> None:
        self.threads: list[int] = []
        self.release = threading.Event()
        self.lock = threading.Lock()

    def __call__(self, conn: socket.socket, peer) -> None:
        with self.lock:
            self.threads.append(threading.get_ident())
        with conn:
            self.release.wait(30)
            conn.sendall(b"served")


@pytest.fixture
def acceptors():
    a = Acceptors()
    yield a
    a.close()


def test_connections_at_once_are_each_served_by_a_thread_of_their_own(acceptors):
    """Five connections held open at once: five threads serve them, and one more waits,
    so a sixth is accepted and served without waiting for any of them."""
    held = Held()
    listener = socket.create_server(("127.0.0.1", 0))
    acceptors.add(listener, held)
    clients = [socket.create_connection(listener.getsockname(), timeout=20) for _ in range(5)]
    assert poll(lambda: len(held.threads) == 5)
    assert len(set(held.threads)) == 5
    assert poll(lambda: acceptors._waiting >= 1)
    held.release.set()
    assert [c.recv(10) for c in clients] == [b"served"] * 5


def test_done_threads_beyond_the_waiting_bound_end(acceptors, monkeypatch):
    monkeypatch.setattr(egress_accept, "MAX_WAITING", 2)
    held = Held()
    listener = socket.create_server(("127.0.0.1", 0))
    acceptors.add(listener, held)
    clients = [socket.create_connection(listener.getsockname(), timeout=20) for _ in range(6)]
    assert poll(lambda: len(held.threads) == 6)
    assert acceptors._alive >= 7
    held.release.set()
    assert [c.recv(10) for c in clients] == [b"served"] * 6
    assert poll(lambda: acceptors._alive == 2 and acceptors._waiting == 2), acceptors._alive


def test_a_serve_that_raises_is_logged_its_connection_closed_and_the_next_served(acceptors,
                                                                                 caplog):
    calls = []

    def serve(conn: socket.socket, peer) -> None:
        calls.append(peer)
        if len(calls) == 1:
            raise RuntimeError("a bug")
        with conn:
            conn.sendall(b"second")
    listener = socket.create_server(("127.0.0.1", 0))
    acceptors.add(listener, serve)
    with socket.create_connection(listener.getsockname(), timeout=20) as first:
        assert first.recv(10) == b""
    with socket.create_connection(listener.getsockname(), timeout=20) as second:
        assert second.recv(10) == b"second"
    assert "serving a connection failed" in caplog.text and "a bug" in caplog.text


def two_listeners(acceptors) -> tuple[socket.socket, socket.socket]:
    """Two listeners the threads accept on, each connection answered at once."""
    held = Held()
    held.release.set()
    first, kept = (socket.create_server(("127.0.0.1", 0)) for _ in range(2))
    acceptors.add(first, held)
    acceptors.add(kept, held)
    return first, kept


def still_served(kept: socket.socket) -> bool:
    with socket.create_connection(kept.getsockname(), timeout=20) as c:
        return c.recv(10) == b"served"


def test_a_removed_listener_is_closed_and_the_others_still_served(acceptors):
    gone, kept = two_listeners(acceptors)
    address = gone.getsockname()
    acceptors.remove(gone)
    assert gone.fileno() == -1
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(address, timeout=20)
    assert still_served(kept)


def test_a_listener_that_no_longer_listens_is_dropped_and_the_others_still_served(acceptors):
    """Shut down through a copy of it, a listener stops listening: each epoll wake-up for it
    fails (EINVAL); re-armed, a thread would wake for it for ever.  It is dropped."""
    stopped, kept = two_listeners(acceptors)
    copy = stopped.dup()
    copy.shutdown(socket.SHUT_RD)
    assert poll(lambda: stopped.fileno() == -1)
    assert len(acceptors._listeners) == 1
    assert still_served(kept)
    copy.close()


_SHORT_OF_DESCRIPTORS = """
import logging, os, socket, sys, time
logging.basicConfig(level=logging.WARNING)
sys.path.insert(0, sys.argv[1])
from conftest import poll
from lcp_sandbox.backends.local.confine.egress_accept import RETRY_S, Acceptors
class Counting(socket.socket):
    tries = []
    def accept(self):
        self.tries.append(time.monotonic())
        return super().accept()
listener = Counting(socket.AF_INET, socket.SOCK_STREAM)
listener.bind(("127.0.0.1", 0))
listener.listen()
served = []
a = Acceptors()
a.add(listener, lambda conn, peer: (served.append(peer), conn.close()))
client = socket.socket()
fillers = []
try:
    while True:
        fillers.append(os.open("/dev/null", os.O_RDONLY))
except OSError:
    pass
client.connect(listener.getsockname())
assert poll(lambda: len(Counting.tries) >= 3), Counting.tries
gaps = [b - a for a, b in zip(Counting.tries, Counting.tries[1:3])]
for fd in fillers:
    os.close(fd)
assert poll(lambda: served)
print(min(gaps) >= 0.9 * RETRY_S, not served[1:])
"""


def test_short_of_descriptors_a_waiting_connection_is_tried_again_later_then_served():
    """accept() fails with EMFILE and the connection stays queued: the listener is armed
    again RETRY_S later, not at once (a thread would wake for it again and again), said
    once in the log, and the connection is served once descriptors are free."""
    tests = os.path.dirname(os.path.dirname(__file__))
    out = subprocess.run([sys.executable, "-c", _SHORT_OF_DESCRIPTORS, tests],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True"], out
    assert out.stderr.count("connections wait, not accepted") == 1, out.stderr


# In a process of its own: the test session's other threads open and close descriptors
_CLOSED = """
import os, socket, sys, threading
sys.path.insert(0, sys.argv[1])
from conftest import poll
from lcp_sandbox.backends.local.confine.egress_accept import Acceptors
before = {int(fd) for fd in os.listdir("/proc/self/fd")}
a = Acceptors()
release = threading.Event()
def serve(conn, peer):
    with conn:
        release.wait(30)
listeners = [socket.create_server(("127.0.0.1", 0)) for _ in range(3)]
for l in listeners:
    a.add(l, serve)
clients = [socket.create_connection(l.getsockname(), timeout=20) for l in listeners]
assert poll(lambda: a._alive >= 4)
a.close()
assert all(l.fileno() == -1 for l in listeners)
assert poll(lambda: a._alive == 3)            # the waiting ones ended; three serve
release.set()
for c in clients:
    c.close()
assert poll(lambda: a._alive == 0)
assert poll(lambda: not [t for t in threading.enumerate() if t.name == "lcp-sandbox-egress-conn"])
print(sorted({int(fd) for fd in os.listdir("/proc/self/fd")} - before))
"""


def test_close_ends_every_thread_and_leaves_no_descriptor_open():
    """Waiting threads end at close(), serving ones when their connection ends; the last
    one out closes the epoll set: no listener, thread or descriptor is left."""
    tests = os.path.dirname(os.path.dirname(__file__))
    out = subprocess.run([sys.executable, "-c", _CLOSED, tests], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
