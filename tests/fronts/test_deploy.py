"""deploy/ runs as written: the image (deploy/Dockerfile) and the Kubernetes manifests
(deploy/kubernetes.yaml: a uid per tenant; deploy/kubernetes-restricted.yaml: one uid for all),
and docs/deploy.md says what they hold.

No container runtime runs in this suite (.ci/containers runs the image in a real one, Docker,
in CI), so what one would do is done without it:

    docker build    the build context as Dockerfile.dockerignore leaves it, built into a wheel
                    and installed into a fresh virtualenv of the system's Python (the same
                    minor version; the dependencies are copies of the ones these tests use);
                    the image's folders in a folder of the test
    the container   its command (ENTRYPOINT + CMD, or the manifest's args) on a loopback port,
                    as PID 1 of a PID namespace of its own, under the runtime's default seccomp
                    profile (tests/support/without_landlock.py --docker-default), as the uid, with the
                    capabilities and no_new_privs its settings give (setpriv); its volumes
                    as Kubernetes makes them
    the checks      the probe's endpoint, the HEALTHCHECK, the token, Host headers the
                    Service's names send, a session's tool calls, each tenant's uid, a timed-out
                    worker stopped, the session's temp files gone; SIGTERM ends it with 0

The emulated kinds need a root test process; the plain run of the image's command does not.
"""
from __future__ import annotations

import ast
import importlib.metadata
import json
import os
import queue
import re
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Optional

import psutil
import pytest
import yaml
from conftest import HERE, REPO, SUPPORT, poll
from packaging.requirements import Requirement

from lcp_sandbox.fronts.cli import build_parser

pytest.importorskip("mcp")

import anyio  # noqa: E402
from mcp import ClientSession  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402
from mcp.shared._httpx_utils import create_mcp_http_client  # noqa: E402

from lcp_sandbox.fronts.mcp_transports import HEALTH_PATH  # noqa: E402

DEPLOY = REPO / "deploy"
DOCKERFILE = DEPLOY / "Dockerfile"
MANIFESTS = {"kubernetes.yaml": "baseline", "kubernetes-restricted.yaml": "restricted"}
PAGE = REPO / "docs" / "deploy.md"
WITHOUT_LANDLOCK = SUPPORT / "without_landlock.py"
TOKEN = "deploy-test-token-0123456789"
POD_ENV = {"POD_NAMESPACE": "lcp-sandbox", "POD_IP": "10.244.0.7"}
#: A default uid range (a tenant's uid is derived from its session's random id).
TENANT_UIDS = range(1_800_000_000, 1_801_000_000)
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="a container is emulated from root")

#: The Pod Security Standards (kubernetes.io/docs/concepts/security/pod-security-standards),
#: the parts these manifests touch: what "baseline" lets a container add, and the volumes
#: "restricted" allows.
BASELINE_CAPABILITIES = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL",
                         "MKNOD", "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID",
                         "SYS_CHROOT"}
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                      "persistentVolumeClaim", "projected", "secret"}

#: A library the emulated containers serve beside the image's tools.
PROBE_LIBRARY = '''\
import os
import tempfile
import time


def tool_sleep(seconds: float) -> dict:
    """Sleep, then say so."""
    time.sleep(seconds)
    return {"success": True, "output": "awake"}


def tool_leave_temp_files() -> dict:
    """A folder with a file in this worker's temp dir; its path."""
    folder = tempfile.mkdtemp()
    with open(os.path.join(folder, "left.txt"), "w") as f:
        f.write("x")
    return {"success": True, "output": folder}
'''


# ---------------------------------------------------------------- reading deploy/
@dataclass
class Dockerfile:
    instructions: list[tuple[str, str]]
    comments: str

    def one(self, name: str) -> str:
        found = [args for word, args in self.instructions if word == name]
        assert len(found) == 1, (name, found)
        return found[0]

    def exec_form(self, name: str) -> list[str]:
        return json.loads(self.one(name))

    def capabilities(self, label: str) -> set[str]:
        """The CAP_ names the comments list after ``label``."""
        m = re.search(re.escape(label) + r"\s+((?:CAP_[A-Z_]+\s+)+)", self.comments)
        assert m, f"the Dockerfile's comments list no capabilities after {label!r}"
        return {c.removeprefix("CAP_") for c in m.group(1).split()}


def dockerfile() -> Dockerfile:
    """Its instructions (continuations joined) and its comments as one text."""
    instructions, comments, current = [], [], []
    for line in DOCKERFILE.read_text(encoding="utf-8").splitlines():
        text = line.strip()
        if text.startswith("#"):
            comments.append(text[1:].strip())
        elif text:
            more = text.endswith("\\")
            current.append(text[:-1].strip() if more else text)
            if not more:
                word, _, args = " ".join(current).partition(" ")
                instructions.append((word.upper(), args.strip()))
                current = []
    return Dockerfile(instructions, " ".join(comments) + " ")


