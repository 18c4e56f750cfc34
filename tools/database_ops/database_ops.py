"""
database_ops.py — query and inspect the SQLite databases of the workspace.

Tools: ``tool_execute_query`` (one SQL statement), ``tool_list_tables`` and
``tool_describe_table``.  ``tool_database_ops_prompt`` is the library's
dynamic context (not a tool): it lists the SQLite files of the workspace.

Databases are files of the workspace (the current working directory at call
time): a database path that leaves it (``..``, an absolute path outside, a
symlink pointing out) is refused.  ``ATTACH`` / ``DETACH`` (and therefore
``VACUUM INTO``, which attaches its output file) are always denied, so a query
cannot reach or create files outside the workspace either.

Read-only by default
--------------------
Unless the host enables writes, databases are opened read-only by SQLite
itself (``mode=ro`` URI): ``INSERT``, ``UPDATE``, ``DELETE``, ``CREATE``,
``DROP``... fail and the tool says that writes are disabled.  Writes are
enabled by the host, never by the LLM, through the library's host config::

    host_tool_configs = {"database_ops": {"allow_writes": True}}

With ``allow_writes`` each write statement is committed at once, and a query
on a database file that does not exist yet creates it.

Other optional host config keys: ``max_rows`` (hard cap of returned rows,
default 1000) and ``query_timeout_s`` (a query is interrupted after this many
seconds, default 30).
"""
from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

TOOL_LIBRARY_NAME = "Database Operations"
TOOL_LIBRARY_DESC = "Executes queries and schema inspections on SQLite databases in the workspace."
TOOL_LIBRARY_ICON = "🗄️"

ALLOW_WRITES = False
MAX_ROWS_CAP = 1000
QUERY_TIMEOUT_S = 30.0
DB_SUFFIXES = (".db", ".sqlite", ".sqlite3")

_TRUE = frozenset({"true", "1", "yes", "y", "on", "t"})
_FALSE = frozenset({"false", "0", "no", "n", "off", "f", "", "none", "null"})
_DENIED_ACTIONS = {sqlite3.SQLITE_ATTACH: "ATTACH", sqlite3.SQLITE_DETACH: "DETACH"}


def init_tools_library(config: Optional[dict] = None) -> None:
    """Reads the host configuration: allow_writes, max_rows, query_timeout_s."""
    global ALLOW_WRITES, MAX_ROWS_CAP, QUERY_TIMEOUT_S
    ALLOW_WRITES = False
    if not isinstance(config, dict):
        return
    ALLOW_WRITES = _to_bool(config.get("allow_writes"), False)
    MAX_ROWS_CAP = _to_int(config.get("max_rows"), MAX_ROWS_CAP, minimum=1)
    try:
        QUERY_TIMEOUT_S = max(0.1, float(config.get("query_timeout_s", QUERY_TIMEOUT_S)))
    except (TypeError, ValueError):
        pass


def tool_database_ops_prompt() -> str:
    """Dynamic library context: the SQLite databases of the workspace (not a tool)."""
    found = sorted(p.name for p in Path(".").iterdir()
                   if p.is_file() and p.suffix.lower() in DB_SUFFIXES) if Path(".").is_dir() else []
    mode = ("read-write (write statements are committed)" if ALLOW_WRITES
            else "read-only (write statements are refused)")
    listing = ", ".join(found) if found else "None"
    return (f"Active workspace SQLite databases available: {listing}. "
            f"Database access is {mode}. Use tool_list_tables and tool_describe_table "
            "to inspect a schema before querying it with tool_execute_query.")


# ---------------------------------------------------------------- helpers
def _fail(message: str) -> Dict[str, Any]:
    """The failure shape; ``output`` repeats the error so the LLM never sees a success text."""
    return {"success": False, "error": message, "output": f"Error: {message}"}

def _to_int(value: Any, default: int, minimum: Optional[int] = None,
            maximum: Optional[int] = None) -> int:
    if isinstance(value, bool) or value is None:
        result = default if value is None else int(value)
    elif isinstance(value, int):
        result = value
    else:
        try:
            result = int(float(str(value).strip()))
        except (TypeError, ValueError, OverflowError):
            result = default
    if minimum is not None and result < minimum:
        result = minimum
    if maximum is not None and result > maximum:
        result = maximum
    return result


def _to_bool(value: Any, default: bool) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return value != 0
    if isinstance(value, str):
        text = value.strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
    return default


