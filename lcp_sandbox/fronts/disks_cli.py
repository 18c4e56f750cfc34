"""``lcp-sandbox disks``: the tenant disks (``"disk_mb"``) under a tenants_root.

  lcp-sandbox disks list ROOT     each disk whose image is in ROOT: its tenant root, size, what
                                  its sparse image takes, mounted or not, its loop devices and
                                  how many processes use it (--json: as JSON)
  lcp-sandbox disks prune ROOT    free the disks no process uses: unmount the mounted ones,
                                  detach loop devices left without a mount, delete the images
                                  whose tenant root is gone (--dry-run: only say which)

ROOT is the supervisor's ``tenants_root`` (serve-mcp: its --workspace-root).  A disk is in
use while a process has its working folder, its root or an open file on it, or a mount
namespace of its own that mounts it (a fresh confined worker's): so the disk of a tenant
with a live worker is never pruned, whichever host started that worker.  Unmounting needs
root; a supervisor mounts a pruned disk again for its tenant's next worker.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from ..backends.local.confine import disks


def add_parser(sub: Any, parents: list) -> None:
    """Add ``disks`` (list, prune) to the ``lcp-sandbox`` subcommands."""
    p = sub.add_parser("disks", help="list and prune the tenant disks under a tenants_root",
                       description=__doc__, parents=parents,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    cmds = p.add_subparsers(dest="disks_cmd", required=True, metavar="{list,prune}")
    ls = cmds.add_parser("list", help="show the tenant disks and their state", parents=parents)
    ls.add_argument("root", metavar="ROOT", help="the tenants_root (serve-mcp: --workspace-root)")
    ls.add_argument("--json", action="store_true", help="print the disks as JSON")
    ls.set_defaults(fn=cmd_list)
    pr = cmds.add_parser("prune", help="free the disks no process uses", parents=parents)
    pr.add_argument("root", metavar="ROOT", help="the tenants_root (serve-mcp: --workspace-root)")
    pr.add_argument("--dry-run", action="store_true", help="only print what would be done")
    pr.set_defaults(fn=cmd_prune)


def _not_a_folder(root: str) -> bool:
    if os.path.isdir(root):
        return False
    print(f"lcp-sandbox disks: {root!r} is not a folder", file=sys.stderr)
    return True


def describe(disk: dict[str, Any]) -> str:
    """One line about ``disk``."""
    state = (f"mounted ({', '.join(disk['loops'])})" if disk["mounted"] else
             f"not mounted, loop {', '.join(disk['loops'])} still attached" if disk["loops"] else
             "not mounted")
    users = f", used by {len(disk['users'])} processes" if disk["users"] else ", unused"
    gone = "" if disk["exists"] else " (its root is gone)"
    return (f"{disk['root']}{gone}: {disk['size_mb']:g} MB, image takes "
            f"{disk['used_mb']:.1f} MB; {state}{users}")


def cmd_list(args: argparse.Namespace) -> int:
    if _not_a_folder(args.root):
        return 2
    found = disks.on_disk(args.root)
    if args.json:
        print(json.dumps(found, indent=2))
        return 0
    for disk in found:
        print(describe(disk))
    return 0


def cmd_prune(args: argparse.Namespace) -> int:
    """0 when every disk no process uses was freed; 1 when one could not be."""
    if _not_a_folder(args.root):
        return 2
    failed = 0
    for disk, done in disks.prune(args.root, args.dry_run):
        failed += done.startswith("kept: ") and not disk["users"]
        print(f"{disk['root']}: {'would be ' if args.dry_run else ''}{done}")
    return 1 if failed else 0
