"""Making one environment with uv: resolve, lock, install, wheels only.

    build(store, key, requirements, libraries)      (holding the key's file lock)
        each requirement spelled again as core/requirements.py keeps it (a name, extras,
        versions, a marker: nothing else reaches uv)
        in the builder process (worker/builder.py), as the builder's uid on a root host,
        writing only beneath the store's build folder and uv's cache, in its temp dir:
          uv venv --relocatable                       ─► a fresh environment, in .building/
          uv pip compile --generate-hashes --no-build ─► lock.txt   (the resolution)
          uv pip sync --require-hashes --no-build     ─► exactly the lock, nothing else
        lcp-env.json, then .complete (the lock's sha256), then renamed into place

uv runs in processes of its own, never in a tool worker, with an allowlisted
environment: uv's own settings (``UV_*``: index, find-links, offline, cache...), the
proxy and certificate settings it needs to reach an index, locale and HOME, and
nothing else of the host's (no API keys, no tokens).  Its settings are the host's only:
those variables, the user's and the system's ``uv.toml`` (or ``UV_CONFIG_FILE``).  It
runs in its own temp folder, which holds an empty ``uv.toml``: uv looks for a project's
settings from its working folder upward, so neither the host's working folder (a tool's
workspace, perhaps) nor a folder above the store can point it at another index.
``--no-build`` everywhere: a requirement that has no wheel for this interpreter is
refused by uv, whose own words name it; nothing is ever built from source.

On a root host the build runs as ``BUILDER_IDS``, a uid and gid of its own: it reads
only what an unprivileged user may read, as a tenant's worker does.  The store's build
folder and uv's cache are that uid's (mode 0700), so tenants cannot write them; the
user's ``uv.toml`` and ``UV_CONFIG_FILE``, which that uid could not read, are handed to
it as copies in its temp folder.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional, Sequence

from ...core.policy import BUILDER_IDS
from ...core.requirements import DeclarationError, requirement
from ..boot import boot_argv, boot_environment
from .store import LOCK, MARKER, META, Store, interpreter, lock_digest, pinned

#: What the builder keeps of the host's environment (plus every UV_* and LC_* name).
_KEEP = ("PATH", "HOME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TEMP", "TMP", "SYSTEMROOT",
         "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_CONFIG_DIRS", "SSL_CERT_FILE",
         "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY",
         "NO_PROXY", "http_proxy", "https_proxy", "all_proxy", "no_proxy", "LD_LIBRARY_PATH")
_TIMEOUT_S = 3 * 1800.0
#: What held for the last build: Landlock's report, and whom the builder ran as.
LANDLOCK: list[str] = []
RUNS_AS: list[str] = []
_WARNED: list[bool] = []
log = logging.getLogger("lcp_sandbox")


class BuildFailed(Exception):
    """uv refused or failed; the message holds its own words."""


def uv_binary() -> str:
    """The uv executable (the ``envs`` extra installs it)."""
    try:
        import uv
    except ImportError:
        found = shutil.which("uv")
        if found:
            return found
        raise BuildFailed("environments are built by uv, which is not installed: "
                          "pip install 'lcp-sandbox[envs]'") from None
    return str(uv.find_uv_bin())


def builder_environment() -> dict[str, str]:
    """The environment uv runs with: uv's settings and what reaching an index needs."""
    return {k: v for k, v in os.environ.items()
            if k in _KEEP or k.startswith(("UV_", "LC_"))}


def builder_ids() -> Optional[tuple[int, int]]:
    """Whom builds run as: ``BUILDER_IDS`` on a root host, None (the host's uid) else."""
    root = hasattr(os, "geteuid") and os.geteuid() == 0
    return BUILDER_IDS if root else None


def uv_lines(requirements: Sequence[str]) -> str:
    """What uv reads: each requirement in the one spelling core/requirements.py keeps
    (a requirement that is none fails the build here too, whoever asked for it)."""
    try:
        return "".join(requirement(r, "the environment's requirements") + "\n"
                       for r in requirements)
    except DeclarationError as exc:
        raise BuildFailed(str(exc)) from None


