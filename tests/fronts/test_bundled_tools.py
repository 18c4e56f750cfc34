"""Integration tests of the bundled tool libraries (tools/) run through the real engine.

Every call goes through SandboxedBinding: discovery, a worker process per
library, result normalization, and confirm handlers relayed back to this
process.  One Supervisor (one zygote) is shared by the whole module; bindings
that need their own host config get their own tenant, hence their own workers.
Each test works in its own workspace (``workspace=`` of the call or of the
binding), with an ``outside`` folder next to it as the escape target.
"""
from __future__ import annotations

import itertools
import sqlite3
from pathlib import Path

import pytest
from conftest import REPO

from lcp_sandbox import SandboxedBinding, Supervisor

TOOLS = REPO / "tools"
_tenants = itertools.count()


# ---------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def supervisor():
    sup = Supervisor()
    yield sup
    sup.close()


def make_binding(supervisor, workspace, host_tool_configs=None, confirm_handler=None):
    return SandboxedBinding(tools_folders=[str(TOOLS)], host_tool_configs=host_tool_configs or {},
                            confirm_handler=confirm_handler, workspace=str(workspace),
                            supervisor=supervisor, tenant=f"t{next(_tenants)}", timeout_s=30)


@pytest.fixture(scope="module")
def binding(supervisor, tmp_path_factory):
    """Default host config, no confirm handler; tests pass their workspace per call."""
    b = make_binding(supervisor, tmp_path_factory.mktemp("default_ws"))
    yield b
    b.close()


@pytest.fixture
def ws(tmp_path):
    """(workspace, outside): a workspace folder and a sibling folder outside it."""
    workspace = tmp_path / "ws"
    outside = tmp_path / "outside"
    workspace.mkdir()
    outside.mkdir()
    (outside / "secret.txt").write_text("TOP SECRET")
    return workspace, outside


@pytest.fixture
def call(binding, ws):
    workspace = ws[0]

    def _call(tool, **params):
        return binding.execute_tool(tool, params, workspace=str(workspace))
    return _call


@pytest.fixture
def bindings(supervisor):
    """Factory of extra bindings (own tenant, own host config); all closed after the test."""
    made = []

    def _make(workspace, host_tool_configs=None, confirm_handler=None):
        b = make_binding(supervisor, workspace, host_tool_configs, confirm_handler)
        made.append(b)
        return b
    yield _make
    for b in made:
        b.close()


class Recorder:
    """A confirm handler (runs in this process) that records its calls and replays decisions."""

    def __init__(self, *decisions):
        self.decisions = list(decisions)
        self.calls = []

    def __call__(self, source, script_label, argv=None):
        self.calls.append((source, script_label, argv))
        decision = self.decisions.pop(0) if len(self.decisions) > 1 else self.decisions[0]
        if isinstance(decision, BaseException):
            raise decision
        return decision


def ok(result):
    assert result.get("success") is True, result
    assert result["status_code"] == 200
    return result["output"]


def failed(result):
    assert result.get("success") is False, result
    assert result["status_code"] == 500
    assert isinstance(result["error"], str) and result["error"]
    assert "successfully" not in str(result["output"])
    return result["error"]


# ---------------------------------------------------------------- discovery
def test_discovery_schemas_and_prompt_providers(binding):
    specs = {s["name"]: s for s in binding.discovered_tools}
    assert {"tool_list_files", "tool_read_file", "tool_write_file", "tool_find_files",
            "tool_execute_query", "tool_list_tables", "tool_describe_table",
            "tool_delete_file", "tool_move_file", "tool_file_info"} <= set(specs)
    # Library contexts are not tools.
    assert "tool_database_ops_prompt" not in specs and "tool_risky_ops_prompt" not in specs
    props = specs["tool_list_files"]["input_schema"]["properties"]
    assert props["recursive"]["type"] == "boolean" and props["recursive"]["default"] is False
    assert props["max_results"]["type"] == "integer" and props["max_results"]["default"] == 200
    assert props["directory"]["description"].startswith("Workspace-relative directory")
    q = specs["tool_execute_query"]["input_schema"]
    assert q["required"] == ["database_name", "query"]
    assert q["properties"]["parameters"]["type"] == "array"
    for spec in specs.values():
        assert spec["description"] and spec["description"] != "No description provided."


