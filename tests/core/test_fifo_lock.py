"""The slot's FifoLock: granted in arrival order; uncontended, it is one plain lock."""
from __future__ import annotations

import threading

from lcp_sandbox.backends.local.slot import FifoLock


def _queued(lock: FifoLock, n: int) -> None:
    while len(lock._waiters) < n:       # (the waiter is parked on its gate)
        threading.Event().wait(0.001)


def test_waiters_get_the_lock_in_arrival_order():
    lock = FifoLock()
    assert lock.acquire()
    order: list[int] = []

    def take(i: int) -> None:
        with lock:
            order.append(i)

    threads = []
    for i in range(4):
        t = threading.Thread(target=take, args=(i,))
        t.start()
        _queued(lock, i + 1)
        threads.append(t)
    # a late caller while others wait goes behind them, not through the fast path
    late = threading.Thread(target=take, args=(4,))
    late.start()
    _queued(lock, 5)
    lock.release()
    for t in threads + [late]:
        t.join(10)
    assert order == [0, 1, 2, 3, 4]
    assert lock.acquire(timeout=0)       # free again, uncontended
    lock.release()


def test_a_waiter_that_times_out_leaves_the_queue():
    lock = FifoLock()
    assert lock.acquire()
    assert not lock.acquire(timeout=0.01)
    assert not lock._waiters
    lock.release()
    assert lock.acquire(timeout=0)
    assert not lock.acquire(timeout=0)
    lock.release()
