"""Every setting of the settings table, misspelled and mistyped.

Each setting (SandboxedBinding's, Supervisor's and RaySupervisor's keywords, every
"sandbox" key, the serve-mcp flags, and the keys of host_tool_configs) gets generated slips
of its name (case, separators, one letter added, dropped, changed or swapped) and values of
the wrong type (bools for numbers, floats and strings for uids, NaN, lists for dicts...).
Each is refused with a message naming it, or taken with exactly the meaning it asks for:
the oracle below says, independently of the code, which values a setting holds.  Files
too: a serve-mcp --config (and any JSON the engine reads) that gives a key twice, at any
depth, is refused naming the key and where; one that does not is read as json.load reads
it.  A fixed seed and small budgets: a few seconds.
"""
from __future__ import annotations

import argparse
import dataclasses
import copy
import inspect
import json
import math
import os
import re
from pathlib import Path
from unittest import mock

import pytest
from conftest import LIBS
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from lcp_sandbox import SandboxedBinding, Supervisor
from lcp_sandbox.backends.ray.driver import RaySupervisor
from lcp_sandbox.core.host_configs import config_limits
from lcp_sandbox.core.limits import Limits, library_limits
from lcp_sandbox.core import strict_json
from lcp_sandbox.core.outcomes import CallFailed
from lcp_sandbox.core.spelling import folded
from lcp_sandbox.fronts import mcp_cli, mcp_config
from lcp_sandbox.fronts.settings_table import serve_mcp_parser

FIXED = settings(derandomize=True, database=None, deadline=None, max_examples=12,
                 suppress_health_check=[HealthCheck.too_slow,
                                        HealthCheck.function_scoped_fixture])
#: For the checks that make nothing (pure functions): more examples for the same seconds.
PURE = settings(FIXED, max_examples=40)
LIBRARIES = ("faults", "other", "sideeffect", "stateful")
TMP = os.path.realpath(os.environ.get("TMPDIR", "/tmp"))