# ---------------------------------------------------------------- workspace_tools
def test_write_list_read_roundtrip(call, ws):
    workspace, _ = ws
    out = ok(call("tool_write_file", file_name="notes/day1.txt", content="héllo\nworld\n"))
    assert "Created 'notes/day1.txt'" in out
    assert (workspace / "notes" / "day1.txt").read_text(encoding="utf-8") == "héllo\nworld\n"

    listing = ok(call("tool_list_files", directory=".", recursive=True))
    assert [(e["path"], e["type"]) for e in listing["entries"]] == [
        ("notes", "directory"), ("notes/day1.txt", "file")]
    assert listing["entries"][1]["size"] == len("héllo\nworld\n".encode())

    res = call("tool_read_file", file_name="notes/day1.txt")
    assert ok(res) == "héllo\nworld\n"
    assert res["context_files"] == [str((workspace / "notes" / "day1.txt").resolve())]

    # Absolute paths inside the workspace are fine.
    assert ok(call("tool_read_file", file_name=str(workspace / "notes" / "day1.txt"))) == "héllo\nworld\n"


@pytest.mark.parametrize("tool,params", [
    ("tool_read_file", {"file_name": "../outside/secret.txt"}),
    ("tool_read_file", {"file_name": "notes/../../outside/secret.txt"}),
    ("tool_write_file", {"file_name": "../outside/pwned.txt", "content": "x"}),
    ("tool_list_files", {"directory": ".."}),
    ("tool_find_files", {"pattern": "*", "directory": "../outside"}),
])
def test_dotdot_escape_refused(call, ws, tool, params):
    _, outside = ws
    error = failed(call(tool, **params))
    named = params.get("file_name") or params.get("directory")
    assert f"'{named}'" in error and "outside the workspace" in error
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]


@pytest.mark.parametrize("tool,key", [("tool_read_file", "file_name"), ("tool_write_file", "file_name"),
                                      ("tool_list_files", "directory"), ("tool_find_files", "directory")])
def test_absolute_path_outside_refused(call, ws, tool, key):
    _, outside = ws
    target = str(outside / "secret.txt") if key == "file_name" else str(outside)
    params = {key: target}
    if tool == "tool_write_file":
        params["content"] = "overwritten"
    if tool == "tool_find_files":
        params["pattern"] = "*"
    error = failed(call(tool, **params))
    assert target in error and "outside the workspace" in error
    assert (outside / "secret.txt").read_text() == "TOP SECRET"
    # /etc/passwd-style absolute paths too.
    assert "outside the workspace" in failed(call("tool_read_file", file_name="/etc/passwd"))


def test_symlinks_pointing_out_refused(call, ws):
    workspace, outside = ws
    (workspace / "link.txt").symlink_to(outside / "secret.txt")
    (workspace / "linkdir").symlink_to(outside, target_is_directory=True)
    (workspace / "dangling.txt").symlink_to(outside / "created_by_write.txt")
    (workspace / "real.txt").write_text("inside")
    (workspace / "inner_link.txt").symlink_to(workspace / "real.txt")

    for tool, params in [("tool_read_file", {"file_name": "link.txt"}),
                         ("tool_read_file", {"file_name": "linkdir/secret.txt"}),
                         ("tool_write_file", {"file_name": "link.txt", "content": "x"}),
                         ("tool_write_file", {"file_name": "linkdir/new.txt", "content": "x"}),
                         ("tool_write_file", {"file_name": "dangling.txt", "content": "x"}),
                         ("tool_list_files", {"directory": "linkdir"})]:
        error = failed(call(tool, **params))
        name = params.get("file_name") or params.get("directory")
        assert f"'{name}'" in error and "symlink pointing outside the workspace" in error, (tool, error)
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]
    assert (outside / "secret.txt").read_text() == "TOP SECRET"

    # A link whose target is inside the workspace is fine.
    assert ok(call("tool_read_file", file_name="inner_link.txt")) == "inside"

    # Listings show links without following them; searches never go through them.
    listing = ok(call("tool_list_files", recursive="true"))
    by_path = {e["path"]: e for e in listing["entries"]}
    assert by_path["linkdir"]["type"] == "symlink" and by_path["linkdir"]["points_outside_workspace"]
    assert by_path["inner_link.txt"]["points_outside_workspace"] is False
    assert not any(p.startswith("linkdir/") for p in by_path)
    found = ok(call("tool_find_files", pattern="*secret*"))
    assert found["matches"] == []


