"""``pipmaster`` in a worker: answers from the worker's environment, never runs pip.

lollms tools call ``pipmaster.ensure_packages(...)`` at import.  In-process that installs
into the host's environment; in a worker nothing a tool does may change it.  So the
worker's ``sys.modules["pipmaster"]`` is this stand-in:

    ensure_packages / ensure_requirements / install* (and async_*)
        every requirement satisfied by what the worker can import ─► True
        else ─► NotInEnvironment (an ImportError) naming what is missing and how to declare it
    is_installed / get_installed_version / is_version_* ─► the truth, from the environment
    get_pip_manager(...) and the manager classes ─► an object with the same methods
    uninstall* ─► NotInEnvironment (nothing is removed either)
"""
from __future__ import annotations

import re
import sys
import types
from typing import Any, Optional, Union

# (compiled at first use, by re's cache: a spawned worker imports this module at its start)
_REQ = r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*([^;]*)"
_CLAUSE = r"^\s*(===|==|!=|~=|>=|<=|>|<)\s*([^\s]+)\s*$"
Requirements = Union[str, dict[str, Any], list[str], tuple[str, ...]]


class NotInEnvironment(ImportError):
    """A package a tool asked for is not in its worker's environment."""


_WHERE = {"": "the host's environment"}


def install(environment: Optional[dict[str, Any]]) -> None:
    """Make ``pipmaster`` this stand-in, for a worker of ``environment``."""
    _WHERE[""] = (f"its environment (from {environment.get('where')})"
                  if environment and environment.get("where") else "the host's environment")
    sys.modules["pipmaster"] = MODULE