# ---------------------------------------------------------------- the oracle
def real(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def whole(v):
    return isinstance(v, int) and not isinstance(v, bool)


def number(v):
    return real(v) and v >= 0


def positive(v):
    return real(v) and v > 0


def natural(v):
    return whole(v) and v >= 0


def count(v):
    return whole(v) and v >= 1


def text(v):
    return isinstance(v, str) and v != ""


def path(v):
    v = os.fspath(v) if isinstance(v, os.PathLike) else v
    return isinstance(v, str) and v != "" and "\0" not in v


def strings(v):
    return isinstance(v, (list, tuple)) and all(path(s) for s in v)


def folders(v):
    return path(v) or isinstance(v, (list, tuple)) and all(path(p) for p in v)


def env(v):
    return isinstance(v, dict) and all(
        text(k) and "=" not in k and "\0" not in k
        and (isinstance(x, str) and "\0" not in x or real(x)) for k, x in v.items())


def confine(v):
    return v is None or isinstance(v, bool) or isinstance(v, str) and v == "best-effort"


def uid(v):
    return whole(v) and 0 < v <= 2**32 - 2


def run_as(v):
    return (isinstance(v, str) and v == "per-tenant"
            or isinstance(v, (list, tuple)) and len(v) == 2 and all(map(uid, v)))


def uid_range(v):
    if isinstance(v, (list, tuple)) and len(v) == 3 and v[2] == "login-uids":
        v, login_ok = v[:2], True
    else:
        login_ok = False
    if not (isinstance(v, (list, tuple)) and len(v) == 2 and all(map(whole, v))):
        return False
    first, n = v
    last = first + n - 1
    return (n >= 1 and first >= 1000 and last <= 2**32 - 2 and not first <= 65534 <= last
            and (login_ok or first > 60000))


def network(v):
    return isinstance(v, bool) or isinstance(v, dict) and set(v) <= {"allow", "deny"} and all(
        isinstance(rules, (list, tuple)) and all(isinstance(r, str) for r in rules)
        for rules in v.values())


def secrets(v):
    return isinstance(v, dict) and all(
        isinstance(k, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,63}", k)
        and isinstance(x, str) and x != "" and len(x) <= 16384
        and not re.search(r"[\x00-\x1f\x7f]", x) for k, x in v.items())


def syscalls(v):
    return isinstance(v, dict) and set(v) <= {"allow", "allow_dangerous"} and isinstance(
        v.get("allow_dangerous", False), bool) and isinstance(v.get("allow", []), (list, tuple))


def maybe(test):
    return lambda v: v is None or test(v)


def of_class(name):
    return lambda v: any(c.__name__ == name for c in type(v).__mro__)


SANDBOX = {"timeout_s": maybe(number), "grace_s": number, "memory_mb": maybe(number),
           "cpu_s": maybe(natural), "max_open_files": natural,
           "max_file_size_mb": maybe(number), "max_result_mb": number,
           "log_bytes_per_s": natural, "confine": confine, "network": network,
           "env": maybe(env), "read_paths": strings, "run_as": maybe(run_as), "template":
           lambda v: isinstance(v, bool), "trusted_import": lambda v: isinstance(v, bool),
           "max_processes": maybe(count), "disk_mb": maybe(lambda v: whole(v) and v >= 8),
           "requirements": maybe(strings), "syscalls": maybe(syscalls)}

BINDING = {"host_tool_configs": maybe(lambda v: isinstance(v, dict)),
           "tools_folders": maybe(folders), "tools_folder_path": maybe(folders),
           "tool_files": maybe(folders), "confirm_handler": maybe(callable),
           "user_interaction_handler": maybe(callable), "workspace": maybe(path),
           "tenant": text, "timeout_s": maybe(number), "memory_mb": maybe(number),
           "supervisor": maybe(of_class("Supervisor")), "confine": confine,
           "workspace_root": maybe(path), "network": maybe(network),
           "secrets": maybe(secrets)}

SUPERVISOR = {"max_workers": maybe(count), "max_workers_per_tenant": maybe(count),
              "idle_timeout_s": maybe(number), "confine": confine, "on_event": maybe(callable),
              "crash_policy": maybe(of_class("CrashPolicy")), "watch_interval_s": positive,
              "run_as": maybe(run_as), "tenants_root": maybe(path),
              "start_method": maybe(lambda v: v in ("zygote", "spawn")),
              "uid_range": uid_range, "max_processes_per_tenant": maybe(count),
              "network": network, "envs_dir": maybe(path), "env_wait_s": number,
              "secrets": maybe(secrets),
              "upstream_ca_file": maybe(lambda v: path(v) and os.path.isfile(v))}

RAY = {"address": maybe(text), "max_workers_per_node": maybe(count),
       "max_workers_per_tenant": maybe(count), "idle_timeout_s": maybe(number),
       "confine": confine, "on_event": maybe(callable), "tenants_root": maybe(path),
       "uid_range": maybe(uid_range), "envs_dir": maybe(path), "env_wait_s": maybe(number),
       "secrets": maybe(secrets),
       "upstream_ca_file": maybe(lambda v: path(v) and os.path.isfile(v))}


def test_the_oracle_knows_every_setting_of_the_table():
    """A new keyword or "sandbox" key fails here until the oracle says what it holds."""
    def keywords(cls):
        params = inspect.signature(cls.__dict__["__init__"]).parameters
        return {n for n, p in params.items() if n != "self" and p.kind is not p.VAR_KEYWORD}
    assert set(SANDBOX) == {f.name for f in dataclasses.fields(Limits)}
    assert set(BINDING) == keywords(SandboxedBinding) | {"tools_folder_path"}
    assert set(SUPERVISOR) == keywords(Supervisor)
    assert set(RAY) == keywords(RaySupervisor)


# ---------------------------------------------------------------- what is generated
TRICKY = [True, False, 0, 1, -1, 0.0, 1.0, 1.5, -0.5, math.nan, math.inf, -math.inf, 2**32 - 1,
          2**32, 1000, 5000, 65534, 1_800_000_000, "", "1", "0", "true", "off", "yes", "None",
          "best-effort", "Best-Effort", "best_effort", "per-tenant", "per_tenant", "nobody",
          "zygote", "spawn", "\0", "a\0b", b"x", [], (), {}, [True, True], [1.9, 1.9],
          ["1", "1"], [1000, 1000], (1000, 1000, 1000), [0, 0], (5000, 10),
          (5000, 10, "login-uids"), (1_800_000_000, 10), (1.8e9, 10.0), ("1800000000", "10"),
          {"allow": []}, {"allow": ["example.com"]}, {"Allow": ["example.com"]},
          {"allow": "example.com"}, {"allow": ["read"], "allow_dangerous": 1},
          {"A": "1"}, {"A": True}, {"A=B": "1"}, {"": "1"}, ["/data"], "/data", [""], [None],
          print, object(), Path("x")]

scalars = st.one_of(st.none(), st.booleans(), st.integers(-3, 2**33), st.floats(),
                    st.text(alphabet="aZ1_- \0", max_size=5), st.sampled_from(TRICKY))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.lists(inner, max_size=3).map(tuple),
    st.dictionaries(st.one_of(st.sampled_from(["allow", "deny", "A", "sandbox"]),
                              st.text(alphabet="aZ_", max_size=3)), inner, max_size=2)),
    max_leaves=5)


