"""Offline wheels and tool libraries for the tests of per-library environments.

``wheel(folder, name, version, source)`` (the benchmark's) writes a pure-Python wheel (a
zip with its dist-info: METADATA, WHEEL, RECORD) into ``folder``; ``offline_uv(house,
cache)`` (the benchmark's too) points uv at that folder only (UV_FIND_LINKS, UV_NO_INDEX,
UV_OFFLINE) with a cache of the test's own, so nothing reaches a network or the user's cache.
"""
from __future__ import annotations

import tarfile
import textwrap
from pathlib import Path

from benchmarks.envs import offline_uv, wheel  # noqa: F401  (the tests' too)


def sdist(folder: Path, name: str, version: str) -> Path:
    """A source distribution only (never to be built)."""
    src = folder / f"{name}-{version}"
    src.mkdir()
    (src / "setup.py").write_text("raise SystemExit('an sdist was built')\n")
    out = folder / f"{name}-{version}.tar.gz"
    with tarfile.open(out, "w:gz") as tar:
        tar.add(src, arcname=src.name)
    return out


def wheelhouse(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for version in ("1.0", "2.0"):
        wheel(folder, "alpha", version, f"V = {version!r}\n")
    wheel(folder, "beta", "1.0", "import alpha\nV = '1.0'\n", requires=("alpha>=2",))
    wheel(folder, "msgpack", "0.0.1", "V = 'not the engine\\'s'\n")
    for i in range(5):
        wheel(folder, f"five{i}", "1.0", f"N = {i}\n")
    sdist(folder, "onlysdist", "1.0")
    return folder


VERSION_TOOL = '''
import sys
import alpha


def tool_{name}() -> dict:
    """The alpha this library sees."""
    return {{"version": alpha.V, "file": alpha.__file__, "prefix": sys.prefix}}
'''

PLAIN_TOOL = '''
def tool_plain() -> dict:
    """Tries to import alpha, declared by none of its files."""
    try:
        import alpha
    except ImportError as exc:
        return {"imported": False, "why": str(exc)}
    return {"imported": True, "file": alpha.__file__}
'''


def script_block(*requirements: str) -> str:
    deps = ", ".join(repr(r) for r in requirements)
    return f"# /// script\n# dependencies = [{deps}]\n# ///\n"


def library(folder: Path, name: str, source: str, block: str = "",
            requirements_txt: str = "") -> Path:
    """A folder library ``folder/name/name.py`` (with a requirements.txt when given)."""
    lib = folder / name
    lib.mkdir(parents=True, exist_ok=True)
    (lib / f"{name}.py").write_text(block + textwrap.dedent(source))
    if requirements_txt:
        (lib / "requirements.txt").write_text(requirements_txt)
    return lib