def manifest(name: str) -> dict:
    """The objects of a manifest by kind (one of each)."""
    objects = [o for o in yaml.safe_load_all((DEPLOY / name).read_text(encoding="utf-8")) if o]
    kinds = [o["kind"] for o in objects]
    assert sorted(kinds) == ["Deployment", "Namespace", "Service"], kinds
    return {o["kind"]: o for o in objects}


def pod_spec(name: str) -> dict:
    return manifest(name)["Deployment"]["spec"]["template"]["spec"]


def containers(spec: dict) -> list[dict]:
    return [*spec.get("initContainers", []), *spec["containers"]]


def effective(spec: dict, container: dict) -> dict:
    """A container's security settings: the pod's, overridden by the container's own."""
    pod = {k: v for k, v in spec.get("securityContext", {}).items()
           if k in ("runAsUser", "runAsGroup", "runAsNonRoot", "seccompProfile")}
    return {**pod, **container.get("securityContext", {})}


def image_user() -> tuple[int, int]:
    uid, _, gid = dockerfile().one("USER").partition(":")
    return int(uid), int(gid or uid)


def cmd_option(args: list[str], name: str) -> Optional[str]:
    """The value of ``--name V`` or ``--name=V`` in ``args``."""
    for i, arg in enumerate(args):
        if arg == name:
            return args[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


# ---------------------------------------------------------------- static checks
def test_the_image_builds_from_a_tagged_python_and_runs_as_a_user_on_its_port():
    """From python:3.X-slim unless the build names another base (--build-arg BASE, as a
    machine without a registry does); the health check runs the module that asks the
    server where its command says it serves."""
    df = dockerfile()
    arg, _, base = df.instructions[0][1].partition("=")
    assert df.instructions[0][0] == "ARG" and arg == "BASE", df.instructions[0]
    assert df.one("FROM") == "${BASE}"
    assert re.fullmatch(r"python:3\.\d+-slim", base), base
    assert "@" not in base
    assert image_user()[0] != 0, "the image's user is not root"
    cmd = df.exec_form("CMD")
    assert df.exec_form("ENTRYPOINT") == ["lcp-sandbox", "serve-mcp"]
    assert df.one("EXPOSE") == cmd_option(cmd, "--port")
    parsed = build_parser().parse_args(["serve-mcp", *cmd])
    assert parsed.transport == "http" and parsed.metrics and parsed.token_file
    health = json.loads(df.one("HEALTHCHECK").split(" CMD ", 1)[1])
    assert health == ["python", "-m", "lcp_sandbox.fronts.healthcheck"], health
    copies = [args for word, args in df.instructions if word == "COPY"]
    assert copies == [". /tmp/lcp-sandbox-src"], copies
    assert any('pip install "/tmp/lcp-sandbox-src[mcp]"' in args
               for word, args in df.instructions if word == "RUN")


def ignore_rules(path: Path) -> list[str]:
    return [line.strip() for line in path.read_text(encoding="utf-8").splitlines()
            if line.strip() and not line.startswith("#")]


def test_the_build_context_is_the_same_with_or_without_buildkit():
    """BuildKit reads deploy/Dockerfile.dockerignore; the legacy builder (Docker without
    buildx, as Debian's docker.io) reads only .dockerignore at the context's root: the two
    hold the same rules, so either builder is sent the same files."""
    rules = ignore_rules(DEPLOY / "Dockerfile.dockerignore")
    assert rules[0] == "*" and "!lcp_sandbox/" in rules
    assert ignore_rules(REPO / ".dockerignore") == rules


def all_capabilities() -> set[str]:
    """Every capability this kernel knows, by name without CAP_."""
    last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    return capability_names((1 << (last + 1)) - 1)


def capability_names(mask: int) -> set[str]:
    """The capabilities of a mask (as /proc/<pid>/status shows them), by name without CAP_."""
    if not mask:
        return set()
    out = subprocess.run(["capsh", f"--decode={mask:#x}"], capture_output=True, text=True,
                         check=True).stdout
    return {name.upper().removeprefix("CAP_") for name in out.strip().split("=", 1)[1].split(",")}


def host_kinds_container_drops() -> set[str]:
    """tests/confinement/test_host_kinds.py's CONTAINER_DROPS, read from its source (importing it would
    run its module-level skips)."""
    tree = ast.parse((HERE / "confinement" / "test_host_kinds.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "CONTAINER_DROPS"
                                                for t in node.targets):
            return {c.upper().removeprefix("CAP_") for c in ast.literal_eval(node.value).split(",")}
    raise AssertionError("tests/confinement/test_host_kinds.py has no CONTAINER_DROPS")


def test_dockers_default_capabilities_are_the_ones_the_host_kinds_emulate():
    """The Dockerfile's list of Docker's defaults is what tests/confinement/test_host_kinds.py's container
    kind keeps (every capability but its CONTAINER_DROPS), and it holds what a uid per tenant
    needs: the capabilities kubernetes.yaml adds."""
    df = dockerfile()
    default = df.capabilities("Docker's default set holds them:")
    assert default == all_capabilities() - host_kinds_container_drops()
    needs = df.capabilities("The least it needs:")
    assert needs < default
    added = effective(pod_spec("kubernetes.yaml"),
                      pod_spec("kubernetes.yaml")["containers"][0])["capabilities"]["add"]
    assert set(added) == needs


def pss_violations(spec: dict, level: str) -> list[str]:
    """What of a pod keeps it from a Pod Security Standard level ("baseline", "restricted")."""
    wrong = [f"host namespace {k}" for k in ("hostNetwork", "hostPID", "hostIPC") if spec.get(k)]
    wrong += [f"volume {v['name']} is a hostPath" for v in spec.get("volumes", [])
              if "hostPath" in v]
    if level == "restricted":
        wrong += [f"volume {v['name']}" for v in spec.get("volumes", [])
                  if not set(v) - {"name"} <= RESTRICTED_VOLUMES]
    for c in containers(spec):
        ctx, name = effective(spec, c), c["name"]
        caps = ctx.get("capabilities", {})
        if ctx.get("privileged"):
            wrong.append(f"{name}: privileged")
        if ctx.get("seccompProfile", {}).get("type") not in ("RuntimeDefault", "Localhost"):
            wrong.append(f"{name}: seccomp {ctx.get('seccompProfile')}")
        if any(p.get("hostPort") for p in c.get("ports", [])):
            wrong.append(f"{name}: hostPort")
        allowed = BASELINE_CAPABILITIES if level == "baseline" else {"NET_BIND_SERVICE"}
        wrong += [f"{name}: adds {cap}" for cap in set(caps.get("add", [])) - allowed]
        if level == "restricted":
            if "ALL" not in caps.get("drop", []):
                wrong.append(f"{name}: does not drop ALL")
            if ctx.get("allowPrivilegeEscalation") is not False:
                wrong.append(f"{name}: may escalate")
            if ctx.get("runAsNonRoot") is not True or ctx.get("runAsUser") == 0:
                wrong.append(f"{name}: may run as root")
    return wrong


@pytest.mark.parametrize("name", MANIFESTS)
def test_each_manifest_meets_the_pod_security_level_its_namespace_enforces(name):
    objects = manifest(name)
    level = MANIFESTS[name]
    labels = objects["Namespace"]["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == level
    spec = pod_spec(name)
    assert pss_violations(spec, level) == []
    if level == "baseline":
        # what keeps it from "restricted": root, and the capabilities a uid per tenant needs
        assert pss_violations(spec, "restricted"), "restricted would do: enforce it"
    for c in containers(spec):
        ctx = effective(spec, c)
        assert ctx["allowPrivilegeEscalation"] is False and ctx["readOnlyRootFilesystem"] is True
        assert ctx["capabilities"]["drop"] == ["ALL"]
    assert spec["automountServiceAccountToken"] is False


@pytest.mark.parametrize("name", MANIFESTS)
def test_the_service_probes_and_host_names_meet_the_servers_flags(name):
    """The probes ask /healthz on the port the server binds; the Service sends there; the
    names a client reaches the Service by, and the pod's address, are allowed Host headers;
    the token's file is the Secret's key; the arguments parse."""
    objects = manifest(name)
    spec = pod_spec(name)
    (server,) = spec["containers"]
    args = server["args"]
    parsed = build_parser().parse_args(["serve-mcp", *args])
    (port,) = server["ports"]
    assert port["containerPort"] == parsed.port and parsed.host == "0.0.0.0"
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert server[probe]["httpGet"] == {"path": HEALTH_PATH, "port": port["name"]}, probe
    service = objects["Service"]
    labels = objects["Deployment"]["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"] == labels
    assert objects["Deployment"]["spec"]["selector"]["matchLabels"] == labels
    (sport,) = service["spec"]["ports"]
    assert sport["targetPort"] == port["name"]
    svc, ns = service["metadata"]["name"], objects["Namespace"]["metadata"]["name"]
    hosts = [expand(h, {"POD_NAMESPACE": ns, "POD_IP": "$(POD_IP)"}) for h in parsed.allowed_host]
    for host in (svc, f"{svc}.{ns}", f"{svc}.{ns}.svc", f"{svc}.{ns}.svc.cluster.local",
                 "$(POD_IP)"):
        assert f"{host}:{sport['port']}" in hosts, host
    env = {e["name"] for e in server["env"]}
    assert set(re.findall(r"\$\((\w+)\)", " ".join(args))) <= env
    mounts = {m["name"]: m["mountPath"] for m in server["volumeMounts"]}
    secret = next(v for v in spec["volumes"] if v["name"] == "token")["secret"]
    assert parsed.token_file == f"{mounts['token']}/mcp-token"
    assert secret["secretName"] == "lcp-sandbox-token"
    assert parsed.workspace_root == mounts["workspaces"]
    assert all(o["metadata"].get("namespace", ns) == ns for o in objects.values())


def expand(text: str, env: dict) -> str:
    """Kubernetes' $(VAR) in a container's args."""
    return re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), text)


def doc_table(header: str) -> dict[str, list[str]]:
    """The rows of docs/deploy.md's table whose first header cell is ``header``."""
    lines = PAGE.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {header} |"))
    rows = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip().strip("`") for c in line.strip("|").split("|")]
        rows[cells[0].strip("`")] = cells[1:]
    return rows