def values_for(holds) -> st.SearchStrategy:
    """Any value, and often one the setting holds (so that both outcomes are tried)."""
    good = [v for v in TRICKY if holds(v)]
    return st.one_of(st.sampled_from(good), values) if good else values


def slips(name: str) -> st.SearchStrategy[str]:
    """``name`` with one slip: case, a separator added, dropped or changed, or one edit."""
    letters = st.sampled_from("abcdefghijklmnopqrstuvwxyz_-")
    at = st.integers(0, len(name))
    inside = st.integers(0, len(name) - 1)
    return st.one_of(
        st.lists(st.booleans(), min_size=len(name), max_size=len(name)).map(
            lambda up: "".join(c.upper() if u else c for c, u in zip(name, up, strict=True))),
        st.tuples(at, st.sampled_from(["_", "-", " ", "__"])).map(
            lambda t: name[:t[0]] + t[1] + name[t[0]:]),
        st.sampled_from([name.replace("_", ""), name.replace("_", "-"), name + " "]),
        inside.map(lambda i: name[:i] + name[i + 1:]),
        st.tuples(at, letters).map(lambda t: name[:t[0]] + t[1] + name[t[0]:]),
        st.tuples(inside, letters).map(lambda t: name[:t[0]] + t[1] + name[t[0] + 1:]),
        st.integers(0, max(len(name) - 2, 0)).map(
            lambda i: name[:i] + name[i + 1:i + 2] + name[i:i + 1] + name[i + 2:]),
    ).filter(lambda s: s != name)


def is_slip(slip: str, name: str) -> bool:
    """Whether the engine must read ``slip`` as a slip of ``name`` (core/spelling.py's rule:
    case and separators always; one edit when the name has five letters or more)."""
    a, b = folded(slip), folded(name)
    if a == b:
        return True
    if len(b) < 5 or abs(len(a) - len(b)) > 1:
        return False
    return _one_edit(a, b)


def _one_edit(a: str, b: str) -> bool:
    rows = [[max(i, j) if not i * j else 0 for j in range(len(b) + 1)] for i in range(len(a) + 1)]
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            cost = a[i - 1] != b[j - 1]
            rows[i][j] = min(rows[i - 1][j] + 1, rows[i][j - 1] + 1, rows[i - 1][j - 1] + cost)
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                rows[i][j] = min(rows[i][j], rows[i - 2][j - 2] + 1)
    return rows[len(a)][len(b)] == 1


