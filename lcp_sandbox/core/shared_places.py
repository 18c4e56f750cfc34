"""The places every uid may write on a usual Linux system (a container's image too).

One list for both halves of one promise, so that a place added here is both checked and
swept, and none can be forgotten in one of them:

    worker/confine/apart.py           a worker holding a uid of its tenant's own, without
                                      Landlock, checks each is sticky before any tool runs
                                      (no uid removes or renames another's files there)
    backends/local/confine/sweep.py   what a uid left in each is removed before that uid
                                      serves another tenant (else the uid is retired)

/dev/mqueue holds the POSIX message queues (where it is mounted); the host's own temp dir
(tempfile.gettempdir(), where the workers' private temp dirs are made) is swept too.
"""
from __future__ import annotations

#: Folders writable by every uid: /var/lock is a link to /run/lock.
SHARED_WRITABLE = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/dev/mqueue")