def claimed(cell: str):
    """A table cell as a value: `true`, `0`, `A, B` or "none"."""
    cell = cell.strip("`")
    if cell in ("true", "false"):
        return cell == "true"
    if cell.isdigit():
        return int(cell)
    if cell == "none":
        return []
    return [c.strip().strip("`") for c in cell.split(",")]


def test_the_page_says_the_security_settings_each_manifest_has():
    rows = doc_table("setting")
    for column, name in enumerate(MANIFESTS):
        spec = pod_spec(name)
        ctx = effective(spec, spec["containers"][0])
        have = {"runAsUser": ctx.get("runAsUser", image_user()[0]),
                "runAsNonRoot": ctx["runAsNonRoot"],
                "allowPrivilegeEscalation": ctx["allowPrivilegeEscalation"],
                "privileged": ctx["privileged"],
                "readOnlyRootFilesystem": ctx["readOnlyRootFilesystem"],
                "capabilities.drop": ctx["capabilities"]["drop"],
                "capabilities.add": ctx["capabilities"].get("add", []),
                "seccompProfile.type": [ctx["seccompProfile"]["type"]],
                "Pod Security Standard": [MANIFESTS[name]]}
        said = {key: claimed(cells[column]) for key, cells in rows.items()}
        assert said == have, name


