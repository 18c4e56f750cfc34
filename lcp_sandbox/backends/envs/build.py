"""Making one environment with uv: resolve, lock, install, wheels only.

    build(store, key, requirements, libraries)      (holding the key's file lock)
        uv pip compile --generate-hashes --no-build   ─► lock.txt   (the resolution)
        uv venv --relocatable                         ─► a fresh environment, beside the store
        uv pip sync --require-hashes --no-build       ─► exactly the lock, nothing else
        lcp-env.json, then .complete (the lock's sha256), then renamed into place

uv runs in a process of its own, never in a tool worker, with an allowlisted
environment: uv's own settings (``UV_*``: index, find-links, offline, cache...), the
proxy and certificate settings it needs to reach an index, locale and HOME, and
nothing else of the host's (no API keys, no tokens).  Its working directory is the
host's, so a ``uv.toml`` there (and the user's own) is honoured.  ``--no-build``
everywhere: a requirement that has no wheel for this interpreter is refused by uv,
whose own words name it; nothing is ever built from source.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

from .store import LOCK, MARKER, META, Store, interpreter, lock_digest, pinned

#: What the builder keeps of the host's environment (plus every UV_* and LC_* name).
_KEEP = ("PATH", "HOME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TEMP", "TMP", "SYSTEMROOT",
         "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_CONFIG_DIRS", "SSL_CERT_FILE",
         "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY",
         "NO_PROXY", "http_proxy", "https_proxy", "all_proxy", "no_proxy", "LD_LIBRARY_PATH")
_TIMEOUT_S = 1800.0


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
    try:
        uv = uv_binary()
        env = builder_environment()
        python = sys.executable
        _run([uv, "venv", "--quiet", "--relocatable", "--python", python, made], env, None)
        lock = os.path.join(made, LOCK)
        _run([uv, "pip", "compile", "-", "--quiet", "--no-header", "--generate-hashes",
              "--no-build", "--python", os.path.join(made, _bin(), "python"), "-o", lock],
             env, "\n".join(requirements) + "\n")
        _run([uv, "pip", "sync", "--quiet", "--require-hashes", "--no-build",
              "--python", os.path.join(made, _bin(), "python"), lock], env, None)
        text = Path(lock).read_bytes()
        meta = {"key": key, "requirements": list(requirements), "libraries": list(libraries),
                "interpreter": interpreter(), "versions": pinned(text.decode()),
                "built": time.time()}
        Path(made, META).write_text(json.dumps(meta, indent=1), encoding="utf-8")
        Path(made, MARKER).write_text(lock_digest(text), encoding="ascii")   # last
        store.install(key, made)
    finally:
        shutil.rmtree(made, ignore_errors=True)
    return store.path(key)


def _bin() -> str:
    return "Scripts" if os.name == "nt" else "bin"


def _run(argv: list[str], env: dict[str, str], stdin: Optional[str]) -> None:
    try:
        done = subprocess.run(argv, input=stdin, env=env, capture_output=True, text=True,
                              timeout=_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise BuildFailed(f"uv {argv[1]} ran for over {_TIMEOUT_S:g} s and was stopped") \
            from None
    except OSError as exc:
        raise BuildFailed(f"uv could not be run: {exc}") from None
    if done.returncode:
        words = (done.stderr or done.stdout).strip()
        raise BuildFailed(words or f"uv {argv[1]} exited with status {done.returncode}")
