"""Making one environment with uv: resolve, lock, install, wheels only.

    build(store, key, requirements, libraries)      (holding the key's file lock)
        in the builder process (worker/builder.py: Landlock, write only beneath the store,
        uv's cache and its own temp dir):
          uv venv --relocatable                       ─► a fresh environment, in .building/
          uv pip compile --generate-hashes --no-build ─► lock.txt   (the resolution)
          uv pip sync --require-hashes --no-build     ─► exactly the lock, nothing else
        lcp-env.json, then .complete (the lock's sha256), then renamed into place

uv runs in processes of its own, never in a tool worker, with an allowlisted
environment: uv's own settings (``UV_*``: index, find-links, offline, cache...), the
proxy and certificate settings it needs to reach an index, locale and HOME, and
nothing else of the host's (no API keys, no tokens).  Its working directory is the
host's, so a ``uv.toml`` there (and the user's own) is honoured.  ``--no-build``
everywhere: a requirement that has no wheel for this interpreter is refused by uv,
whose own words name it; nothing is ever built from source.
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
from typing import Any, Sequence

from ..boot import boot_argv, boot_environment
from .store import LOCK, MARKER, META, Store, interpreter, lock_digest, pinned

#: What the builder keeps of the host's environment (plus every UV_* and LC_* name).
_KEEP = ("PATH", "HOME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TEMP", "TMP", "SYSTEMROOT",
         "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_CONFIG_DIRS", "SSL_CERT_FILE",
         "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY",
         "NO_PROXY", "http_proxy", "https_proxy", "all_proxy", "no_proxy", "LD_LIBRARY_PATH")
_TIMEOUT_S = 3 * 1800.0
LANDLOCK: list[str] = []                 # what held for the last build (Landlock's report)
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


def build(store: Store, key: str, requirements: Sequence[str], libraries: Sequence[str]) -> str:
    """Make the environment ``key`` of ``requirements`` in ``store`` (the caller holds
    its lock); its folder.  BuildFailed with uv's words when it cannot be made."""
    store.make_dirs()
    store.sweep()
    made = store.building(key)
    tmp = made + "-tmp"
    try:
        uv = uv_binary()
        env = builder_environment()
        os.makedirs(tmp, mode=0o700)
        env["TMPDIR"] = env["TEMP"] = env["TMP"] = tmp
        python = os.path.join(made, _bin(), "python")
        lock = os.path.join(made, LOCK)
        _confined(env, [store.root, _cache_dir(uv, env), tmp], [
            {"argv": [uv, "venv", "--quiet", "--relocatable", "--python", sys.executable, made]},
            {"argv": [uv, "pip", "compile", "-", "--quiet", "--no-header", "--generate-hashes",
                      "--no-build", "--python", python, "-o", lock],
             "stdin": "\n".join(requirements) + "\n"},
            {"argv": [uv, "pip", "sync", "--quiet", "--require-hashes", "--no-build",
                      "--python", python, lock]}])
        text = Path(lock).read_bytes()
        meta = {"key": key, "requirements": list(requirements), "libraries": list(libraries),
                "interpreter": interpreter(), "versions": pinned(text.decode()),
                "built": time.time()}
        Path(made, META).write_text(json.dumps(meta, indent=1), encoding="utf-8")
        Path(made, MARKER).write_text(lock_digest(text), encoding="ascii")   # last
        store.install(key, made)
    finally:
        shutil.rmtree(made, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)
    return store.path(key)


def _bin() -> str:
    return "Scripts" if os.name == "nt" else "bin"


_CACHE_DIRS: dict[tuple[str, str], str] = {}


def _cache_dir(uv: str, env: dict[str, str]) -> str:
    """uv's cache folder under ``env`` (made now: Landlock grants only what exists)."""
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
    return found


def _confined(env: dict[str, str], write: list[str], steps: list[dict[str, Any]]) -> None:
    """Run uv's ``steps`` in the builder process (worker/builder.py): Landlock lets it
    write only beneath ``write``.  BuildFailed with the words of the step that failed."""
    argv = boot_argv("from lcp_sandbox.worker.builder import main; main()", "")
    try:
        done = subprocess.run(argv, input=json.dumps({"write": write, "steps": steps}),
                              env={**env, **boot_environment()}, capture_output=True,
                              text=True, timeout=_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        raise BuildFailed(f"the builder process failed: {exc}") from None
    try:
        answer = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise BuildFailed(f"the builder process ended with status {done.returncode} without "
                          f"an answer: {done.stderr.strip()[-2000:]}") from None
    LANDLOCK[:] = [answer["landlock"]]
    if not answer["landlock"].startswith("on") and not _WARNED:
        _WARNED.append(True)
        log.warning("environment builds run without Landlock here (%s): uv may write beyond "
                    "the store and its cache", answer["landlock"])
    for step, result in zip(steps, answer["results"], strict=False):   # (it stops at a failure)
        if result["rc"]:
            what = " ".join(a for a in step["argv"][1:3] if not a.startswith("-"))
            raise BuildFailed(f"uv {what} said:\n" + (result["words"] or
                                                      f"(nothing; exit status {result['rc']})"))