def console_commands() -> list[list[str]]:
    """The commands of docs/deploy.md's console blocks (shown, not run here)."""
    out, inside = [], False
    for line in PAGE.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            inside = line == "```console"
        elif inside:
            argv = shlex.split(line, comments=True)
            if argv:
                out.append(argv)
    return out


def test_the_pages_commands_use_the_files_and_names_of_deploy():
    commands = console_commands()
    # (the recipe without a registry: a base made by debootstrap, imported, named as BASE)
    assert {c[0] for c in commands} == {"docker", "kubectl", "debootstrap", "ln", "printf",
                                        "tar"}, commands
    (imported,) = [c[c.index("import") + 2] for c in commands if c[0] == "tar"]
    assert any(f"BASE={imported}" in c for c in commands if c[:2] == ["docker", "build"])
    images = set()
    for argv in commands:
        if argv[:2] == ["docker", "build"]:
            assert argv[argv.index("-f") + 1] == "deploy/Dockerfile" and argv[-1] == "."
            images.add(argv[argv.index("-t") + 1])
    assert images
    needs = dockerfile().capabilities("The least it needs:")
    for argv in commands:
        if argv[:2] == ["docker", "run"]:
            added = {argv[i + 1] for i, a in enumerate(argv) if a == "--cap-add"}
            assert not added or ("--cap-drop" in argv and added == needs), argv
            assert images & set(argv), argv
            tail = argv[[i for i, a in enumerate(argv) if a in images][0] + 1:]
            build_parser().parse_args(["serve-mcp", *tail] if tail else ["serve-mcp", "x"])
        if argv[0] == "kubectl" and "-f" in argv:
            assert (REPO / argv[argv.index("-f") + 1]).is_file(), argv
        if argv[0] == "kubectl" and "secret" in argv:
            assert "lcp-sandbox-token" in argv and any(a.startswith("--from-file=mcp-token=")
                                                      for a in argv), argv


# ---------------------------------------------------------------- docker build, emulated
def ignored(path: str, rules: list[tuple[bool, str]]) -> bool:
    """Whether .dockerignore rules (negated?, pattern) leave ``path`` out of the context."""
    parts = path.split("/")
    verdict = False
    for negated, pattern in rules:
        if any(_matches(pattern, parts[:n]) for n in range(1, len(parts) + 1)):
            verdict = not negated
    return verdict


def _matches(pattern: str, parts: list[str]) -> bool:
    if pattern.startswith("**/"):
        return any(_matches(pattern[3:], parts[i:]) for i in range(len(parts)))
    want = pattern.strip("/").split("/")
    return len(want) == len(parts) and all(map(fnmatchcase, parts, want))


def build_context(dest: Path) -> None:
    """What `docker build -f deploy/Dockerfile .` sends: the checkout, less what
    Dockerfile.dockerignore leaves out."""
    rules = []
    for line in (DEPLOY / "Dockerfile.dockerignore").read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            rules.append((line.startswith("!"), line.lstrip("!")))
    for top, dirs, files in os.walk(REPO):
        rel = os.path.relpath(top, REPO)
        dirs[:] = [d for d in dirs if d not in (".git", ".venv")]
        for name in files:
            path = name if rel == "." else f"{rel}/{name}"
            if not ignored(path, rules):
                (dest / path).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(REPO / path, dest / path)


