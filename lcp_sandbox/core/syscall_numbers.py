"""System call numbers of the two architectures a confined worker is filtered on.

Facts of the Linux ABI: the kernel's syscall_64.tbl for x86_64 and the generic table
(include/uapi/asm-generic/unistd.h) that aarch64 uses; numbers 424 and above are the
same on both.  Written here as data (name=x86_64/aarch64, "-" where the architecture
has no such call), so a name in a setting can be checked without a C library.
Kernel 6.18 (file_setattr, 469) is the newest call listed.
"""
from __future__ import annotations

from typing import Optional

ARCHES = ("x86_64", "aarch64")

_TABLE = """
read=0/63 write=1/64 open=2/- close=3/57 stat=4/- fstat=5/80 lstat=6/- poll=7/- lseek=8/62
mmap=9/222 mprotect=10/226 munmap=11/215 brk=12/214 rt_sigaction=13/134 rt_sigprocmask=14/135
rt_sigreturn=15/139 ioctl=16/29 pread64=17/67 pwrite64=18/68 readv=19/65 writev=20/66
access=21/- pipe=22/- select=23/- sched_yield=24/124 mremap=25/216 msync=26/227 mincore=27/232
madvise=28/233 shmget=29/194 shmat=30/196 shmctl=31/195 dup=32/23 dup2=33/- pause=34/-
nanosleep=35/101 getitimer=36/102 alarm=37/- setitimer=38/103 getpid=39/172 sendfile=40/71
socket=41/198 connect=42/203 accept=43/202 sendto=44/206 recvfrom=45/207 sendmsg=46/211
recvmsg=47/212 shutdown=48/210 bind=49/200 listen=50/201 getsockname=51/204 getpeername=52/205
socketpair=53/199 setsockopt=54/208 getsockopt=55/209 clone=56/220 fork=57/- vfork=58/-
execve=59/221 exit=60/93 wait4=61/260 kill=62/129 uname=63/160 semget=64/190 semop=65/193
semctl=66/191 shmdt=67/197 msgget=68/186 msgsnd=69/189 msgrcv=70/188 msgctl=71/187 fcntl=72/25
flock=73/32 fsync=74/82 fdatasync=75/83 truncate=76/45 ftruncate=77/46 getdents=78/-
getcwd=79/17 chdir=80/49 fchdir=81/50 rename=82/- mkdir=83/- rmdir=84/- creat=85/- link=86/-
unlink=87/- symlink=88/- readlink=89/- chmod=90/- fchmod=91/52 chown=92/- fchown=93/55
lchown=94/- umask=95/166 gettimeofday=96/169 getrlimit=97/163 getrusage=98/165 sysinfo=99/179
times=100/153 ptrace=101/117 getuid=102/174 syslog=103/116 getgid=104/176 setuid=105/146
setgid=106/144 geteuid=107/175 getegid=108/177 setpgid=109/154 getppid=110/173 getpgrp=111/-
setsid=112/157 setreuid=113/145 setregid=114/143 getgroups=115/158 setgroups=116/159
setresuid=117/147 getresuid=118/148 setresgid=119/149 getresgid=120/150 getpgid=121/155
setfsuid=122/151 setfsgid=123/152 getsid=124/156 capget=125/90 capset=126/91
rt_sigpending=127/136 rt_sigtimedwait=128/137 rt_sigqueueinfo=129/138 rt_sigsuspend=130/133
sigaltstack=131/132 utime=132/- mknod=133/- uselib=134/- personality=135/92 ustat=136/-
statfs=137/43 fstatfs=138/44 sysfs=139/- getpriority=140/141 setpriority=141/140
sched_setparam=142/118 sched_getparam=143/121 sched_setscheduler=144/119
sched_getscheduler=145/120 sched_get_priority_max=146/125 sched_get_priority_min=147/126
sched_rr_get_interval=148/127 mlock=149/228 munlock=150/229 mlockall=151/230 munlockall=152/231
vhangup=153/58 modify_ldt=154/- pivot_root=155/41 _sysctl=156/- prctl=157/167 arch_prctl=158/-
adjtimex=159/171 setrlimit=160/164 chroot=161/51 sync=162/81 acct=163/89 settimeofday=164/170
mount=165/40 umount2=166/39 swapon=167/224 swapoff=168/225 reboot=169/142 sethostname=170/161
setdomainname=171/162 iopl=172/- ioperm=173/- create_module=174/- init_module=175/105
delete_module=176/106 get_kernel_syms=177/- query_module=178/- quotactl=179/60 nfsservctl=180/42
getpmsg=181/- putpmsg=182/- afs_syscall=183/- tuxcall=184/- security=185/- gettid=186/178
readahead=187/213 setxattr=188/5 lsetxattr=189/6 fsetxattr=190/7 getxattr=191/8 lgetxattr=192/9
fgetxattr=193/10 listxattr=194/11 llistxattr=195/12 flistxattr=196/13 removexattr=197/14
lremovexattr=198/15 fremovexattr=199/16 tkill=200/130 time=201/- futex=202/98
sched_setaffinity=203/122 sched_getaffinity=204/123 set_thread_area=205/- io_setup=206/0
io_destroy=207/1 io_getevents=208/4 io_submit=209/2 io_cancel=210/3 get_thread_area=211/-
lookup_dcookie=212/18 epoll_create=213/- epoll_ctl_old=214/- epoll_wait_old=215/-
remap_file_pages=216/234 getdents64=217/61 set_tid_address=218/96 restart_syscall=219/128
semtimedop=220/192 fadvise64=221/223 timer_create=222/107 timer_settime=223/110
timer_gettime=224/108 timer_getoverrun=225/109 timer_delete=226/111 clock_settime=227/112
clock_gettime=228/113 clock_getres=229/114 clock_nanosleep=230/115 exit_group=231/94
epoll_wait=232/- epoll_ctl=233/21 tgkill=234/131 utimes=235/- vserver=236/- mbind=237/235
set_mempolicy=238/237 get_mempolicy=239/236 mq_open=240/180 mq_unlink=241/181
mq_timedsend=242/182 mq_timedreceive=243/183 mq_notify=244/184 mq_getsetattr=245/185
kexec_load=246/104 waitid=247/95 add_key=248/217 request_key=249/218 keyctl=250/219
ioprio_set=251/30 ioprio_get=252/31 inotify_init=253/- inotify_add_watch=254/27
inotify_rm_watch=255/28 migrate_pages=256/238 openat=257/56 mkdirat=258/34 mknodat=259/33
fchownat=260/54 futimesat=261/- newfstatat=262/79 unlinkat=263/35 renameat=264/38 linkat=265/37
symlinkat=266/36 readlinkat=267/78 fchmodat=268/53 faccessat=269/48 pselect6=270/72 ppoll=271/73
unshare=272/97 set_robust_list=273/99 get_robust_list=274/100 splice=275/76 tee=276/77
sync_file_range=277/84 vmsplice=278/75 move_pages=279/239 utimensat=280/88 epoll_pwait=281/22
signalfd=282/- timerfd_create=283/85 eventfd=284/- fallocate=285/47 timerfd_settime=286/86
timerfd_gettime=287/87 accept4=288/242 signalfd4=289/74 eventfd2=290/19 epoll_create1=291/20
dup3=292/24 pipe2=293/59 inotify_init1=294/26 preadv=295/69 pwritev=296/70
rt_tgsigqueueinfo=297/240 perf_event_open=298/241 recvmmsg=299/243 fanotify_init=300/262
fanotify_mark=301/263 prlimit64=302/261 name_to_handle_at=303/264 open_by_handle_at=304/265
clock_adjtime=305/266 syncfs=306/267 sendmmsg=307/269 setns=308/268 getcpu=309/168
process_vm_readv=310/270 process_vm_writev=311/271 kcmp=312/272 finit_module=313/273
sched_setattr=314/274 sched_getattr=315/275 renameat2=316/276 seccomp=317/277 getrandom=318/278
memfd_create=319/279 kexec_file_load=320/294 bpf=321/280 execveat=322/281 userfaultfd=323/282
membarrier=324/283 mlock2=325/284 copy_file_range=326/285 preadv2=327/286 pwritev2=328/287
pkey_mprotect=329/288 pkey_alloc=330/289 pkey_free=331/290 statx=332/291 io_pgetevents=333/292
rseq=334/293 pidfd_send_signal=424/424 io_uring_setup=425/425 io_uring_enter=426/426
io_uring_register=427/427 open_tree=428/428 move_mount=429/429 fsopen=430/430 fsconfig=431/431
fsmount=432/432 fspick=433/433 pidfd_open=434/434 clone3=435/435 close_range=436/436
openat2=437/437 pidfd_getfd=438/438 faccessat2=439/439 process_madvise=440/440
epoll_pwait2=441/441 mount_setattr=442/442 quotactl_fd=443/443 landlock_create_ruleset=444/444
landlock_add_rule=445/445 landlock_restrict_self=446/446 memfd_secret=447/447
process_mrelease=448/448 futex_waitv=449/449 set_mempolicy_home_node=450/450 cachestat=451/451
fchmodat2=452/452 map_shadow_stack=453/453 futex_wake=454/454 futex_wait=455/455
futex_requeue=456/456 statmount=457/457 listmount=458/458 lsm_get_self_attr=459/459
lsm_set_self_attr=460/460 lsm_list_modules=461/461 mseal=462/462 setxattrat=463/463
getxattrat=464/464 listxattrat=465/465 removexattrat=466/466 open_tree_attr=467/467
file_getattr=468/468 file_setattr=469/469
"""


def _parse(text: str) -> dict[str, tuple[Optional[int], Optional[int]]]:
    out: dict[str, tuple[Optional[int], Optional[int]]] = {}
    for token in text.split():
        name, _, nums = token.partition("=")
        a, b = (None if n == "-" else int(n) for n in nums.split("/"))
        out[name] = (a, b)
    return out


#: name -> (x86_64 number or None, aarch64 number or None)
NUMBERS = _parse(_TABLE)


def number(name: str, machine: str) -> Optional[int]:
    """The number of system call name on machine (None: it has no such call)."""
    return NUMBERS.get(name, (None, None))[ARCHES.index(machine)]
