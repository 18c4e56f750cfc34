"""Check a running deployment of the image (a container started as docs/deploy.md writes it,
with --network host), from the machine that runs it: what .ci/containers asks of each way to
run the container.

    check_deployment.py --write-probe TOOLS     write the probe library into the folder TOOLS
    check_deployment.py --url http://127.0.0.1:PORT --token-file FILE --container NAME \\
                        --per-tenant yes|no

The checks, over plain HTTP and MCP: /healthz answers without a token (any Host), /mcp
refuses without it (401), /metrics answers with it; two MCP sessions open at once, each
lists the tools and calls them; each session's workspace is closed to the other session's
worker (EACCES both ways), and neither worker can signal the other or the server.  The
workers are found by the kernel, not by what they say: the processes under the container's
first process (its pid as Docker reports it) whose current folder is the session's
workspace; each holds no capability, has no_new_privs and seccomp filter mode 2, and runs as
the server's uid (one uid for all tenants) or as a uid of its session's own (a uid per
tenant).  Once the sessions end their workers are gone; `docker stop` ends the server with
status 0.  Exit status 0 if every check held, 1 with the first that did not.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable, Optional

import anyio
import psutil
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

PROBE_NAME = "ci_probe.py"
PROBE_LIBRARY = '''\
"""What a tenant's worker can reach: the deployment check's probe."""
import errno
import os
import signal


def tool_where() -> dict:
    """This worker's workspace (its current folder)."""
    return {"success": True, "output": os.getcwd()}


def tool_reach(folder: str) -> dict:
    """List ``folder`` and open its secret.txt: each one's errno name, or "ok"."""
    got = {}
    for what, attempt in (("list", lambda: os.listdir(folder)),
                          ("open", lambda: open(os.path.join(folder, "secret.txt")).read())):
        try:
            attempt()
            got[what] = "ok"
        except OSError as exc:
            got[what] = errno.errorcode.get(exc.errno, str(exc.errno))
    return {"success": True, "output": got}


def tool_signal(pid: int) -> dict:
    """SIGTERM to ``pid``: "sent", or the errno's name."""
    try:
        os.kill(pid, signal.SIGTERM)
        return {"success": True, "output": "sent"}
    except OSError as exc:
        return {"success": True, "output": errno.errorcode.get(exc.errno, str(exc.errno))}