def dependencies(name: str, extras: tuple = ()) -> dict[str, importlib.metadata.Distribution]:
    """The installed distributions ``name[extras]`` needs, itself excluded."""
    found: dict = {}
    seen: set = set()

    def walk(dist_name: str, with_extras: tuple) -> None:
        key = (re.sub(r"[-_.]+", "-", dist_name).lower(), with_extras)
        if key in seen:
            return
        seen.add(key)
        dist = importlib.metadata.distribution(dist_name)
        found[key[0]] = dist
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or any(req.marker.evaluate({"extra": e})
                                         for e in ("", *with_extras)):
                walk(req.name, tuple(sorted(req.extras)))
    walk(name, extras)
    found.pop(re.sub(r"[-_.]+", "-", name).lower())
    return found


@dataclass
class Image:
    venv: Path
    root: Path
    env: dict

    def at(self, path: str) -> str:
        """Where an absolute path of the container lies here."""
        return str(self.root) + path

    def mapped(self, arg: str) -> str:
        """An argument with the container's paths (alone, or after ``--opt=``) put here."""
        head, eq, tail = arg.partition("=")
        if eq and head.startswith("--") and tail.startswith("/"):
            return f"{head}={self.at(tail)}"
        return self.at(arg) if arg.startswith("/") else arg


def run(argv: list[str]) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    output = f"{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    assert done.returncode == 0, f"{shlex.join(argv)}:\n{output}"


@pytest.fixture(scope="module")
def image(open_tmp_module) -> Image:
    """The image, built without Docker (see the module's docstring)."""
    system = shutil.which(f"python3.{sys.version_info.minor}", path="/usr/bin:/usr/local/bin")
    if system is None or os.path.realpath(system).startswith("/root"):
        pytest.skip(f"no system python3.{sys.version_info.minor} every uid can run")
    work = open_tmp_module
    context, wheels, venv = work / "context", work / "wheels", work / "venv"
    build_context(context)
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-cache-dir", "-w",
         str(wheels), str(context)])
    run([system, "-m", "venv", "--without-pip", str(venv)])
    (wheel,) = wheels.glob("lcp_sandbox-*.whl")
    run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
         "--no-deps", "--no-index", str(wheel)])
    site = next(venv.glob("lib/python3.*/site-packages"))
    for dist in dependencies("lcp-sandbox", ("mcp",)).values():
        for f in dist.files or []:
            src = Path(dist.locate_file(f))
            if src.is_file() and not str(f).startswith(".."):
                (site / f).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, site / f)
    root = work / "image"
    shutil.copytree(context / "tools", root / "srv/lcp-sandbox/tools")
    (root / "srv/lcp-sandbox/workspaces").mkdir(mode=0o711)
    if os.geteuid() == 0:
        os.chown(root / "srv/lcp-sandbox/workspaces", *image_user())
    subprocess.run(["chmod", "-R", "a+rX", str(venv), str(root / "srv")], check=True)
    env_line = dockerfile().one("ENV")
    env = dict(kv.split("=", 1) for kv in shlex.split(env_line))
    env["PATH"] = f"{venv / 'bin'}:/usr/local/bin:/usr/bin:/bin"
    return Image(venv, root, env)


# ---------------------------------------------------------------- the container, emulated
@dataclass
class Container:
    """How the container's process runs: its uid and gid, the capabilities it holds, whether
    no_new_privs is set, its supplementary group."""
    uid: int
    gid: int
    capabilities: set = field(default_factory=set)
    no_new_privs: bool = True
    group: Optional[int] = None

    def wrap(self, argv: list[str]) -> list[str]:
        """``argv`` as the runtime starts it: PID 1 of a PID namespace of its own, the default
        seccomp profile installed by root, then the uid, capabilities and no_new_privs."""
        bounding = ",".join(["-all", *(f"+{c.lower()}" for c in sorted(self.capabilities))])
        setpriv = ["setpriv", f"--bounding-set={bounding}", "--inh-caps=-all"]
        if self.no_new_privs:
            setpriv.append("--no-new-privs")
        if self.uid != 0:
            groups = [f"--groups={self.group}"] if self.group is not None else ["--clear-groups"]
            setpriv += [f"--reuid={self.uid}", f"--regid={self.gid}", *groups]
        return ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", sys.executable,
                str(WITHOUT_LANDLOCK), "--docker-default", "--keep-landlock", *setpriv, *argv]

    def refuses_namespaces(self, python: str) -> None:
        """The runtime's seccomp profile is in force: unshare(CLONE_NEWUSER), which needs no
        privilege, answers EPERM in the container."""
        probe = ("import ctypes; libc = ctypes.CDLL(None, use_errno=True); "
                 "print(libc.unshare(0x10000000), ctypes.get_errno())")
        done = subprocess.run(self.wrap([python, "-c", probe]), capture_output=True, text=True,
                              timeout=60)
        assert done.stdout.split() == ["-1", "1"], (done.stdout, done.stderr)

    def check(self, pid: int) -> None:
        """The process ``pid`` is as this container's would be (read from the kernel)."""
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
        status = dict(line.split(":\t", 1) for line in lines if ":\t" in line)
        assert status["NSpid"].split()[-1] == "1", status["NSpid"]
        assert status["Uid"].split() == [str(self.uid)] * 4, status["Uid"]
        assert status["Seccomp"] == "2" and status["NoNewPrivs"] == str(int(self.no_new_privs))
        held = capability_names(int(status["CapEff"], 16))
        assert held == (self.capabilities if self.uid == 0 else set()), held