def build(store: Store, key: str, requirements: Sequence[str], libraries: Sequence[str]) -> str:
    """Make the environment ``key`` of ``requirements`` in ``store`` (the caller holds
    its lock); its folder.  BuildFailed with uv's words when it cannot be made."""
    lines = uv_lines(requirements)
    store.make_dirs()
    store.sweep()
    ids = builder_ids()
    made = store.building(key)
    tmp = made + "-tmp"
    try:
        uv = uv_binary()
        env = builder_environment()
        building = os.path.dirname(made)
        cache = _cache_dir(uv, env, store, ids)
        os.makedirs(tmp, mode=0o700)
        _settings(env, tmp, ids)
        _give(building, ids)
        _give(tmp, ids, deep=True)
        python = os.path.join(made, _bin(), "python")
        lock = os.path.join(made, LOCK)
        _confined(env, ids, tmp, [building, cache], [os.path.dirname(os.path.realpath(uv))], [
            {"argv": [uv, "venv", "--quiet", "--relocatable", "--python", sys.executable, made]},
            {"argv": [uv, "pip", "compile", "-", "--quiet", "--no-header", "--generate-hashes",
                      "--no-build", "--python", python, "-o", lock], "stdin": lines},
            {"argv": [uv, "pip", "sync", "--quiet", "--require-hashes", "--no-build",
                      "--python", python, lock]}])
        text = Path(lock).read_bytes()
        meta = {"key": key, "requirements": list(requirements), "libraries": list(libraries),
                "interpreter": interpreter(), "versions": pinned(text.decode()),
                "built": time.time()}
        Path(made, META).write_text(json.dumps(meta, indent=1), encoding="utf-8")
        # (last: it says the environment is complete)
        Path(made, MARKER).write_text(lock_digest(text), encoding="ascii")
        store.install(key, made)
    finally:
        shutil.rmtree(made, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)
    return store.path(key)


def _bin() -> str:
    return "Scripts" if os.name == "nt" else "bin"


def _settings(env: dict[str, str], tmp: str, ids: Optional[tuple[int, int]]) -> None:
    """uv's settings, the host's only (see the module's docstring): an empty project
    ``uv.toml`` in its working folder ``tmp``; for another uid, copies of the settings
    files it could not read, and a home of its own in ``tmp``."""
    env["TMPDIR"] = env["TEMP"] = env["TMP"] = tmp
    Path(tmp, "uv.toml").write_text("", encoding="utf-8")
    if ids is None:
        return
    home = env.get("HOME") or os.path.expanduser("~")
    user = os.path.join(env.get("XDG_CONFIG_HOME") or os.path.join(home, ".config"),
                        "uv", "uv.toml")
    config = os.path.join(tmp, "config")
    os.makedirs(os.path.join(config, "uv"), mode=0o700)
    if os.path.isfile(user):
        shutil.copyfile(user, os.path.join(config, "uv", "uv.toml"))
    given = env.get("UV_CONFIG_FILE")
    if given and os.path.isfile(given):
        env["UV_CONFIG_FILE"] = os.path.join(tmp, "uv-config.toml")
        shutil.copyfile(given, env["UV_CONFIG_FILE"])
    env.pop("XDG_CACHE_HOME", None)
    env.update(HOME=tmp, XDG_CONFIG_HOME=config)


def _give(folder: str, ids: Optional[tuple[int, int]], deep: bool = False) -> None:
    """``folder`` (``deep``: and what it holds) to the builder's uid, for it alone (a
    root host)."""
    if ids is None:
        return
    os.chmod(folder, 0o700)
    os.chown(folder, *ids)
    for path, dirs, files in os.walk(folder) if deep else ():
        for name in [*dirs, *files]:
            os.chown(os.path.join(path, name), *ids, follow_symlinks=False)


_CACHE_DIRS: dict[tuple[str, str], str] = {}