ALL_NAMES = {*SANDBOX, *BINDING, *SUPERVISOR, *RAY}


# ---------------------------------------------------------------- wrong spellings
@pytest.mark.parametrize("name", sorted(ALL_NAMES))
@FIXED
@given(data=st.data())
def test_a_slip_of_any_setting_given_to_the_binding_is_refused_naming_it(name, data):
    """Taken for a load flag, the setting would be left out: it is a TypeError naming it."""
    slip = data.draw(slips(name))
    assume(slip not in BINDING and is_slip(slip, name))
    with pytest.raises(TypeError) as caught:
        SandboxedBinding(**{"tools_folders": [LIBS], slip: True})
    assert f"got {slip}=" in str(caught.value) and name in str(caught.value), caught.value


@pytest.mark.parametrize("name", sorted(SANDBOX))
@FIXED
@given(data=st.data())
def test_a_slip_of_a_sandbox_key_is_a_500_naming_it(name, data):
    slip = data.draw(slips(name))
    assume(slip not in SANDBOX)
    with pytest.raises(CallFailed) as caught:
        library_limits(Limits(), {slip: False}, "lib")
    error = caught.value.result["error"]
    assert f"{slip!r} is no sandbox setting" in error and name in error, error
    if is_slip(slip, name):
        assert f"(did you mean {name!r}?)" in error, error


@pytest.mark.parametrize("cls, name", [(Supervisor, n) for n in sorted(SUPERVISOR)]
                         + [(RaySupervisor, n) for n in sorted(RAY)])
@FIXED
@given(data=st.data())
def test_a_slip_of_a_supervisor_keyword_is_refused_naming_it(cls, name, data):
    table = SUPERVISOR if cls is Supervisor else RAY
    slip = data.draw(slips(name))
    assume(slip not in table)
    with pytest.raises(TypeError) as caught:
        cls(**{slip: None})
    assert repr(slip) in str(caught.value), caught.value


@FIXED
@given(data=st.data())
def test_a_slip_of_sandbox_or_of_a_library_in_host_tool_configs_is_refused(data):
    library = data.draw(st.sampled_from(LIBRARIES))
    slip_of_sandbox = data.draw(slips("sandbox"))
    assume(is_slip(slip_of_sandbox, "sandbox"))
    with pytest.raises(ValueError) as caught:
        SandboxedBinding(tools_folders=[LIBS],
                         host_tool_configs={library: {slip_of_sandbox: {"network": False}}})
    assert repr(slip_of_sandbox) in str(caught.value)
    slip_of_library = data.draw(slips(library))
    assume(slip_of_library not in LIBRARIES)
    with pytest.raises(ValueError) as caught:
        SandboxedBinding(tools_folders=[LIBS],
                         host_tool_configs={slip_of_library: {"sandbox": {"network": False}}})
    said = str(caught.value)
    assert f"host_tool_configs[{slip_of_library!r}] names no library" in said, said
    if is_slip(slip_of_library, library):
        assert f"did you mean {library!r}?" in said, said


PARSER = serve_mcp_parser()
FLAGS = [a for a in PARSER._actions if a.option_strings and a.option_strings[-1] != "--help"]
SPELLED = {s for a in FLAGS for s in a.option_strings}


def _parse(argv: list[str]):
    try:
        return PARSER.parse_args([str(LIBS), *argv])
    except SystemExit:
        return None


def _with_value(flag: argparse.Action, name: str) -> list[str]:
    if flag.nargs == 0:
        return [name]
    for value in (*(flag.choices or ()), "1", "1800000000 10", "example.com", "x"):
        if _parse([flag.option_strings[-1], *value.split()]) is not None:
            return [name, *value.split()]
    raise AssertionError(f"no value found for {flag.option_strings[-1]}")