@dataclass
class Server:
    proc: subprocess.Popen
    port: int
    log: list
    wrapped: bool

    @property
    def pid(self) -> int:
        """The server's own pid (under unshare, the PID namespace's first process)."""
        if not self.wrapped:
            return self.proc.pid
        (child,) = psutil.Process(self.proc.pid).children()
        return child.pid

    def stop(self) -> int:
        """SIGTERM, as the runtime stops a container; its exit status."""
        os.kill(self.pid, signal.SIGTERM)
        try:
            return self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError("the server did not stop on SIGTERM:\n"
                                 + "".join(self.log[-30:])) from None


def _pump(stream, log: list, ready: queue.Queue) -> None:
    for line in stream:
        log.append(line)
        if "serving http" in line:
            ready.put(line)
    ready.put(None)


def serve(image: Image, args: list[str], env: dict, cwd: str,
          container: Optional[Container], port: int = 0) -> Server:
    """The container's command (ENTRYPOINT + ``args``) on a loopback port: ``port``, or one
    the kernel chooses."""
    args = [image.mapped(a) for a in args]
    for i, a in enumerate(args):
        if a.startswith("--host=") or a.startswith("--port="):
            args[i] = a.split("=")[0] + ("=127.0.0.1" if a.startswith("--host") else f"={port}")
        elif i and args[i - 1] in ("--host", "--port"):
            args[i] = "127.0.0.1" if args[i - 1] == "--host" else str(port)
    argv = [*dockerfile().exec_form("ENTRYPOINT"), *args]
    argv[0] = str(image.venv / "bin" / argv[0])
    if container is not None:
        container.refuses_namespaces(str(image.venv / "bin" / "python"))
        argv = container.wrap(argv)
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=cwd)
    log: list = []
    ready: queue.Queue = queue.Queue()
    threading.Thread(target=_pump, args=(proc.stderr, log, ready), daemon=True).start()
    line = ready.get(timeout=120)
    if line is None:
        proc.wait(30)
        raise AssertionError(f"the server did not start ({proc.returncode}):\n" + "".join(log))
    port = int(re.search(r"serving http://127\.0\.0\.1:(\d+)/mcp", line).group(1))
    server = Server(proc, port, log, container is not None)
    if container is not None:
        try:
            container.check(server.pid)
        except BaseException:
            server.stop()
            raise
    return server


def get(port: int, path: str, host: str, token: Optional[str] = None) -> tuple[int, str]:
    headers = {"Host": host, **({"Authorization": f"Bearer {token}"} if token else {})}
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


@dataclass
class Session:
    write: dict
    written: Optional[os.stat_result]
    slept: dict
    temp_folder: str


def a_session(port: int, host: str, workspace_root: Path, slow: bool) -> Session:
    """One MCP session through the Service's name: a file written, its workspace looked at,
    (with the probe library) a call past its timeout and temp files left behind."""
    async def body() -> Session:
        headers = {"Authorization": f"Bearer {TOKEN}", "Host": host}
        async with create_mcp_http_client(headers=headers) as http:
            async with streamable_http_client(f"http://127.0.0.1:{port}/mcp",
                                              http_client=http) as (read, write):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    wrote = await session.call_tool("tool_write_file",
                                                     {"file_name": "a.txt", "content": "hi"})
                    (folder,) = [p for p in workspace_root.iterdir()
                                 if p.is_dir() and not p.name.startswith(".")]
                    written = wrote.structured_content
                    st = (folder / "a.txt").stat() if written["status_code"] == 200 else None
                    if not slow or st is None:
                        return Session(written, st, {}, "")
                    slept = await session.call_tool("tool_sleep", {"seconds": 600})
                    temp = await session.call_tool("tool_leave_temp_files", {})
                    return Session(written, st, slept.structured_content,
                                   temp.structured_content["output"])
    return anyio.run(body)