def _cache_dir(uv: str, env: dict[str, str], store: Store,
               ids: Optional[tuple[int, int]]) -> str:
    """uv's cache folder for the build (made now: Landlock grants only what exists),
    named in ``env``.  For the builder's uid: ``UV_CACHE_DIR`` if the host set it, else
    the store's own; either is that uid's alone, or BuildFailed says what to do."""
    if ids is not None:
        own = os.path.abspath(env.get("UV_CACHE_DIR") or os.path.join(store.root, ".uv-cache"))
        _owned_cache(own, ids, store)
        env["UV_CACHE_DIR"] = own
        return own
    settings = (uv, json.dumps(sorted(env.items())))
    found = _CACHE_DIRS.get(settings)
    if found is None:
        try:
            done = subprocess.run([uv, "cache", "dir"], env=env, capture_output=True,
                                  text=True, timeout=60, check=True)
        except (OSError, subprocess.SubprocessError) as exc:
            raise BuildFailed(f"uv cache dir failed: {exc}") from None
        found = _CACHE_DIRS[settings] = done.stdout.strip()
    os.makedirs(found, exist_ok=True)
    env["UV_CACHE_DIR"] = found
    return found


def _owned_cache(path: str, ids: tuple[int, int], store: Store) -> None:
    """Make ``path`` the builder uid's, mode 0700, if it is new; an existing one must
    already be that uid's and writable by no one else."""
    try:
        os.mkdir(path, 0o700)
        os.chown(path, *ids)
    except FileExistsError:
        pass
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
        os.mkdir(path, 0o700)
        os.chown(path, *ids)
    st = os.stat(path)
    if st.st_uid != ids[0] or st.st_mode & 0o022:
        raise BuildFailed(
            f"uv's cache {path} is uid {st.st_uid}'s (mode {st.st_mode & 0o777:o}): "
            f"environment builds run as uid {ids[0]}, which alone must write it (tenants "
            f"import what it holds). Give it to that uid (chown -R {ids[0]}:{ids[1]} {path};"
            f" chmod 700 {path}), or leave UV_CACHE_DIR unset (builds then cache in "
            f"{os.path.join(store.root, '.uv-cache')}).")


def _confined(env: dict[str, str], ids: Optional[tuple[int, int]], cwd: str,
              write: list[str], reach: list[str], steps: list[dict[str, Any]]) -> None:
    """Run uv's ``steps`` in the builder process (worker/builder.py): as ``ids`` (None:
    the host's uid), writing only beneath ``write``.  BuildFailed with the words of the
    step that failed, or why the builder refused."""
    argv = boot_argv("from lcp_sandbox.worker.builder import main; main()", "")
    spec = {"write": write, "reach": reach, "run_as": list(ids) if ids else None, "cwd": cwd,
            "steps": steps}
    try:
        done = subprocess.run(argv, input=json.dumps(spec), env={**boot_environment(), **env},
                              capture_output=True, text=True, timeout=_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        raise BuildFailed(f"the builder process failed: {exc}") from None
    try:
        answer = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise BuildFailed(f"the builder process ended with status {done.returncode} without "
                          f"an answer: {done.stderr.strip()[-2000:]}") from None
    LANDLOCK[:] = [answer["landlock"]]
    RUNS_AS[:] = [answer["runs_as"]]
    if not answer["landlock"].startswith("on") and not _WARNED:
        _WARNED.append(True)
        log.warning("environment builds run without Landlock here (%s): uv may write beyond "
                    "the store and its cache", answer["landlock"])
    if answer["refused"]:
        raise BuildFailed(f"nothing was built: {answer['refused']}")
    # (the builder stops at the first step that fails)
    for step, result in zip(steps, answer["results"], strict=False):
        if result["rc"]:
            what = " ".join(a for a in step["argv"][1:3] if not a.startswith("-"))
            raise BuildFailed(f"uv {what} said:\n" + (result["words"] or
                                                      f"(nothing; exit status {result['rc']})"))
