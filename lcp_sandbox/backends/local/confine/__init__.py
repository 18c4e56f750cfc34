"""What the host sets up around a confined worker, before it starts and while it runs.

The worker applies its own confinement (worker/confine/); the host makes what that
confinement stands on, and gives it back when the worker or its tenant is gone:

    handover.py     a confinement root made the worker's
    temp_dirs.py    its temp dir: made and given through descriptors, one made ahead
    confined.py     confined templates: which confined workers may share one, their INIT
    tenant_uids.py  run_as="per-tenant": a uid of its own per tenant, kept, given back
    uid_record.py   the record of given uids, one for the whole machine, under a lock
    sweep.py        what a uid left, removed before it serves another tenant (or retired)
    extras.py       what a confined worker may get beyond its root: disk, cgroup, egress
    cgroups.py      a confined worker's pids cgroup (max_processes)
    disks.py        a tenant's root as a file system of its own (disk_mb)
    egress_proxy.py the egress proxy of network policies: dialers, caps, decisions
    egress_accept.py its threads: each accepts a connection and serves it
    egress_conn.py  one connection through the egress proxy: head, decision, relay
    egress_port.py  the egress proxy by port, for workers with no network namespace
    egress_secrets.py secrets on the way out: TLS for the bound hosts, placeholders swapped
    egress_tls.py     an intercepted connection's two TLS ends in memory, relayed in large pieces
    pid_guard.py    the guard of processes where all tenants share one uid (seccomp notify)
"""