def exercise(server: Server, workspace_root: Path, host: str, per_tenant: Optional[bool],
             pod_host: Optional[str] = None) -> None:
    """What a deployment must answer: the probe without token from any Host, nothing else
    without the token, /metrics to a scrape, a session's calls; then SIGTERM ends it."""
    try:
        assert get(server.port, HEALTH_PATH, pod_host or "10.1.2.3:8000") == (200, "ok\n")
        assert get(server.port, "/mcp", host)[0] == 401
        status, text = get(server.port, "/metrics", pod_host or host, TOKEN)
        assert status == 200 and "lcp_sandbox_sessions" in text, (status, text[:300])
        s = a_session(server.port, host, workspace_root, slow=per_tenant is not None)
        assert s.write["status_code"] == 200, s.write
        if per_tenant is not None:
            # the file the tool wrote in its workspace: its tenant's uid, or the server's
            assert s.written is not None
            assert (s.written.st_uid in TENANT_UIDS) is per_tenant, s.written.st_uid
            assert s.slept["status_code"] == 504, s.slept
            # the session ended (the client's DELETE): its workers, the one that timed out
            # included, and what they left in their temp dirs are gone
            assert poll(lambda: not os.path.exists(s.temp_folder), 60), s.temp_folder
            if per_tenant:
                assert poll(lambda: not [p for p in psutil.process_iter(["uids"])
                                         if p.info["uids"] and
                                         p.info["uids"].real == s.written.st_uid], 60)
    finally:
        status = server.stop()
    assert status == 0, "".join(server.log[-30:])


def tools_with_probe(image: Image, where: Path) -> Path:
    """The image's tools plus the probe library, at the container's tools path."""
    tools = where / "srv/lcp-sandbox/tools"
    shutil.copytree(image.root / "srv/lcp-sandbox/tools", tools)
    (tools / "deploy_probe.py").write_text(PROBE_LIBRARY, encoding="utf-8")
    subprocess.run(["chmod", "-R", "a+rX", str(where / "srv")], check=True)
    return tools


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def fake_server():
    """A process whose command line is a serve-mcp command's (``argv`` after it), idle."""
    procs = []

    def start(*argv: str) -> int:
        procs.append(subprocess.Popen([sys.executable, "-c",
                                       "import time; print('up', flush=True); time.sleep(120)",
                                       "serve-mcp", "/srv/tools", *argv],
                                      stdout=subprocess.PIPE, text=True))
        assert procs[-1].stdout.readline() == "up\n"       # its command line is the one
        return procs[-1].pid
    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


def test_the_health_check_asks_where_the_servers_command_says_it_serves(fake_server, capsys):
    """Not the image's default port: the port and address of the server's own command line,
    read from the kernel and parsed by serve-mcp's parser; nothing serving there is
    unhealthy, and so is a command the check cannot ask."""
    from lcp_sandbox.fronts import healthcheck
    port = free_port()
    pid = fake_server("--transport", "http", f"--port={port}", "--host", "0.0.0.0")
    assert healthcheck.served_url(pid) == f"http://127.0.0.1:{port}{HEALTH_PATH}"
    pid6 = fake_server("--transport=http", "--host", "::", "--port", "8123")
    assert healthcheck.served_url(pid6) == f"http://[::1]:8123{HEALTH_PATH}"
    assert healthcheck.main([str(pid)]) == 1
    assert f"127.0.0.1:{port}" in capsys.readouterr().err
    for argv, why in ((("--transport", "http", "--port", "0"), "--port 0"),
                      ((), "serves over stdio"), (("--transport", "http", "--bogus"), "parse")):
        with pytest.raises(ValueError, match=why):
            healthcheck.served_url(fake_server(*argv))
    with pytest.raises(ValueError, match="is not lcp-sandbox serve-mcp"):
        healthcheck.served_url(os.getpid())


def test_the_image_command_serves_and_answers_its_probe(image, open_tmp):
    """The image's command, run plainly by this test's user, on a port that is not the
    image's: the probe, the HEALTHCHECK (asked of the server's pid, PID 1 in the container),
    the token, a session."""
    shutil.copytree(image.root / "srv", open_tmp / "srv")
    token = open_tmp / "run/secrets/mcp-token"
    token.parent.mkdir(parents=True)
    token.write_text(TOKEN + "\n")
    root = Image(image.venv, open_tmp, image.env)
    server = serve(root, dockerfile().exec_form("CMD"), image.env,
                   str(open_tmp / "srv/lcp-sandbox"), None, port=free_port())
    probe = [*json.loads(dockerfile().one("HEALTHCHECK").split(" CMD ", 1)[1]), str(server.pid)]
    try:
        assert server.port != int(dockerfile().one("EXPOSE"))
        checked = subprocess.run(probe, env=image.env, capture_output=True, text=True, timeout=60)
        assert checked.returncode == 0, checked.stderr
        assert "workers confined" in "".join(server.log)
    except BaseException:
        server.stop()
        raise
    exercise(server, open_tmp / "srv/lcp-sandbox/workspaces", f"127.0.0.1:{server.port}", None)