def test_coercion_of_string_arguments(call, ws):
    workspace, _ = ws
    for i in range(5):
        (workspace / "d" / f"sub{i}").mkdir(parents=True)
        (workspace / "d" / f"sub{i}" / f"f{i}.txt").write_text(f"file {i}")

    flat = ok(call("tool_list_files", directory="d", recursive="false"))
    assert flat["count"] == 5 and not flat["recursive"]
    deep = ok(call("tool_list_files", directory="d", recursive="TRUE", max_results="7"))
    assert deep["recursive"] is True and deep["count"] == 7 and deep["truncated"] is True
    assert ok(call("tool_list_files", directory="d", recursive="yes", max_results="20.0"))["count"] == 10
    # Garbage falls back to the default (200), zero/negative is clamped to 1.
    assert ok(call("tool_list_files", directory="d", recursive=1, max_results="lots"))["count"] == 10
    assert ok(call("tool_list_files", directory="d", max_results="-3"))["count"] == 1

    found = ok(call("tool_find_files", pattern="*.txt", max_results="2"))
    assert found["count"] == 2 and found["truncated"] is True

    ok(call("tool_write_file", file_name="log.txt", content="a"))
    ok(call("tool_write_file", file_name="log.txt", content="b", append="true"))
    assert (workspace / "log.txt").read_text() == "ab"
    error = failed(call("tool_write_file", file_name="log.txt", content="c", overwrite="false"))
    assert "already exists" in error and (workspace / "log.txt").read_text() == "ab"
    ok(call("tool_write_file", file_name="log.txt", content="c", append="no", overwrite="1"))
    assert (workspace / "log.txt").read_text() == "c"


def test_read_limits_and_offsets(call, ws):
    workspace, _ = ws
    (workspace / "big.txt").write_text("0123456789" * 3)
    first = ok(call("tool_read_file", file_name="big.txt", max_bytes="12"))
    assert first.startswith("012345678901") and "offset=12" in first and "of 30" in first
    rest = ok(call("tool_read_file", file_name="big.txt", max_bytes="100", offset="12"))
    assert rest == ("0123456789" * 3)[12:]
    # A multi-byte character cut by the limit is not mangled: the next offset starts on it.
    (workspace / "utf.txt").write_text("abcé" + "z" * 10, encoding="utf-8")      # 15 bytes
    part = ok(call("tool_read_file", file_name="utf.txt", max_bytes=4))
    assert part.startswith("abc\n") and "bytes 0-3 of 15" in part and "offset=3" in part
    assert ok(call("tool_read_file", file_name="utf.txt", offset=3, max_bytes=100)) == "é" + "z" * 10
    # Binary files are described, not dumped.
    (workspace / "blob.bin").write_bytes(b"\x00\x01\x02" * 10)
    assert "Binary file 'blob.bin' (30 bytes)" in ok(call("tool_read_file", file_name="blob.bin"))
    assert "not found" in failed(call("tool_read_file", file_name="missing.txt"))
    assert "not a regular file" in failed(call("tool_read_file", file_name="."))


def test_find_files_patterns_and_contents(call, ws):
    workspace, _ = ws
    (workspace / "src" / "pkg").mkdir(parents=True)
    (workspace / "src" / "main.py").write_text("import os\nprint('TODO later')\n")
    (workspace / "src" / "pkg" / "util.py").write_text("def f():\n    return 1\n")
    (workspace / "README.md").write_text("todo: docs")
    (workspace / "__pycache__").mkdir()
    (workspace / "__pycache__" / "cached.py").write_text("")

    assert ok(call("tool_find_files", pattern="*.py"))["matches"] == ["src/main.py", "src/pkg/util.py"]
    assert ok(call("tool_find_files", pattern="src/*.py"))["matches"] == ["src/main.py"]
    assert ok(call("tool_find_files", pattern="./src/**/*.py"))["matches"] == ["src/main.py", "src/pkg/util.py"]
    assert ok(call("tool_find_files", pattern="*.PY", case_sensitive="true"))["matches"] == []
    assert ok(call("tool_find_files", pattern="*", contains="todo"))["matches"] == ["README.md", "src/main.py"]
    assert ok(call("tool_find_files", pattern="*", contains="TODO", case_sensitive=True))["matches"] == [
        "src/main.py"]
    assert ok(call("tool_find_files", pattern="*.py", directory="src/pkg"))["matches"] == ["src/pkg/util.py"]


