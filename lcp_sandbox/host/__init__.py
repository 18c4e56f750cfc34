"""What runs in the host: the binding, the worker processes and their slots, the
watchdog, the host-object table, the zygote client, the output pump, the pool.

Nothing here imports lcp_sandbox.worker: the two sides meet only through
lcp_sandbox.protocol (and share the pure lcp_sandbox.core)."""