@pytest.mark.parametrize("flag", FLAGS, ids=lambda a: a.option_strings[-1])
@settings(FIXED, max_examples=6)
@given(data=st.data())
def test_a_slip_of_a_serve_mcp_flag_is_refused_or_is_that_flag(flag, data, capsys):
    """argparse takes an unambiguous prefix for the whole flag and refuses an unknown flag;
    a slip argparse reads as a FOLDER (one with a space) is refused by serve-mcp, which
    serves only folders that exist."""
    name = flag.option_strings[-1]
    slip = "--" + data.draw(slips(name[2:]))
    assume(slip not in SPELLED)
    meant = _parse(_with_value(flag, name))
    got = _parse(_with_value(flag, slip))
    if got is not None and slip in got.folders:
        with pytest.raises(mcp_cli._Usage, match=re.escape(f"tools folder {slip!r}")):
            mcp_cli._serve(got)
        return
    assert got is None or got == meant, (slip, got, meant)


# ---------------------------------------------------------------- wrong types
def _same(key, value, kept, base):
    """Whether what was kept means what ``value`` asked for."""
    if key in ("read_paths", "requirements") and value is not None:
        return kept == tuple(value)
    if key == "run_as" and isinstance(value, (list, tuple)):
        return kept == tuple(value)
    if key == "syscalls" and value is not None:
        return set(kept["allow"]) == set(value.get("allow", ()))
    if key == "confine" and value is None:
        return kept == base
    return kept == value and type(kept) in (type(value), float, int)


@pytest.mark.parametrize("key", sorted(SANDBOX))
@PURE
@given(data=st.data())
def test_a_sandbox_key_of_any_value_is_refused_naming_it_or_kept_as_asked(key, data):
    value = data.draw(values_for(SANDBOX[key]))
    base = Limits(confine=True)
    try:
        kept = library_limits(base, {key: value}, "lib")
    except CallFailed as exc:
        event("refused")
        assert key in exc.result["error"], exc.result["error"]
        return
    event("taken")
    assert SANDBOX[key](value), f"{key}={value!r} was taken"
    assert _same(key, value, getattr(kept, key), base.confine), (key, value)


@pytest.mark.parametrize("key", sorted(BINDING))
@FIXED
@given(data=st.data())
def test_a_binding_keyword_of_any_value_is_refused_naming_it_or_kept(key, data, supervisor):
    value = data.draw(values_for(BINDING[key]))
    kw = {"tools_folders": [LIBS], "supervisor": supervisor, key: value}
    if key == "tools_folder_path":
        del kw["tools_folders"]
    try:
        b = SandboxedBinding(**kw)
    except (TypeError, ValueError) as exc:
        assert key in str(exc) or key == "host_tool_configs" and "host_tool_configs" in str(
            exc), exc
        return
    b.close()
    assert BINDING[key](value), f"{key}={value!r} was taken"
    if key in ("confine", "network") and value is not None:
        assert getattr(b.limits, key) == value


@pytest.mark.parametrize("key", sorted(SUPERVISOR))
@FIXED
@given(data=st.data())
def test_a_supervisor_keyword_of_any_value_is_refused_naming_it_or_kept(key, data, tmp_path):
    value = data.draw(values_for(SUPERVISOR[key]))
    if path(value) and key in ("tenants_root", "envs_dir"):
        value = str(tmp_path)
    try:
        sup = Supervisor(**{key: value})
    except (TypeError, ValueError) as exc:
        assert key in str(exc), exc
        return
    sup.close()
    assert SUPERVISOR[key](value), f"{key}={value!r} was taken"
    if key == "confine":
        assert sup.confine == (value or False)
    if key == "network":
        assert sup.network == value
    if key == "run_as" and value is not None:
        assert sup.run_as == (value if isinstance(value, str) else tuple(value))
    if key == "uid_range":
        assert (sup.uids.first, sup.uids.count) == tuple(value[:2])