# ---------------------------------------------------------------- database_ops
def make_db(path: Path) -> Path:
    conn = sqlite3.connect(path)
    conn.executescript("""
        CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT NOT NULL, city TEXT DEFAULT 'Paris');
        CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER REFERENCES customers(id),
                             total REAL, receipt BLOB);
        CREATE INDEX orders_by_customer ON orders(customer_id);
        CREATE VIEW big_orders AS SELECT * FROM orders WHERE total > 100;
        INSERT INTO customers (name, city) VALUES ('Ada', 'London'), ('Linus', 'Helsinki'), ('Grace', 'NYC');
        INSERT INTO orders (customer_id, total, receipt) VALUES (1, 50.5, x'00ff'), (1, 150, NULL), (2, 300, NULL);
    """)
    conn.commit()
    conn.close()
    return path


def rows_of(path: Path, sql: str):
    conn = sqlite3.connect(path)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def test_database_queries(call, ws):
    workspace, _ = ws
    make_db(workspace / "shop.db")
    tables = ok(call("tool_list_tables", database_name="shop.db"))["tables"]
    assert tables == [{"name": "customers", "type": "table", "rows": 3},
                      {"name": "orders", "type": "table", "rows": 3},
                      {"name": "big_orders", "type": "view"}]

    desc = ok(call("tool_describe_table", database_name="shop.db", table_name="orders"))
    assert [c["name"] for c in desc["columns"]] == ["id", "customer_id", "total", "receipt"]
    assert desc["columns"][0]["primary_key"] is True
    assert desc["indexes"] == [{"name": "orders_by_customer", "unique": False}]
    assert desc["foreign_keys"] == [{"column": "customer_id", "references": "customers(id)"}]
    assert desc["rows"] == 3 and desc["sql"].startswith("CREATE TABLE orders")
    cust = ok(call("tool_describe_table", database_name="shop.db", table_name="customers"))
    assert cust["columns"][1] == {"name": "name", "type": "TEXT", "not_null": True, "default": None,
                                  "primary_key": False}
    assert cust["columns"][2]["default"] == "'Paris'"
    error = failed(call("tool_describe_table", database_name="shop.db", table_name="nope"))
    assert "Table 'nope' not found" in error and "customers" in error

    res = ok(call("tool_execute_query", database_name="shop.db",
                  query="SELECT c.name, SUM(o.total) AS spent FROM customers c JOIN orders o "
                        "ON o.customer_id = c.id GROUP BY c.id ORDER BY spent DESC"))
    assert res == {"columns": ["name", "spent"], "rows": [["Linus", 300.0], ["Ada", 200.5]],
                   "row_count": 2, "truncated": False}
    # Bound parameters, as a list or as JSON text; blobs are summarized; max_rows coerced.
    res = ok(call("tool_execute_query", database_name="shop.db",
                  query="SELECT id, receipt FROM orders WHERE total > ? ORDER BY id", parameters=[10]))
    assert res["rows"] == [[1, "<BLOB 2 bytes>"], [2, None], [3, None]]
    res = ok(call("tool_execute_query", database_name="shop.db",
                  query="SELECT name FROM customers WHERE city = ?", parameters='["NYC"]'))
    assert res["rows"] == [["Grace"]]
    res = ok(call("tool_execute_query", database_name="shop.db", query="SELECT * FROM customers",
                  max_rows="2"))
    assert res["row_count"] == 2 and res["truncated"] is True

    assert failed(call("tool_execute_query", database_name="shop.db",
                       query="SELEC * FROM customers")).startswith("SQL Error: near \"SELEC\"")
    assert "not found" in failed(call("tool_execute_query", database_name="nope.db", query="SELECT 1"))
    assert not (workspace / "nope.db").exists()
    assert "not valid JSON" in failed(call("tool_execute_query", database_name="shop.db",
                                           query="SELECT ?", parameters="[1,"))