'''


class Failed(Exception):
    """A check that did not hold."""


def expect(ok: bool, what: str) -> None:
    if not ok:
        raise Failed(what)
    print(f"  ok  {what}", flush=True)


def wait_for(cond: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Poll ``cond`` until true within ``timeout_s``, else Failed(what)."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise Failed(f"{what}: not within {timeout_s:.0f} s")
        time.sleep(0.1)


def get(url: str, path: str, host: Optional[str] = None,
        token: Optional[str] = None) -> tuple[int, str]:
    headers = {**({"Host": host} if host else {}),
               **({"Authorization": f"Bearer {token}"} if token else {})}
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(urllib.request.Request(url + path, headers=headers), timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError as e:
        return 0, str(e)


def docker(*argv: str) -> str:
    return subprocess.run(["docker", *argv], check=True, capture_output=True, text=True,
                          timeout=120).stdout.strip()


# ---------------------------------------------------------------- what the kernel says
def status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return dict(line.split(":\t", 1) for line in lines if ":\t" in line)


def workers_in(server: int, folder: str) -> list[int]:
    """The processes under ``server`` (a host pid) whose current folder is ``folder`` of the
    container (compared by device and inode, through the server's root)."""
    want = os.stat(f"/proc/{server}/root{folder}")
    found = []
    for proc in psutil.Process(server).children(recursive=True):
        try:
            st = os.stat(f"/proc/{proc.pid}/cwd")
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == (want.st_dev, want.st_ino):
            found.append(proc.pid)
    return found


def check_worker(pid: int, server_uid: int, per_tenant: bool) -> int:
    """The worker ``pid`` holds no capability, has no_new_privs and a seccomp filter, and
    runs as its session's own uid or the server's; its uid."""
    s = status(pid)
    uid = int(s["Uid"].split()[0])
    said = (f"worker {pid}: uid {uid} (the server's {server_uid}), CapEff {s['CapEff']}, "
            f"CapPrm {s['CapPrm']}, NoNewPrivs {s['NoNewPrivs']}, Seccomp {s['Seccomp']}")
    expect(int(s["CapEff"], 16) == 0 and int(s["CapPrm"], 16) == 0
           and s["NoNewPrivs"] == "1" and s["Seccomp"] == "2"
           and s["Uid"].split() == [str(uid)] * 4 and (uid != server_uid) is per_tenant,
           f"{said}: no capability, no_new_privs, a seccomp filter, "
           f"{'a uid of its own' if per_tenant else 'the server uid'}")
    return uid


# ---------------------------------------------------------------- the sessions
async def call(session: ClientSession, tool: str, **arguments: Any) -> Any:
    result = await session.call_tool(tool, arguments)
    content = result.structured_content or {}
    if content.get("status_code") != 200:
        raise Failed(f"{tool} {arguments}: {content or result}")
    return content.get("output")


async def two_sessions(url: str, token: str, server: int, per_tenant: bool) -> list[int]:
    """Both sessions at once: the checks across them; the host pids of their workers."""
    headers = {"Authorization": f"Bearer {token}"}
    async with create_mcp_http_client(headers=headers) as http_a, \
            create_mcp_http_client(headers=headers) as http_b, \
            streamable_http_client(f"{url}/mcp", http_client=http_a) as (ra, wa), \
            streamable_http_client(f"{url}/mcp", http_client=http_b) as (rb, wb), \
            ClientSession(ra, wa) as a, ClientSession(rb, wb) as b:
        await a.initialize()
        await b.initialize()
        for session in (a, b):
            names = {t.name for t in (await session.list_tools()).tools}
            expect({"tool_where", "tool_write_file"} <= names,
                   f"tools listed: {len(names)}, the probe's and the workspace tools' among them")
        async with anyio.create_task_group() as group:
            for session, text in ((a, "a"), (b, "b")):
                group.start_soon(lambda s=session, t=text: call(
                    s, "tool_write_file", file_name="secret.txt", content=t))
        where = [await call(a, "tool_where"), await call(b, "tool_where")]
        expect(where[0] != where[1], f"each session has its own workspace: {where}")
        server_uid = int(status(server)["Uid"].split()[0])
        # a session's workers: one a library it called (the probe's, the workspace tools')
        found = [workers_in(server, folder) for folder in where]
        expect(all(len(f) == 2 for f in found), f"two workers in each workspace: {found}")
        uids = [{check_worker(pid, server_uid, per_tenant) for pid in f} for f in found]
        expect(all(len(u) == 1 for u in uids), f"a session's workers share its uid: {uids}")
        if per_tenant:
            expect(uids[0] != uids[1], f"a uid per tenant: {uids}")
        pids = found[0] + found[1]
        ns_pids = [int(status(f[0])["NSpid"].split()[-1]) for f in found]
        for (me, other), (mine, theirs) in (((a, where[1]), (0, 1)), ((b, where[0]), (1, 0))):
            got = await call(me, "tool_reach", folder=other)
            expect(got == {"list": "EACCES", "open": "EACCES"},
                   f"session {'ab'[mine]}'s worker cannot reach the other's workspace: {got}")
            sent = await call(me, "tool_signal", pid=ns_pids[theirs])
            expect(sent in ("EPERM", "ESRCH"),
                   f"session {'ab'[mine]}'s worker cannot signal the other's: {sent}")
            sent = await call(me, "tool_signal", pid=1)
            expect(sent in ("EPERM", "ESRCH"),
                   f"session {'ab'[mine]}'s worker cannot signal the server: {sent}")
        expect(all(psutil.pid_exists(p) for p in pids), "both workers still run")
        expect(await call(a, "tool_where") == where[0], "session a still answers")
    return pids


def check(url: str, token: str, container: str, per_tenant: bool) -> None:
    server = int(docker("inspect", "-f", "{{.State.Pid}}", container))
    wait_for(lambda: get(url, "/healthz")[0] == 200, 120, "the server answers /healthz")
    expect(get(url, "/healthz", host="10.1.2.3:8000") == (200, "ok\n"),
           "/healthz answers any Host, without a token")
    expect(get(url, "/mcp")[0] == 401, "/mcp without the token: 401")
    code, text = get(url, "/metrics", token=token)
    expect(code == 200 and "lcp_sandbox_sessions" in text, f"/metrics: {code} {text[:200]}")
    pids = anyio.run(two_sessions, url, token, server, per_tenant)
    wait_for(lambda: not any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"
                             for p in pids), 60, "the sessions' workers end with the sessions")
    print("  ok  the sessions' workers end with the sessions", flush=True)
    docker("stop", "-t", "60", container)
    code = int(docker("inspect", "-f", "{{.State.ExitCode}}", container))
    expect(code == 0, f"docker stop ends the server with status 0: {code}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write-probe", metavar="TOOLS")
    parser.add_argument("--url")
    parser.add_argument("--token-file")
    parser.add_argument("--container")
    parser.add_argument("--per-tenant", choices=("yes", "no"))
    args = parser.parse_args()
    if args.write_probe:
        (Path(args.write_probe) / PROBE_NAME).write_text(PROBE_LIBRARY, encoding="utf-8")
        return 0
    if not (args.url and args.token_file and args.container and args.per_tenant):
        parser.error("--url, --token-file, --container and --per-tenant are needed")
    token = Path(args.token_file).read_text(encoding="utf-8").strip()
    print(f"{args.container}: {args.url}", flush=True)
    try:
        check(args.url, token, args.container, args.per_tenant == "yes")
    except Exception as exc:       # noqa: BLE001 (a Failed, maybe in the sessions' group)
        while len(getattr(exc, "exceptions", ())) == 1:
            exc = exc.exceptions[0]          # type: ignore[attr-defined]
        if not isinstance(exc, Failed):
            raise
        print(f"  FAILED  {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