def _resolve_db_path(database_name: Any) -> Path:
    """The database file inside the workspace, or PermissionError naming the path."""
    root = Path.cwd().resolve()
    raw = "" if database_name is None else str(database_name).strip().replace("\\", "/")
    if not raw:
        raise ValueError("database_name is empty: give the name of a .db file of the workspace.")
    if "\x00" in raw:
        raise PermissionError(f"Invalid database path {raw!r}.")
    candidate = Path(raw)
    if not candidate.is_absolute():
        candidate = root / candidate
    try:
        resolved = candidate.resolve()
    except (OSError, RuntimeError) as exc:
        raise PermissionError(f"Cannot resolve database path '{raw}': {exc}") from None
    if root not in resolved.parents:
        raise PermissionError(f"Access denied: database path '{raw}' is outside the workspace.")
    return resolved


class _Denied:
    """SQLite authorizer: ATTACH/DETACH are never allowed; remembers what it denied."""

    def __init__(self) -> None:
        self.what: Optional[str] = None

    def __call__(self, action: int, arg1: Any, arg2: Any, db_name: Any, trigger: Any) -> int:
        if action in _DENIED_ACTIONS:
            self.what = _DENIED_ACTIONS[action]
            return sqlite3.SQLITE_DENY
        return sqlite3.SQLITE_OK


def _connect(database_name: Any, *, must_exist: bool = True):
    """(connection, path, authorizer) or a failure dict."""
    try:
        path = _resolve_db_path(database_name)
    except (PermissionError, ValueError) as exc:
        return _fail(str(exc))
    exists = path.is_file()
    if path.exists() and not exists:
        return _fail(f"'{database_name}' is not a file.")
    if not exists and (must_exist or not ALLOW_WRITES):
        hint = ""
        if not ALLOW_WRITES:
            hint = " (databases cannot be created: the library is read-only)"
        return _fail(f"Database '{database_name}' not found in the workspace{hint}.")
    mode = "rwc" if ALLOW_WRITES else "ro"
    try:
        conn = sqlite3.connect(f"{path.as_uri()}?mode={mode}", uri=True, timeout=5.0,
                               isolation_level=None)
    except sqlite3.Error as exc:
        return _fail(f"Cannot open database '{database_name}': {exc}")
    auth = _Denied()
    conn.set_authorizer(auth)
    deadline = time.monotonic() + QUERY_TIMEOUT_S
    conn.set_progress_handler(lambda: 1 if time.monotonic() > deadline else 0, 10_000)
    return conn, path, auth