@pytest.mark.parametrize("query", [
    "INSERT INTO customers (name) VALUES ('Mallory')",
    "UPDATE orders SET total = 0",
    "DELETE FROM orders",
    "DROP TABLE orders",
    "CREATE TABLE evil (x)",
    "PRAGMA user_version = 7",
])
def test_database_write_refused_by_default(call, ws, query):
    workspace, _ = ws
    db = make_db(workspace / "shop.db")
    before = rows_of(db, "SELECT * FROM orders"), rows_of(db, "PRAGMA user_version")
    error = failed(call("tool_execute_query", database_name="shop.db", query=query))
    assert "read-only" in error and "allow_writes" in error
    assert (rows_of(db, "SELECT * FROM orders"), rows_of(db, "PRAGMA user_version")) == before
    assert [t for (t,) in rows_of(db, "SELECT name FROM sqlite_master WHERE type='table'")] == [
        "customers", "orders"]


def test_database_cannot_reach_outside(call, ws):
    workspace, outside = ws
    make_db(workspace / "shop.db")
    make_db(outside / "other.db")
    for name in ("../outside/other.db", str(outside / "other.db")):
        for tool, extra in [("tool_execute_query", {"query": "SELECT 1"}), ("tool_list_tables", {}),
                            ("tool_describe_table", {"table_name": "orders"})]:
            error = failed(call(tool, database_name=name, **extra))
            assert f"'{name}'" in error and "outside the workspace" in error
    # ATTACH (and VACUUM INTO, which attaches its target) are denied: no file appears outside.
    for query in (f"ATTACH DATABASE '{outside / 'other.db'}' AS o",
                  f"ATTACH DATABASE '{outside / 'new.db'}' AS o",
                  f"VACUUM INTO '{outside / 'copy.db'}'"):
        error = failed(call("tool_execute_query", database_name="shop.db", query=query))
        assert "ATTACH is not allowed" in error, error
    assert sorted(p.name for p in outside.iterdir()) == ["other.db", "secret.txt"]


def test_database_library_context(bindings, ws):
    workspace, _ = ws
    make_db(workspace / "shop.db")
    make_db(workspace / "archive.sqlite")
    (workspace / "notes.txt").write_text("not a db")
    b = bindings(workspace)
    text = b.library_context("database_ops")
    assert text.startswith("Active workspace SQLite databases available: archive.sqlite, shop.db.")
    assert "read-only" in text and "notes.txt" not in text
    # Empty workspace.
    empty = workspace / "empty"
    empty.mkdir()
    b.workspace = str(empty)
    assert "available: None." in b.library_context("database_ops")
    assert b.library_context("no_such_library") is None


def test_database_writes_when_host_allows(bindings, ws):
    workspace, outside = ws
    db = make_db(workspace / "shop.db")
    b = bindings(workspace, {"database_ops": {"allow_writes": "true"}})
    assert "read-write" in b.library_context("database_ops")
    res = ok(b.execute_tool("tool_execute_query", {
        "database_name": "shop.db", "query": "INSERT INTO customers (name, city) VALUES (?, ?)",
        "parameters": ["Margaret", "Boston"]}))
    assert res["rows_affected"] == 1 and res["columns"] == []
    assert rows_of(db, "SELECT name FROM customers WHERE city = 'Boston'") == [("Margaret",)]
    res = ok(b.execute_tool("tool_execute_query", {"database_name": "shop.db",
                                                   "query": "UPDATE orders SET total = total * 2"}))
    assert res["rows_affected"] == 3
    # A new database may be created in the workspace...
    ok(b.execute_tool("tool_execute_query", {"database_name": "fresh.db", "query": "CREATE TABLE t (x)"}))
    assert rows_of(workspace / "fresh.db", "SELECT name FROM sqlite_master") == [("t",)]
    # ... but never outside it, and ATTACH stays denied.
    assert "outside the workspace" in failed(b.execute_tool("tool_execute_query", {
        "database_name": "../outside/fresh.db", "query": "CREATE TABLE t (x)"}))
    assert "ATTACH is not allowed" in failed(b.execute_tool("tool_execute_query", {
        "database_name": "shop.db", "query": f"ATTACH DATABASE '{outside / 'x.db'}' AS x"}))
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]


