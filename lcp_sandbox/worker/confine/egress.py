"""A confined worker with a network policy: its relay to the host's egress proxy.

In the worker's own network namespace (loopback only), before it confines itself:

    relay_to_proxy()   connects to the host's proxy socket (a unix socket, reachable now;
                       the system call filter refuses new unix sockets later) and sends its
                       token; listens on 127.0.0.1 (an ephemeral port of its own namespace);
                       announces it as HTTP_PROXY, HTTPS_PROXY, ALL_PROXY (and their lower-
                       case forms; NO_PROXY empty), so HTTP clients use it unchanged
    start_relay()      (once the worker is confined: a second thread would keep the
                       capabilities the drop takes from the first) the relay thread: it
                       accepts and hands each accepted socket itself to the proxy
                       (SCM_RIGHTS): no byte of the traffic passes through the worker again

The proxy (backends/local/egress.py) decides; this side holds nothing a tool could bend: a
tool that uses the dialer itself only reaches the same proxy under the same policy.
"""
from __future__ import annotations

import os
import socket
import threading

_PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")
_READY: list[tuple[socket.socket, socket.socket]] = []      # (listener, dialer) to relay


def relay_to_proxy(egress: dict, rules: int) -> str:
    """Dial the proxy, start the relay thread, announce the proxy: what stats() says."""
    try:
        dialer = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        dialer.connect(egress["socket"])
        dialer.sendall(egress["token"].encode("ascii") + b"\n")
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind(("127.0.0.1", 0))
        listener.listen(128)
    except OSError as exc:
        return f"unavailable (the host's egress proxy cannot be reached: {exc})"
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    for name in _PROXY_VARIABLES:
        os.environ[name] = os.environ[name.lower()] = url
    os.environ["NO_PROXY"] = os.environ["no_proxy"] = ""
    _READY[:] = [(listener, dialer)]
    return (f"policy ({rules} rules: own network namespace, loopback only; egress only "
            f"through the host's proxy, {url})")


def start_relay() -> None:
    """Start the relay relay_to_proxy() prepared, if it did."""
    for listener, dialer in _READY:
        threading.Thread(target=_relay, args=(listener, dialer), name="lcp-sandbox-egress-relay",
                         daemon=True).start()
    _READY.clear()


def _relay(listener: socket.socket, dialer: socket.socket) -> None:
    """Hand each connection to the proxy; when the proxy is gone, stop listening (a client
    then fails at once rather than wait)."""
    with listener, dialer:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                try:
                    socket.send_fds(dialer, [b"c"], [conn.fileno()], socket.MSG_NOSIGNAL)
                except OSError:
                    return