@pytest.mark.parametrize("key", sorted(RAY))
@FIXED
@given(data=st.data())
def test_a_ray_supervisor_keyword_of_any_value_is_refused_naming_it_or_kept(key, data):
    value = data.draw(values_for(RAY[key]))
    try:
        sup = RaySupervisor(**{key: value})
    except (TypeError, ValueError) as exc:
        assert key in str(exc), exc
        return
    sup.close()
    assert RAY[key](value), f"{key}={value!r} was taken"


entries = st.dictionaries(
    st.one_of(st.sampled_from(["sandbox", "Sandbox", "sandbox ", "sand_box", "autonomy_level",
                               "network", "x"]), st.text(alphabet="sandbxS_", max_size=8)),
    st.one_of(st.sampled_from([{"network": False}, {"confine": True}, {}, [], False, None,
                               "x", {"network": "off"}]), values), max_size=3)
configs = st.dictionaries(
    st.one_of(st.sampled_from([*LIBRARIES, "Faults", "fault-s", "faults.py", "rt_set"]),
              st.text(alphabet="faultsFAULTS_-.", max_size=8)),
    st.one_of(entries, values), max_size=3)


@FIXED
@given(given_configs=configs)
def test_host_tool_configs_are_refused_naming_the_entry_or_every_sandbox_holds(
        given_configs, supervisor):
    """Taken, every "sandbox" section is a dict spelled right, under the name of a library or
    of none near one (it waits for a library of that name), and that library's limits are
    what it asks for (or its calls answer 500 naming it)."""
    try:
        b = SandboxedBinding(tools_folders=[LIBS], supervisor=supervisor,
                             host_tool_configs=given_configs)
    except (TypeError, ValueError) as exc:
        event("refused")
        assert any(repr(k) in str(exc) for k in given_configs), exc
        return
    event("taken")
    b.close()
    for key, entry in given_configs.items():
        assert isinstance(entry, dict), (key, entry)
        assert not any(folded(k) == "sandbox" and k != "sandbox" for k in entry if
                       isinstance(k, str)), entry
        if "sandbox" not in entry:
            continue
        assert isinstance(entry["sandbox"], dict), (key, entry)
        # (an entry of no library waits for one of its name: it is no slip of any)
        assert key in LIBRARIES or not any(is_slip(str(key).removesuffix(".py"), lib)
                                           for lib in LIBRARIES), key
        try:
            limits = config_limits(b.limits, given_configs, key, LIBRARIES)
        except CallFailed as exc:
            assert key in exc.result["error"]
            continue
        for setting, value in entry["sandbox"].items():
            assert SANDBOX[setting](value), (setting, value)
            assert _same(setting, value, getattr(limits, setting), b.limits.confine)


# ---------------------------------------------------------------- files: a key given twice
@dataclasses.dataclass
class Obj:
    """A JSON object as its text spells it: its pairs in order (a key may come twice)."""
    pairs: list


def render(node) -> str:
    """The JSON text of ``node`` (Obj, list or scalar), every pair as it is."""
    if isinstance(node, Obj):
        return "{" + ", ".join(f"{json.dumps(k)}: {render(v)}" for k, v in node.pairs) + "}"
    if isinstance(node, list):
        return "[" + ", ".join(render(v) for v in node) + "]"
    return json.dumps(node)