# ---------------------------------------------------------------- risky_ops
def risky_binding(bindings, workspace, level, handler, **extra_cfg):
    cfg = {"risky_ops": {"autonomy_level": level, **extra_cfg}} if level is not None else {}
    return bindings(workspace, cfg, handler)


def delete(b, name):
    return b.execute_tool("tool_delete_file", {"file_name": name})


def test_safe_mode_asks_for_risky_actions_only(bindings, ws):
    workspace, _ = ws
    (workspace / "a.txt").write_text("12345")
    handler = Recorder(("allow", ""))
    b = risky_binding(bindings, workspace, "safe", handler)

    info = ok(b.execute_tool("tool_file_info", {"file_name": "a.txt"}))
    assert info["size"] == 5 and info["type"] == "file" and len(info["sha256"]) == 64
    assert handler.calls == []                       # safe action: no question

    assert ok(delete(b, "a.txt")) == "Deleted 'a.txt' (5 bytes)."
    assert not (workspace / "a.txt").exists()
    assert handler.calls == [("Delete the workspace file 'a.txt' (5 bytes). This cannot be undone.",
                              "[SAFE] risky_ops: delete 'a.txt'", ["delete_file", "a.txt"])]

    # "allow" is for one action only: the next risky action asks again.
    (workspace / "b.txt").write_text("b")
    ok(b.execute_tool("tool_move_file", {"source": "b.txt", "destination": "archive/b.txt"}))
    assert (workspace / "archive" / "b.txt").read_text() == "b"
    assert handler.calls[1] == ("Move the workspace file 'b.txt' to 'archive/b.txt'.",
                                "[SAFE] risky_ops: move 'b.txt' to 'archive/b.txt'",
                                ["move_file", "b.txt", "archive/b.txt"])
    assert len(handler.calls) == 2


def test_reject_returns_reason_and_keeps_file(bindings, ws):
    workspace, _ = ws
    (workspace / "keep.txt").write_text("precious")
    handler = Recorder(("reject", "This file is still needed by the report."))
    b = risky_binding(bindings, workspace, "safe", handler)
    res = delete(b, "keep.txt")
    error = failed(res)
    assert "rejected" in error and "This file is still needed by the report." in error
    assert "BLOCKED" in res["output"] and "This file is still needed by the report." in res["output"]
    assert (workspace / "keep.txt").read_text() == "precious"
    # A rejection is not remembered: the next attempt asks again.
    failed(delete(b, "keep.txt"))
    assert len(handler.calls) == 2
    assert handler.calls[0][2] == ["delete_file", "keep.txt"]


def test_always_upgrades_the_session(bindings, ws):
    workspace, _ = ws
    for name in ("1.txt", "2.txt", "3.txt"):
        (workspace / name).write_text(name)
    handler = Recorder(("always", ""))
    b = risky_binding(bindings, workspace, "safe", handler)
    ok(delete(b, "1.txt"))
    assert len(handler.calls) == 1 and handler.calls[0][2] == ["delete_file", "1.txt"]
    ok(delete(b, "2.txt"))
    ok(b.execute_tool("tool_move_file", {"source": "3.txt", "destination": "moved.txt"}))
    assert len(handler.calls) == 1                   # no more questions this session
    assert sorted(p.name for p in workspace.iterdir()) == ["moved.txt"]
    assert "full_access" in b.library_context("risky_ops")


