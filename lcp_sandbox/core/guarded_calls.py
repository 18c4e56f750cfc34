"""The host's guard of processes, what both of its sides agree on: the calls it decides,
the handshake, and how stats() say processes are the guard's.  The worker's filter is
worker/confine/guard.py, the host's decisions backends/local/confine/pid_guard.py.
"""
from __future__ import annotations

#: The calls that always ask the host (their pid is never the caller's by value alone).
ASK = ("kill", "tkill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo", "pidfd_open",
       "process_vm_readv", "process_vm_writev", "kcmp", "move_pages", "migrate_pages")
#: The calls whose argument 0 is a pid: 0 (the caller) allowed here, else the host asked.
ASK_UNLESS_SELF = ("getpgid", "getsid", "sched_getaffinity", "sched_getparam",
                   "sched_getscheduler", "sched_getattr", "sched_rr_get_interval",
                   "get_robust_list")
#: The calls whose argument 1 is a pid ("who"): 0 allowed here.
ASK_UNLESS_WHO_SELF = ("getpriority", "ioprio_get")
#: Every call the host decides (pid_guard.py answers each by name).
GUARDED = (*ASK, *ASK_UNLESS_SELF, *ASK_UNLESS_WHO_SELF, "ptrace", "fcntl")
#: The handshake's call: kill(its own pid, 0).
HANDSHAKE = "kill"
#: How stats() say processes are the guard's (the host keeps it only when it holds the
#: worker's listener: backends/local/confine/pid_guard.py vouched()).
REPORT_START = "on (the host's guard (seccomp user notification)"
REPORT = (REPORT_START + ": signals, pidfds, SIGIO owners, and the other calls that name a "
          "process reach only its own process tree, each decided by the host; no PID "
          "namespace, Landlock scope nor uid of its own)")
