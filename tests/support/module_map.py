"""docs/internals.md's table of the modules, made from the modules' own docstrings.

    python tests/support/module_map.py            # print the table (Markdown)
    python tests/support/module_map.py --write    # put it into docs/internals.md

Each row is a module's path and the first sentence of its docstring, floor by floor as
tests/project/test_layout.py orders them: a module added, moved or removed, or a docstring
changed, changes the table, and tests/project/test_layout.py fails until the page is rewritten.
"""
from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PKG = REPO / "lcp_sandbox"
PAGE = REPO / "docs" / "internals.md"
COMMAND = "python tests/support/module_map.py --write"
BEGIN = f"<!-- module table: made by `{COMMAND}` from the modules' docstrings -->"
END = "<!-- end of module table -->"
#: The floors, top to bottom, and what each holds (tests/project/test_layout.py's order).
FLOORS = [("", "the package: the public API, test hooks"),
          ("fronts", "on the binding"), ("lollms_bindings", "the folder lollms loads the binding from"),
          ("binding", "the LCP surface"), ("backends", "what runs a binding's libraries"),
          ("worker", "runs in the worker and the zygote"),
          ("system", "what the operating system tells, both sides"),
          ("core", "pure: no processes"), ("protocol", "shared: the wire")]


def summary(path: Path) -> str:
    """The first sentence of the module's docstring, on one line."""
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    first = " ".join(doc.strip().split("\n\n")[0].split())
    sentence = re.split(r"(?<=[.!?])\s(?=[A-Z`(])", first, maxsplit=1)[0]
    return sentence.replace("``", "`").replace("|", "\\|")


def render() -> str:
    rows = ["| module | what it is |", "|---|---|"]
    for floor, holds in FLOORS:
        top = PKG / floor if floor else PKG
        paths = sorted(top.rglob("*.py")) if floor else sorted(top.glob("*.py"))
        rows.append(f"| **`{floor or 'lcp_sandbox'}/`** | **{holds}** |")
        for path in paths:
            rows.append(f"| `{path.relative_to(PKG).as_posix()}` | {summary(path)} |")
    return "\n".join(rows)


def page_table(page: str) -> "str | None":
    if BEGIN not in page or END not in page:
        return None
    return page.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n")


def write() -> None:
    page = PAGE.read_text(encoding="utf-8")
    head, rest = page.split(BEGIN, 1)
    PAGE.write_text(f"{head}{BEGIN}\n{render()}\n{END}{rest.split(END, 1)[1]}", encoding="utf-8")


if __name__ == "__main__":
    write() if sys.argv[1:] == ["--write"] else print(render())