def _cell(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return f"<BLOB {len(bytes(value))} bytes>"
    return value


def _quote_ident(name: str) -> str:
    return '"' + str(name).replace('"', '""') + '"'


def _sql_error(exc: Exception, auth: _Denied, database_name: str) -> Dict[str, Any]:
    msg = str(exc)
    if auth.what:
        return _fail(f"SQL Error: {auth.what} is not allowed: queries may only use the database "
                     f"'{database_name}' itself.")
    if "readonly" in msg or "read-only" in msg:
        return _fail(f"SQL Error: {msg}. Write statements are disabled: the database_ops library is "
                     "read-only (the host can enable writes with its 'allow_writes' setting).")
    if msg == "interrupted":
        return _fail(f"SQL Error: the query ran longer than {QUERY_TIMEOUT_S:g} s and was interrupted.")
    return _fail(f"SQL Error: {msg}")


def _parse_parameters(parameters: Any):
    """Bound parameters: a list, a dict, or the JSON text of one.  Returns (value, error)."""
    if parameters is None or parameters == "" or parameters == []:
        return (), None
    if isinstance(parameters, str):
        try:
            parameters = json.loads(parameters)
        except json.JSONDecodeError as exc:
            return None, f"'parameters' is not valid JSON: {exc}"
    if isinstance(parameters, dict):
        return parameters, None
    if isinstance(parameters, (list, tuple)):
        return tuple(parameters), None
    return (parameters,), None


# ---------------------------------------------------------------- tools
def tool_execute_query(database_name: str, query: str, max_rows: int = 50,
                       parameters: list = None) -> Dict[str, Any]:
    """
    Executes one SQL statement on a workspace SQLite database and returns the rows.

    Args:
        database_name (str): Name of the .db file in the workspace, e.g. 'sales.db'.
        query (str): One SQL statement, e.g. 'SELECT * FROM orders WHERE total > ?'. Databases are read-only unless the host enabled writes.
        max_rows (int): Maximum number of rows to return (capped by the host).
        parameters (list): Optional values bound to the '?' placeholders of the query, as a list (or a JSON array string).
    """
    if not isinstance(query, str) or not query.strip():
        return _fail("The query is empty.")
    limit = _to_int(max_rows, 50, minimum=1, maximum=MAX_ROWS_CAP)
    bound, perr = _parse_parameters(parameters)
    if perr:
        return _fail(perr)
    opened = _connect(database_name, must_exist=False)
    if isinstance(opened, dict):
        return opened
    conn, _path, auth = opened
    try:
        cursor = conn.execute(query, bound)
        columns = [d[0] for d in cursor.description] if cursor.description else []
        rows = cursor.fetchmany(limit + 1) if columns else []
        truncated = len(rows) > limit
        rows = [[_cell(v) for v in row] for row in rows[:limit]]
        output: Dict[str, Any] = {"columns": columns, "rows": rows, "row_count": len(rows),
                                  "truncated": truncated}
        if not columns:
            output["rows_affected"] = cursor.rowcount if cursor.rowcount >= 0 else 0
        return {"success": True, "output": output}
    except (sqlite3.Error, sqlite3.Warning, ValueError, OverflowError) as exc:
        return _sql_error(exc, auth, database_name)
    finally:
        conn.close()


def tool_list_tables(database_name: str) -> Dict[str, Any]:
    """
    Lists the tables and views of a workspace SQLite database with their row counts.

    Args:
        database_name (str): Name of the .db file in the workspace, e.g. 'sales.db'.
    """
    opened = _connect(database_name)
    if isinstance(opened, dict):
        return opened
    conn, _path, auth = opened
    try:
        objects = conn.execute(
            "SELECT name, type FROM sqlite_master WHERE type IN ('table', 'view') "
            "AND name NOT LIKE 'sqlite_%' ORDER BY type, name").fetchall()
        tables: List[Dict[str, Any]] = []
        for name, kind in objects:
            entry: Dict[str, Any] = {"name": name, "type": kind}
            if kind == "table":
                try:
                    entry["rows"] = conn.execute(f"SELECT COUNT(*) FROM {_quote_ident(name)}").fetchone()[0]
                except sqlite3.Error:
                    entry["rows"] = None
            tables.append(entry)
        return {"success": True, "output": {"database": str(database_name), "tables": tables}}
    except sqlite3.Error as exc:
        return _sql_error(exc, auth, database_name)
    finally:
        conn.close()


def tool_describe_table(database_name: str, table_name: str) -> Dict[str, Any]:
    """
    Describes a table of a workspace SQLite database: columns, types, keys, indexes and its CREATE statement.

    Args:
        database_name (str): Name of the .db file in the workspace, e.g. 'sales.db'.
        table_name (str): Name of the table (or view) to describe.
    """
    opened = _connect(database_name)
    if isinstance(opened, dict):
        return opened
    conn, _path, auth = opened
    try:
        row = conn.execute("SELECT type, sql FROM sqlite_master WHERE name = ? AND type IN ('table', 'view')",
                           (str(table_name),)).fetchone()
        if row is None:
            names = [r[0] for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type IN ('table', 'view') "
                "AND name NOT LIKE 'sqlite_%' ORDER BY name")]
            return _fail(f"Table '{table_name}' not found in '{database_name}'. "
                         f"Available: {', '.join(names) or 'none'}.")
        kind, create_sql = row
        ident = _quote_ident(table_name)
        columns = [{"name": c[1], "type": c[2], "not_null": bool(c[3]), "default": c[4],
                    "primary_key": bool(c[5])}
                   for c in conn.execute(f"PRAGMA table_info({ident})")]
        indexes = [{"name": i[1], "unique": bool(i[2])} for i in conn.execute(f"PRAGMA index_list({ident})")]
        foreign_keys = [{"column": f[3], "references": f"{f[2]}({f[4]})"}
                        for f in conn.execute(f"PRAGMA foreign_key_list({ident})")]
        output: Dict[str, Any] = {"table": str(table_name), "type": kind, "columns": columns,
                                  "indexes": indexes, "foreign_keys": foreign_keys, "sql": create_sql}
        if kind == "table":
            output["rows"] = conn.execute(f"SELECT COUNT(*) FROM {ident}").fetchone()[0]
        return {"success": True, "output": output}
    except sqlite3.Error as exc:
        return _sql_error(exc, auth, database_name)
    finally:
        conn.close()
