"""What a worker's dialer to the host's egress proxy carries, beyond its token's line.

    worker ──LISTENER with a socket (SCM_RIGHTS) ────► proxy   (in its own network namespace)
                                                               its listener, once: the proxy
                                                               accepts and serves on it
    worker ──ASK_PORT ───────────────────────────────► proxy   (sent by port) the by-port
    worker ◄─the port, in ASCII digits, "\\n" ───────── proxy   listener's port; "0": the host
                                                               did not send this worker by port
    worker ──ASK_SOCKET ─────────────────────────────► proxy   a new TCP socket
    worker ◄─A_SOCKET with it (SCM_RIGHTS), or NO_SOCKET ─ proxy   (likewise)

Which of the two ways a worker comes, the host decided and recorded with its token; nothing
on the dialer changes it, and a descriptor sent with anything but LISTENER is closed unread.

The worker is hostile: the proxy answers what it understands and passes over the rest
(backends/local/confine/egress_proxy.py, egress_port.py); worker/confine/egress_dial.py asks.
"""
LISTENER = b"l"
ASK_PORT = b"p"
ASK_SOCKET = b"s"
A_SOCKET = b"s"
NO_SOCKET = b"n"