def step(path: str, key) -> str:
    """Where the documented error says a key is: a.b for names, ["a.b"] for other keys,
    [0] for a list's items."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]*", key):
        return f"{path}[{json.dumps(key)}]"
    return f"{path}.{key}" if path else key


def objects_in(node, path: str = "", depth: int = 0):
    """(depth, path, Obj) of every object in ``node``."""
    if isinstance(node, Obj):
        yield depth, path, node
        for k, v in node.pairs:
            yield from objects_in(v, step(path, k), depth + 1)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from objects_in(v, step(path, i), depth + 1)


def objects(keys, inner) -> st.SearchStrategy:
    """Objects with each key once."""
    return st.dictionaries(keys, inner, max_size=3).map(lambda d: Obj(list(d.items())))


json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**40, 2**40),
                         st.floats(allow_nan=False, allow_infinity=False),
                         st.text(max_size=4), st.sampled_from(["false", 0, "off", "sandbox"]))
names = st.one_of(st.sampled_from([*LIBRARIES, "sandbox", "network", "host_tool_configs",
                                   "a.b", "", *SANDBOX]), st.text(max_size=4))
json_values = st.recursive(json_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), objects(names, inner)), max_leaves=6)
sandbox_sections = objects(st.sampled_from(sorted(SANDBOX)), st.one_of(
    st.sampled_from([False, True, 5, 0.5, {"allow": ["example.com"]}, None]), json_values))
config_entries = objects(st.sampled_from(["sandbox", "Sandbox", "x", "network"]),
                         st.one_of(sandbox_sections, json_values))
config_files = st.one_of(
    objects(st.sampled_from([*LIBRARIES, "host_tool_configs", "faults.py"]),
            st.one_of(config_entries, json_values)),
    objects(st.just("host_tool_configs"), objects(st.sampled_from(LIBRARIES), config_entries)),
    objects(names, json_values))


@st.composite
def twice(draw, docs=config_files):
    """(a document with one key given twice, in one object at any depth; the key; where)."""
    doc = copy.deepcopy(draw(docs))
    found = sorted(objects_in(doc), key=lambda t: t[0])
    # Often the deepest object, else any.
    depth, where, obj = draw(st.one_of(st.just(found[-1]), st.sampled_from(found)))
    event(f"depth {depth}")
    if obj.pairs:
        key = draw(st.sampled_from([k for k, _ in obj.pairs]))
    else:
        key = draw(names)
        obj.pairs.append((key, draw(json_values)))
    obj.pairs.insert(draw(st.integers(0, len(obj.pairs))), (key, draw(json_values)))
    return doc, key, step(where, key)


@PURE
@given(case=twice(st.one_of(config_files, objects(names, json_values))))
def test_a_key_given_twice_at_any_depth_is_refused_naming_it_and_where(case):
    doc, key, where = case
    text = render(doc)
    json.loads(text)                                    # what json.load would take
    with pytest.raises(strict_json.DuplicateKey) as caught:
        strict_json.loads(text)
    assert (caught.value.key, caught.value.path) == (key, where), text
    assert f"the key {key!r} is given twice at {where}: " in str(caught.value)


@FIXED
@given(case=twice())
def test_a_serve_mcp_config_with_a_key_given_twice_is_refused_naming_the_file(case, tmp_path):
    doc, key, where = case
    path = tmp_path / "config.json"
    path.write_text(render(doc), encoding="utf-8")
    with pytest.raises(mcp_cli._Usage) as caught:
        mcp_cli._configs(str(path))
    assert str(caught.value).startswith(
        f"--config {str(path)!r}: the key {key!r} is given twice at {where}: "), caught.value


def _read(path: Path):
    """read_configs' outcome: ("taken", the configs) or ("refused", its words)."""
    try:
        return "taken", mcp_config.read_configs(str(path))
    except mcp_config.ConfigError as exc:
        return "refused", str(exc)


@FIXED
@given(doc=config_files)
def test_a_serve_mcp_config_without_a_key_twice_is_read_as_json_load_reads_it(doc, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(render(doc), encoding="utf-8")
    got = _read(path)
    with mock.patch.object(mcp_config.strict_json, "load", json.load):
        before = _read(path)
    event(got[0])
    assert got == before
    assert strict_json.loads(render(doc)) == json.loads(render(doc))