def test_strict_mode_asks_for_everything(bindings, ws):
    workspace, _ = ws
    (workspace / "a.txt").write_text("a")
    handler = Recorder(("allow", ""))
    b = risky_binding(bindings, workspace, "strict", handler)
    assert "strict" in b.library_context("risky_ops")
    ok(b.execute_tool("tool_file_info", {"file_name": "a.txt"}))
    assert handler.calls == [("Inspect workspace path 'a.txt' (read-only).",
                              "[STRICT] risky_ops: inspect 'a.txt'", ["file_info", "a.txt"])]
    ok(delete(b, "a.txt"))
    assert handler.calls[1][1] == "[STRICT] risky_ops: delete 'a.txt'"
    assert len(handler.calls) == 2

    # strict + reject refuses even the safe action.
    (workspace / "b.txt").write_text("b")
    handler.decisions = [("reject", "no peeking")]
    assert "no peeking" in failed(b.execute_tool("tool_file_info", {"file_name": "b.txt"}))


def test_strict_mode_always(bindings, ws):
    workspace, _ = ws
    (workspace / "a.txt").write_text("a")
    (workspace / "b.txt").write_text("b")
    handler = Recorder(("always", ""))
    b = risky_binding(bindings, workspace, "strict", handler)
    ok(b.execute_tool("tool_file_info", {"file_name": "a.txt"}))
    ok(b.execute_tool("tool_file_info", {"file_name": "b.txt"}))
    ok(delete(b, "a.txt"))
    assert [c[2] for c in handler.calls] == [["file_info", "a.txt"]]


def test_full_access_never_asks(bindings, ws):
    workspace, _ = ws
    (workspace / "a.txt").write_text("a")
    (workspace / "b.txt").write_text("b")
    handler = Recorder(("reject", "should never be asked"))
    b = risky_binding(bindings, workspace, "full_access", handler)
    ok(b.execute_tool("tool_file_info", {"file_name": "a.txt"}))
    ok(b.execute_tool("tool_move_file", {"source": "a.txt", "destination": "b.txt", "overwrite": "true"}))
    ok(delete(b, "b.txt"))
    assert handler.calls == [] and list(workspace.iterdir()) == []


@pytest.mark.parametrize("level", ["safe", "strict", None, "bogus"])
def test_no_handler_refuses_risky_actions(bindings, ws, level):
    workspace, _ = ws
    (workspace / "a.txt").write_text("a")
    b = risky_binding(bindings, workspace, level, None)
    error = failed(delete(b, "a.txt"))
    effective = "strict" if level == "strict" else "safe"       # default and unknown levels mean safe
    assert "no confirmation handler" in error and f"'{effective}'" in error
    assert (workspace / "a.txt").exists()
    info = b.execute_tool("tool_file_info", {"file_name": "a.txt"})
    if level == "strict":
        assert "no confirmation handler" in failed(info)
    else:
        assert ok(info)["size"] == 1


def test_no_handler_full_access_runs(bindings, ws):
    workspace, _ = ws
    (workspace / "a.txt").write_text("a")
    b = risky_binding(bindings, workspace, "full_access", None)
    ok(delete(b, "a.txt"))
    assert not (workspace / "a.txt").exists()


@pytest.mark.parametrize("answer,expected", [
    (RuntimeError("operator UI crashed"), "operator UI crashed"),
    (None, "gave no decision"),
    (("maybe", ""), "unknown decision 'maybe'"),
    ("reject", "no reason given"),
])
def test_bad_handler_answers_mean_reject(bindings, ws, answer, expected):
    workspace, _ = ws
    (workspace / "a.txt").write_text("a")
    b = risky_binding(bindings, workspace, "safe", Recorder(answer))
    assert expected in failed(delete(b, "a.txt"))
    assert (workspace / "a.txt").exists()


def test_handler_variants_accepted(bindings, ws):
    workspace, _ = ws
    for name in ("a.txt", "b.txt"):
        (workspace / name).write_text(name)
    handler = Recorder("ALLOW", ["allow", None])       # bare string, list with a None reason
    b = risky_binding(bindings, workspace, "safe", handler)
    ok(delete(b, "a.txt"))
    ok(delete(b, "b.txt"))
    assert len(handler.calls) == 2 and list(workspace.iterdir()) == []