# The image run by `docker run` (Docker's defaults: its seccomp profile, no no_new_privs):
# as its own user, whom Docker gives no capability; as root (--user 0:0), with Docker's
# default capabilities as the Dockerfile lists them.
DOCKER_RUNS = {"image user": lambda: Container(*image_user(), no_new_privs=False),
               "--user 0:0": lambda: Container(0, 0, dockerfile().capabilities(
                   "Docker's default set holds them:"), no_new_privs=False)}


@needs_root
@pytest.mark.parametrize("kind", DOCKER_RUNS)
def test_docker_run_of_the_image_keeps_its_tenants_apart(image, open_tmp, kind):
    container = DOCKER_RUNS[kind]()
    tools = tools_with_probe(image, open_tmp)
    workspaces = open_tmp / "srv/lcp-sandbox/workspaces"
    workspaces.mkdir(mode=0o711)
    os.chown(workspaces, *image_user())
    workspaces.chmod(0o711)
    token = open_tmp / "run/secrets/mcp-token"
    token.parent.mkdir(parents=True)
    token.write_text(TOKEN + "\n")
    os.chown(token, *image_user())
    token.chmod(0o400)
    root = Image(image.venv, open_tmp, image.env)
    cmd = [*dockerfile().exec_form("CMD"), "--timeout", "3"]
    assert str(tools) == root.at(cmd[0])
    env = {**image.env, "HOME": "/root" if container.uid == 0 else "/nonexistent"}
    server = serve(root, cmd, env, str(open_tmp / "srv/lcp-sandbox"), container)
    exercise(server, workspaces, f"127.0.0.1:{server.port}", per_tenant=container.uid == 0)


def pod_volumes(spec: dict, container: dict, where: Path) -> None:
    """The container's volumes as the kubelet makes them: an emptyDir mode 0777 (group
    fsGroup, setgid, when the pod has one), a Secret's files of its defaultMode, the
    group fsGroup."""
    fs_group = spec.get("securityContext", {}).get("fsGroup")
    volumes = {v["name"]: v for v in spec["volumes"]}
    for mount in container["volumeMounts"]:
        path = where / mount["mountPath"].lstrip("/")
        if path.exists():
            continue
        path.mkdir(parents=True)
        volume = volumes[mount["name"]]
        if "emptyDir" in volume:
            os.chown(path, 0, fs_group or 0)
            path.chmod(0o2777 if fs_group else 0o777)
        elif "secret" in volume:
            token = path / "mcp-token"
            token.write_text(TOKEN + "\n")
            os.chown(token, 0, fs_group or 0)
            token.chmod(volume["secret"]["defaultMode"])
            path.chmod(0o755)


@needs_root
@pytest.mark.parametrize("name", MANIFESTS)
def test_the_manifests_pod_runs_and_keeps_its_tenants_apart(image, open_tmp, name):
    """Each container of the Deployment as the kubelet would run it: the init container's
    command, then the server with the manifest's args (the probe library served beside the
    image's tools, and a 3 s timeout, added)."""
    spec = pod_spec(name)
    tools_with_probe(image, open_tmp)
    root = Image(image.venv, open_tmp, image.env)
    fs_group = spec.get("securityContext", {}).get("fsGroup")
    for init in spec.get("initContainers", []):
        pod_volumes(spec, init, open_tmp)
        ctx = effective(spec, init)
        shell = init["command"]
        assert shell[:2] == ["sh", "-c"], shell
        script = " ".join(w if w == "&&" else shlex.quote(root.mapped(w))
                          for w in shlex.split(shell[2]))
        done = subprocess.run(Container(ctx["runAsUser"], ctx["runAsGroup"]).wrap(
            ["sh", "-c", script]), capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
    (server_spec,) = spec["containers"]
    pod_volumes(spec, server_spec, open_tmp)
    ctx = effective(spec, server_spec)
    uid = ctx.get("runAsUser", image_user()[0])
    container = Container(uid, ctx.get("runAsGroup", uid), set(ctx["capabilities"].get("add", [])),
                          no_new_privs=not ctx["allowPrivilegeEscalation"], group=fs_group)
    env = {**image.env, **POD_ENV, "HOME": "/root" if uid == 0 else "/nonexistent",
           "TMPDIR": root.at("/tmp")}
    args = [expand(a, POD_ENV) for a in server_spec["args"]] + ["--timeout", "3"]
    workspaces = Path(root.at(cmd_option(args, "--workspace-root")))
    if spec.get("initContainers"):
        assert stat.S_IMODE(workspaces.stat().st_mode) == 0o711
        assert stat.S_IMODE(Path(root.at("/tmp")).stat().st_mode) == 0o1777
    server = serve(root, args, env, str(open_tmp / "srv/lcp-sandbox"), container)
    exercise(server, workspaces, f"lcp-sandbox.{POD_ENV['POD_NAMESPACE']}.svc:8000",
             per_tenant=uid == 0, pod_host=f"{POD_ENV['POD_IP']}:8000")
