"""``lcp-sandbox envs``: the libraries' own environments, ahead of their first call.

  lcp-sandbox envs build FOLDER...   build the environment of every library of the folders
                                     that declares dependencies (0: all ready, 1: one failed)
  lcp-sandbox envs list              the store: key, libraries, requirements, versions, size,
                                     last use (--json: as JSON)
  lcp-sandbox envs prune             remove the environments no declaration uses any more
                                     (--dry-run: only say which)

``--store DIR`` (or LCP_SANDBOX_ENVS_DIR) names the store; default: the user's cache folder.
uv's own settings (UV_INDEX_URL, UV_FIND_LINKS, UV_OFFLINE, uv.toml...) apply to builds.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
from typing import Any

from ..backends.envs import Environments
from ..core import discovery
from ..core.outcomes import SandboxEvent
from ..core.requirements import DeclarationError, declared


def add_parser(sub: Any, parents: list) -> None:
    """Add ``envs`` (build, list, prune) to the ``lcp-sandbox`` subcommands."""
    store = argparse.ArgumentParser(add_help=False)
    store.add_argument("--store", metavar="DIR", default=None,
                       help="the store of environments (default: LCP_SANDBOX_ENVS_DIR, else "
                            "<cache folder>/lcp-sandbox/envs)")
    p = sub.add_parser("envs", help="build, list and prune the libraries' own environments",
                       description=__doc__, parents=parents,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    envs = p.add_subparsers(dest="envs_cmd", required=True, metavar="{build,list,prune}")
    b = envs.add_parser("build", help="build the environments the folders' libraries declare",
                        parents=[*parents, store])
    b.add_argument("folders", nargs="+", metavar="FOLDER", help="folder of tool libraries")
    b.set_defaults(fn=cmd_build)
    ls = envs.add_parser("list", help="show the store", parents=[*parents, store])
    ls.add_argument("--json", action="store_true", help="print the store as JSON")
    ls.set_defaults(fn=cmd_list)
    pr = envs.add_parser("prune", help="remove what no library uses", parents=[*parents, store])
    pr.add_argument("--dry-run", action="store_true", help="only print what would be removed")
    pr.set_defaults(fn=cmd_prune)


def cmd_build(args: argparse.Namespace) -> int:
    envs = Environments(args.store, wait_s=24 * 3600.0)
    failed = 0
    for lib in discovery.iter_libraries([os.path.realpath(f) for f in args.folders]):
        try:
            found = declared([str(f) for f in lib.files], str(lib.root) if lib.root else None)
        except DeclarationError as exc:
            print(f"{lib.name}: not built: {exc}")
            failed += 1
            continue
        if found is None or not found.requirements:
            continue
        try:
            built = envs.ensure(found.requirements, found.where, lib.name, "envs build")
        except SandboxEvent as ev:
            print(f"{lib.name}: {ev.result['error']}")
            failed += 1
            continue
        pins = ", ".join(f"{k}=={v}" for k, v in sorted(built.versions.items()))
        print(f"{lib.name}: {built.key} ({pins or 'nothing pinned'}) in {built.prefix}")
    return 1 if failed else 0


def cmd_list(args: argparse.Namespace) -> int:
    entries = Environments(args.store).store.entries()
    if args.json:
        print(json.dumps(entries, indent=2))
        return 0
    for e in entries:
        used = (datetime.datetime.fromtimestamp(e["last_use"]).isoformat(timespec="seconds")
                if e["last_use"] else "never")
        pins = ", ".join(f"{k}=={v}" for k, v in sorted(e["versions"].items()))
        print(f"{e['key']}  {'complete' if e['complete'] else 'INCOMPLETE'}  "
              f"{_size(e['size'])}  last use {used}\n"
              f"    requirements: {', '.join(e['requirements']) or '-'}\n"
              f"    resolved:     {pins or '-'}\n"
              f"    libraries:    {', '.join(e['libraries']) or '-'}")
    if not entries:
        print(f"no environments in {Environments(args.store).store.root}")
    return 0


def cmd_prune(args: argparse.Namespace) -> int:
    envs = Environments(args.store)
    keys = envs.unused() if args.dry_run else envs.prune()
    for key in keys:
        print(("would remove " if args.dry_run else "removed ") + envs.store.path(key))
    if not keys:
        print("nothing to remove")
    return 0


def _size(n: int) -> str:
    return f"{n / 1048576:.1f} MB" if n >= 1048576 else f"{n / 1024:.0f} kB"