def test_handler_swapped_mid_session(bindings, ws):
    workspace, _ = ws
    for name in ("a.txt", "b.txt", "c.txt"):
        (workspace / name).write_text(name)
    first, second = Recorder(("allow", "")), Recorder(("reject", "second says no"))
    b = risky_binding(bindings, workspace, "safe", first)
    ok(delete(b, "a.txt"))
    b.set_confirm_handler(second)
    assert "second says no" in failed(delete(b, "b.txt"))
    assert len(first.calls) == 1 and len(second.calls) == 1
    b.set_confirm_handler(None)
    assert "no confirmation handler" in failed(delete(b, "c.txt"))
    assert sorted(p.name for p in workspace.iterdir()) == ["b.txt", "c.txt"]


def test_handler_from_host_config(bindings, ws):
    workspace, _ = ws
    (workspace / "a.txt").write_text("a")
    binding_level, config_level = Recorder(("reject", "binding handler")), Recorder(("allow", ""))
    b = risky_binding(bindings, workspace, "safe", binding_level, confirm_handler=config_level)
    ok(delete(b, "a.txt"))
    assert len(config_level.calls) == 1 and binding_level.calls == []


def test_risky_ops_containment(bindings, ws):
    workspace, outside = ws
    (workspace / "link.txt").symlink_to(outside / "secret.txt")
    (workspace / "real.txt").write_text("real")
    (workspace / "inner_link.txt").symlink_to(workspace / "real.txt")
    handler = Recorder(("allow", ""))
    b = risky_binding(bindings, workspace, "safe", handler)
    for name in ("../outside/secret.txt", str(outside / "secret.txt"), "link.txt"):
        error = failed(delete(b, name))
        assert f"'{name}'" in error and "outside the workspace" in error
        assert "outside the workspace" in failed(b.execute_tool("tool_file_info", {"file_name": name}))
    error = failed(b.execute_tool("tool_move_file", {"source": "real.txt", "destination": "../outside/x.txt"}))
    assert "'../outside/x.txt'" in error
    assert handler.calls == []                       # refused before asking anyone
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]
    # Deleting a link (pointing inside) removes the link, not its target.
    ok(delete(b, "inner_link.txt"))
    assert not (workspace / "inner_link.txt").is_symlink() and (workspace / "real.txt").exists()
    assert "workspace itself" in failed(delete(b, "."))


def test_move_overwrite_coercion(bindings, ws):
    workspace, _ = ws
    (workspace / "a.txt").write_text("new")
    (workspace / "b.txt").write_text("old")
    handler = Recorder(("allow", ""))
    b = risky_binding(bindings, workspace, "safe", handler)
    move = {"source": "a.txt", "destination": "b.txt"}
    assert "already exists" in failed(b.execute_tool("tool_move_file", {**move, "overwrite": "false"}))
    assert handler.calls == []
    ok(b.execute_tool("tool_move_file", {**move, "overwrite": "yes"}))
    assert handler.calls[0][0] == "Move the workspace file 'a.txt' to 'b.txt' (replacing the existing file)."
    assert (workspace / "b.txt").read_text() == "new" and not (workspace / "a.txt").exists()


def test_workspace_host_limits(bindings, ws):
    workspace, _ = ws
    (workspace / "long.txt").write_text("x" * 100)
    for i in range(6):
        (workspace / f"f{i}.txt").write_text("")
    b = bindings(workspace, {"workspace_tools": {"max_read_bytes": "10", "max_results": 3,
                                                 "max_write_bytes": 5}})
    text = ok(b.execute_tool("tool_read_file", {"file_name": "long.txt", "max_bytes": 1000}))
    assert text.startswith("x" * 10 + "\n") and "offset=10" in text
    listing = ok(b.execute_tool("tool_list_files", {"max_results": 100}))
    assert listing["count"] == 3 and listing["truncated"] is True
    assert ok(b.execute_tool("tool_find_files", {"pattern": "*.txt", "max_results": "50"}))["count"] == 3
    error = failed(b.execute_tool("tool_write_file", {"file_name": "w.txt", "content": "too long"}))
    assert "8 bytes" in error and "5-byte write limit" in error and not (workspace / "w.txt").exists()
    ok(b.execute_tool("tool_write_file", {"file_name": "w.txt", "content": "short"}))
    assert "is a directory" in failed(b.execute_tool("tool_write_file", {"file_name": ".", "content": ""}))
    assert "not a directory" in failed(b.execute_tool("tool_list_files", {"directory": "long.txt"}))