def version(name: str) -> Optional[str]:
    """The installed version of ``name`` the worker would import, or None."""
    # Here: 20-40 ms to import, only for a tool that asks.
    import importlib.metadata
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _release(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split("+")[0].split("."):
        digits = re.match(r"\d+", piece)
        if digits is None:
            break
        parts.append(int(digits.group()))
        if digits.end() < len(piece):
            break
    return tuple(parts)


def _cmp(a: str, b: str) -> int:
    x, y = _release(a), _release(b)
    width = max(len(x), len(y))
    x, y = x + (0,) * (width - len(x)), y + (0,) * (width - len(y))
    return (x > y) - (x < y)


def satisfies(installed: str, specifier: str) -> bool:
    """Whether version ``installed`` meets ``specifier`` (">=1.2,<2", "==1.*"...)."""
    for clause in filter(None, (c.strip() for c in (specifier or "").split(","))):
        found = re.match(_CLAUSE, clause)
        if found is None:
            return False
        op, want = found.groups()
        if want.endswith(".*"):
            prefix = _release(want[:-2])
            same = _release(installed)[:len(prefix)] == prefix
            if (op == "==") != same:
                return False
            continue
        c = _cmp(installed, want)
        ok = {"==": c == 0, "===": installed == want, "!=": c != 0, ">=": c >= 0, "<=": c <= 0,
              ">": c > 0, "<": c < 0,
              "~=": c >= 0 and _release(installed)[:max(1, len(_release(want)) - 1)]
              == _release(want)[:max(1, len(_release(want)) - 1)]}[op]
        if not ok:
            return False
    return True


def _pairs(requirements: Requirements) -> list[tuple[str, str]]:
    """(name, specifier) of each requirement of any form pipmaster takes."""
    if isinstance(requirements, dict):
        out = []
        for name, spec in requirements.items():
            spec = str(spec or "").strip()
            out.append((str(name), spec if not spec or spec[0] in "=!~<>" else f"=={spec}"))
        return out
    items = [requirements] if isinstance(requirements, str) else list(requirements)
    pairs = []
    for item in items:
        found = re.match(_REQ, str(item))
        if found is None:
            raise NotInEnvironment(f"pipmaster: {item!r} is not a requirement")
        pairs.append((found.group(1), found.group(2).strip()))
    return pairs


def missing(requirements: Requirements) -> list[str]:
    """The requirements the worker's environment does not satisfy, as "name spec (has X)"."""
    out = []
    for name, spec in _pairs(requirements):
        have = version(name)
        if have is None or not satisfies(have, spec):
            out.append(f"{name}{spec}" + (f" ({have} is installed)" if have else ""))
    return out


def ensure(requirements: Requirements, what: str = "ensure_packages") -> bool:
    lacking = missing(requirements)
    if lacking:
        raise NotInEnvironment(
            f"pipmaster.{what}: {', '.join(lacking)} not in {_WHERE['']}. Tools cannot install "
            f"packages in lcp_sandbox: declare them with the library (a '# /// script' block "
            f"with dependencies = [...] in its module, or requirements.txt / pyproject.toml "
            f"beside a folder library, or the host's host_tool_configs[library][\"sandbox\"]"
            f"[\"requirements\"]); the library's environment is built before its workers "
            f"start.")
    return True


def _requirements_file(path: str) -> list[str]:
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    return [ln.split("#")[0].strip() for ln in lines if ln.split("#")[0].strip()
            and not ln.lstrip().startswith("-")]


class Manager:
    """What ``pipmaster.get_pip_manager()`` (and its uv / conda kin) return here."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def ensure_packages(self, requirements: Requirements, *args: Any, **kwargs: Any) -> bool:
        return ensure(requirements)

    def ensure_requirements(self, requirements_file: str, *args: Any, **kwargs: Any) -> bool:
        return ensure(_requirements_file(requirements_file), "ensure_requirements")

    def install(self, package: str, *args: Any, **kwargs: Any) -> bool:
        return ensure(package, "install")

    def install_if_missing(self, package: str, version_specifier: Optional[str] = None,
                           *args: Any, **kwargs: Any) -> bool:
        return ensure({package: version_specifier}, "install_if_missing")

    def install_version(self, package: str, version: str, *args: Any, **kwargs: Any) -> bool:
        return ensure({package: f"=={version}"}, "install_version")

    def install_multiple(self, packages: list[str], *args: Any, **kwargs: Any) -> bool:
        return ensure(list(packages), "install_multiple")

    install_or_update = install
    install_multiple_if_not_installed = install_multiple
    install_or_update_multiple = install_multiple

    def install_requirements(self, requirements_file: str, *args: Any, **kwargs: Any) -> bool:
        return ensure(_requirements_file(requirements_file), "install_requirements")

    def install_edit(self, path: str, *args: Any, **kwargs: Any) -> bool:
        raise NotInEnvironment(f"pipmaster.install_edit({path!r}): tools cannot install "
                               f"packages in lcp_sandbox")

    def uninstall(self, package: str, *args: Any, **kwargs: Any) -> bool:
        raise NotInEnvironment(f"pipmaster.uninstall({package!r}): tools cannot change their "
                               f"environment in lcp_sandbox")

    uninstall_multiple = uninstall

    def is_installed(self, package_name: str, version_specifier: Optional[str] = None) -> bool:
        return not missing({package_name: version_specifier})

    def get_installed_version(self, package_name: str) -> Optional[str]:
        return version(package_name)

    get_current_package_version = get_installed_version

    def is_version_compatible(self, package_name: str, version_specifier: str) -> bool:
        return self.is_installed(package_name, version_specifier)

    def is_version_exact(self, package_name: str, required_version: str) -> bool:
        return version(package_name) == required_version

    def is_version_higher(self, package_name: str, required_version: str) -> bool:
        have = version(package_name)
        return have is not None and _cmp(have, required_version) > 0

    def get_package_info(self, package_name: str) -> Optional[str]:
        have = version(package_name)
        return None if have is None else f"Name: {package_name}\nVersion: {have}"


def _module() -> types.ModuleType:
    mod = types.ModuleType("pipmaster", "lcp_sandbox's pipmaster for tool workers: answers "
                                        "from the worker's environment, never installs.")
    manager = Manager()
    for name in dir(Manager):
        if name.startswith("_"):
            continue
        fn = getattr(manager, name)
        setattr(mod, name, fn)

        async def coroutine(*args: Any, _fn: Any = fn, **kwargs: Any) -> Any:
            return _fn(*args, **kwargs)
        setattr(mod, "async_" + name, coroutine)
    for name in ("PackageManager", "UvPackageManager", "CondaPackageManager",
                 "AsyncPackageManager"):
        setattr(mod, name, Manager)
    for name in ("get_pip_manager", "get_uv_manager", "get_conda_manager",
                 "get_pip_manager_for_version", "get_pip_manager_with_venv",
                 "async_package_manager"):
        setattr(mod, name, Manager)
    mod.NotInEnvironment = NotInEnvironment       # type: ignore[attr-defined]
    return mod


MODULE = _module()
