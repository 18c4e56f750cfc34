"""Settings the host got wrong are refused by name, before any worker starts, whatever
their spelling or type: a slip of a setting never passes for a load flag or a library's
own setting, and a protection asked for is never left out silently."""
from __future__ import annotations

import inspect
import logging
import math
import socket

import pytest
from conftest import FIXTURES, LIBS

from lcp_sandbox import SandboxedBinding, Supervisor
from lcp_sandbox.backends.ray.driver import RaySupervisor
from lcp_sandbox.core import spelling
from lcp_sandbox.core.host_configs import check_names
from lcp_sandbox.core.keywords import TABLES
from lcp_sandbox.core.limits import Limits, library_limits
from lcp_sandbox.core.outcomes import CallFailed
from lcp_sandbox.core.policy import login_range, run_as_setting, uid_range_setting

CORPUS = FIXTURES / "corpus"


@pytest.mark.parametrize("sandbox, named", [
    ({"networks": False}, "'networks' is no sandbox setting (did you mean 'network'?)"),
    ({"Network": False}, "'Network' is no sandbox setting (did you mean 'network'?)"),
    ({"timeout": 5}, "did you mean 'timeout_s'?"),
    ({"network": {"allow": ["example.com"]}}, "'network' is a policy, which only a confined"),
    ({"network": {"allow": ["example.com"], "confine": True}}, "'network' has 'confine'"),
    ({"network": "off"}, "'network' must be true, false or a dict of rules"),
    ({"network": 0}, "'network' must be true, false or a dict of rules"),
    ({"timeout_s": "5"}, "'timeout_s' must be a number"),
    ({"timeout_s": True}, "'timeout_s' must be a number"),
    ({"timeout_s": math.nan}, "'timeout_s' is nan: it must be a finite number"),
    ({"memory_mb": math.inf}, "'memory_mb' is inf: it must be a finite number"),
    ({"memory_mb": -1}, "'memory_mb' is -1: it cannot be negative"),
    ({"max_open_files": 10.5}, "'max_open_files' must be a whole number"),
    ({"max_open_files": 64.0}, "'max_open_files' must be a whole number"),
    ({"cpu_s": True}, "'cpu_s' must be a whole number"),
    ({"env": {"A": ["x"]}}, "'env' must be a dict of names"),
    ({"env": {"A=B": "x"}}, "'env' must be a dict of names"),
    ({"read_paths": "/data"}, "'read_paths' must be a list of paths"),
    ({"template": "no"}, "'template' must be true or false"),
    ({"template": 0}, "'template' must be true or false"),
    ({"confine": "yes"}, "confine='yes'"),
    ({"confine": 1}, "confine=1"),
    ({"confine": 1.0}, "confine=1.0"),
    ({"confine": "Best-Effort"}, "confine='Best-Effort'"),
    ({"run_as": [0, 0]}, "unprivileged uid"),
    ({"run_as": [True, True]}, "run_as must be (uid, gid), two whole numbers"),
    ({"run_as": [1.9, 1.9]}, "run_as must be (uid, gid), two whole numbers"),
    ({"run_as": ["1", "1"]}, "run_as must be (uid, gid), two whole numbers"),
    ({"run_as": "per-tenants"}, "run_as='per-tenants'"),
    ({"syscalls": {"allow": True}}, "'syscalls[\"allow\"]' must be a list of strings"),
    ({"syscalls": {"allow": "read"}}, "'syscalls[\"allow\"]' must be a list of strings"),
    (["network"], "must be a dict of settings"),
    (False, "must be a dict of settings"),
    ([], "must be a dict of settings"),
])
def test_a_wrong_setting_is_a_500_naming_it(sandbox, named):
    with pytest.raises(CallFailed) as caught:
        library_limits(Limits(), sandbox, "lib")
    error = caught.value.result["error"]
    assert caught.value.result["status_code"] == 500
    assert error.startswith("[lib] not run: host_tool_configs['lib'][\"sandbox\"] is invalid")
    assert named in error, error


def test_right_settings_pass_and_keep_their_values():
    lim = library_limits(Limits(), {"timeout_s": 5, "memory_mb": None, "network": False,
                                    "env": {"A": "1", "B": 2}, "read_paths": ["/data"],
                                    "max_open_files": 64, "run_as": [1001, 1002]}, "lib")
    assert (lim.timeout_s, lim.memory_mb, lim.network, lim.read_paths) == (5, None, False,
                                                                          ("/data",))
    assert (lim.max_open_files, lim.run_as) == (64, (1001, 1002))
    assert library_limits(Limits(), None, "lib") == Limits()
    assert library_limits(Limits(), {}, "lib") == Limits()


def test_confine_none_in_a_sandbox_section_is_the_bindings_confine():
    """None is "the binding's", as the table says: it never reads as unconfined."""
    for confine in (True, "best-effort", False):
        assert library_limits(Limits(confine=confine), {"confine": None}, "lib").confine == \
            confine


def test_a_library_with_a_mistyped_setting_starts_no_worker_and_others_run(make_binding):
    b = make_binding(host_tool_configs={"faults": {"sandbox": {"networks": False}},
                                        "stateful": {"sandbox": {"network": "off"}}})
    r = b.execute_tool("tool_get_state")
    assert r["status_code"] == 500 and r["success"] is False
    assert "'networks' is no sandbox setting (did you mean 'network'?)" in r["error"]
    r = b.execute_tool("tool_increment")
    assert r["status_code"] == 500 and "'network' must be true, false or a dict" in r["error"]
    assert b.stats() == []                         # no worker of either library started
    b.host_tool_configs["faults"] = {"sandbox": {"network": True}}
    b.discover_tools(force_refresh=True)
    assert b.execute_tool("tool_get_state")["success"] is True


# ---------------------------------------------------------------- keywords of the binding
@pytest.mark.parametrize("given, meant", [
    ({"confined": True}, "confine="), ({"Confine": True}, "confine="),
    ({"confine_": True}, "confine="), ({"netwrok": False}, "network="),
    ({"Network": False}, "network="), ({"time-out_s": 5}, "timeout_s="),
    ({"workspace_roots": "/srv"}, "workspace_root="), ({"Tenant": "b"}, "tenant="),
    ({"memory_MB": 64}, "memory_mb="), ({"tool_file": "x.py"}, "tool_files="),
])
def test_a_keyword_one_slip_from_a_keyword_is_refused_naming_it(given, meant):
    with pytest.raises(TypeError) as caught:
        SandboxedBinding(tools_folders=[LIBS], **given)
    text = str(caught.value)
    assert f"got {next(iter(given))}=" in text and f"did you mean {meant}?" in text, text


@pytest.mark.parametrize("given, named", [
    ({"run_as": "per-tenant"}, "'run_as' is a keyword of Supervisor, given as "
     "supervisor=Supervisor(run_as=...) and a setting of a library"),
    ({"uid_range": (1_800_000_000, 10)}, "'uid_range' is a keyword of Supervisor"),
    ({"max_workers": 4}, "'max_workers' is a keyword of Supervisor"),
    ({"max_workers_per_node": 4}, "'max_workers_per_node' is a keyword of RaySupervisor"),
    ({"crash_polcy": None}, "'crash_policy' is a keyword of Supervisor"),
    ({"max_processes": 10}, "'max_processes' is a setting of a library"),
    ({"disk_mb": 64}, "'disk_mb' is a setting of a library"),
    ({"Read_Paths": ["/data"]}, "'read_paths' is a setting of a library"),
    ({"syscall": {"allow": []}}, "'syscalls' is a setting of a library"),
])
def test_a_setting_of_a_supervisor_or_a_library_is_no_load_flag(given, named):
    with pytest.raises(TypeError) as caught:
        SandboxedBinding(tools_folders=[LIBS], **given)
    assert named in str(caught.value), caught.value


def test_load_flags_of_lollms_still_load_libraries(supervisor):
    """The flags lollms' own hosts give (lollms_client's apps) are no slip of a setting."""
    flagged = CORPUS / "flagged_lib.py"
    with SandboxedBinding(tool_files=[flagged], supervisor=supervisor,
                          enable_flagged_lib=True, enable_auto_model_selection=True,
                          system_dir="/tmp", cwd="/tmp") as b:
        assert "tool_flagged_action" in b.catalog.routes
    with SandboxedBinding(tool_files=[flagged], supervisor=supervisor) as b:
        assert "tool_flagged_action" not in b.catalog.routes
    with SandboxedBinding(tools_folder_path=str(LIBS), supervisor=supervisor) as b:
        assert "tool_get_state" in b.catalog.routes


@pytest.mark.parametrize("given, named", [
    ({"tenant": 5}, "'tenant' must be a non-empty string"),
    ({"tenant": ""}, "'tenant' must be a non-empty string"),
    ({"timeout_s": True}, "'timeout_s' must be a number"),
    ({"timeout_s": math.nan}, "'timeout_s' is nan"),
    ({"memory_mb": "64"}, "'memory_mb' must be a number"),
    ({"workspace": True}, "'workspace' must be a path"),
    ({"workspace_root": 1}, "'workspace_root' must be a path"),
    ({"supervisor": True}, "'supervisor' must be a Supervisor or RaySupervisor"),
    ({"confirm_handler": "yes"}, "'confirm_handler' must be callable"),
    ({"tool_files": 5}, "'tool_files' must be a path or a list of paths"),
    ({"tools_folder_path": [3]}, "'tools_folder_path' must be a path or a list of paths"),
    ({"tool_files": [None]}, "'tool_files' must be a path or a list of paths"),
    ({"host_tool_configs": ["faults"]}, "'host_tool_configs' must be a dict"),
    ({"confine": 1}, "confine=1"),
    ({"network": "off"}, "'network' must be true, false or a dict"),
])
def test_a_keyword_of_the_wrong_kind_is_refused_naming_it(given, named):
    with pytest.raises((TypeError, ValueError)) as caught:
        SandboxedBinding(tools_folders=[LIBS], **given)
    text = str(caught.value)
    assert text.startswith("SandboxedBinding: ") and named in text, text


# ---------------------------------------------------------------- host_tool_configs
@pytest.mark.parametrize("slip", ["Sandbox", "sandbox ", "sand_box", "SANDBOX", "sandbx"])
def test_a_slip_of_sandbox_is_refused(slip):
    configs = {"faults": {slip: {"network": False}}}
    with pytest.raises(ValueError) as caught:
        SandboxedBinding(tools_folders=[LIBS], host_tool_configs=configs)
    assert f"host_tool_configs['faults'] has {slip!r}, which is not 'sandbox'" in str(
        caught.value)


@pytest.mark.parametrize("section", [[], False, None, "network", 0, [("network", False)]])
def test_a_sandbox_section_that_is_no_dict_is_refused(section):
    configs = {"faults": {"sandbox": section}}
    with pytest.raises(TypeError) as caught:
        SandboxedBinding(tools_folders=[LIBS], host_tool_configs=configs)
    assert "host_tool_configs['faults']['sandbox'] must be a dict" in str(caught.value)


@pytest.mark.parametrize("entry", [None, [], "x", {"sandbox"}])
def test_an_entry_that_is_no_dict_is_refused(entry):
    with pytest.raises(TypeError, match=r"host_tool_configs\['faults'\] must be a dict"):
        SandboxedBinding(tools_folders=[LIBS], host_tool_configs={"faults": entry})


@pytest.mark.parametrize("key", ["Faults", "fault-s", "faults.py", "fualts", "faults "])
def test_a_sandbox_entry_of_no_library_is_refused_naming_the_one_meant(key):
    configs = {key: {"sandbox": {"network": False}}}
    with pytest.raises(ValueError) as caught:
        SandboxedBinding(tools_folders=[LIBS], host_tool_configs=configs)
    text = str(caught.value)
    assert f"host_tool_configs[{key!r}] names no library of this binding (did you mean " \
           f"'faults'?)" in text and "would protect nothing" in text, text


def test_an_entry_of_no_library_is_a_warning_naming_the_libraries(caplog, supervisor):
    """The libraries named are those of its folders and the ones the mount helpers would
    find (lollms_client's default tools, when installed)."""
    with caplog.at_level(logging.WARNING, logger="lcp_sandbox"):
        SandboxedBinding(tools_folders=[LIBS], supervisor=supervisor,
                         host_tool_configs={"rt-set": {"autonomy_level": "safe"}}).close()
    said = [r.getMessage() for r in caplog.records if "rt-set" in r.getMessage()]
    assert len(said) == 1 and "names no library of this binding; its libraries: " in said[0]
    named = said[0].split("its libraries: ")[1].split(":")[0].split(", ")
    assert {"faults", "other", "sideeffect", "stateful"} <= set(named), said


def test_sandbox_settings_beside_the_sandbox_section_are_a_warning(caplog, supervisor):
    with caplog.at_level(logging.WARNING, logger="lcp_sandbox"):
        SandboxedBinding(tools_folders=[LIBS], supervisor=supervisor,
                         host_tool_configs={"faults": {"network": False}}).close()
    said = [r.getMessage() for r in caplog.records]
    assert any("host_tool_configs['faults'] has 'network' beside 'sandbox', not in it" in m
               for m in said), said


def test_sandbox_under_a_file_of_a_folder_library_is_refused(supervisor):
    """A folder library's workers follow the entry of its folder's name; its other files'
    entries reach those files' init only."""
    configs = {"geo_units": {"sandbox": {"network": False}}}
    with pytest.raises(ValueError, match="'geo_units' is a file of the folder library "
                                         "'geo_lib'"):
        SandboxedBinding(tools_folders=[CORPUS], host_tool_configs=configs)
    SandboxedBinding(tools_folders=[CORPUS], supervisor=supervisor,
                     host_tool_configs={"geo_units": {"units": "metric"},
                                        "geo_lib": {"sandbox": {"network": False}}}).close()


def test_every_library_of_the_folders_may_be_configured_loaded_or_not(supervisor):
    """A library that does not load now (its load flag is off) or that a mount helper would
    mount later is no unknown entry."""
    configs = {"flagged_lib": {"sandbox": {"network": False}}}
    with SandboxedBinding(tools_folders=[CORPUS], supervisor=supervisor,
                          host_tool_configs=configs) as b:
        assert "tool_flagged_action" not in b.catalog.routes
    libs = [lib for lib in _libraries(CORPUS) if lib.name == "flagged_lib"]
    assert check_names(configs, libs) == ([], {"flagged_lib"})


REACH = '''
import socket

def tool_reach(port: int) -> dict:
    """Connects to the host's loopback."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
        return {"success": True, "output": "reached"}
    except OSError as exc:
        return {"success": True, "output": f"not reached: {exc}"}
'''


def test_a_sandbox_entry_of_no_library_yet_holds_for_one_registered_later(caplog, supervisor,
                                                                          tmp_path):
    """A library registered after construction (register_tool_from_code) gets the sandbox
    settings its host gave at construction: the entry waits for it, with a warning."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    configs = {"reach": {"sandbox": {"network": False}}}
    with caplog.at_level(logging.WARNING, logger="lcp_sandbox"), listener, SandboxedBinding(
            tools_folders=[LIBS], supervisor=supervisor, workspace=str(tmp_path),
            tenant="later", host_tool_configs=configs) as b:
        said = [r.getMessage() for r in caplog.records if "'reach'" in r.getMessage()]
        assert any("will hold for a library of that name that comes later" in m
                   for m in said), said
        assert b.register_tool_from_code("reach", REACH)
        r = b.execute_tool("tool_reach", {"port": port})
        assert r["output"].startswith("not reached"), r
        assert b.stats()[0]["protections"]["network"].startswith("on"), b.stats()


def test_a_sandbox_entry_one_slip_from_a_library_registered_later_refuses_it(supervisor,
                                                                            tmp_path):
    configs = {"Reach": {"sandbox": {"network": False}}}
    with SandboxedBinding(tools_folders=[LIBS], supervisor=supervisor, workspace=str(tmp_path),
                          tenant="later-slip", host_tool_configs=configs) as b:
        assert b.register_tool_from_code("reach", REACH) is False
        assert b.execute_tool("tool_reach", {"port": 1})["status_code"] == 404
        b.host_tool_configs["reach"] = {"sandbox": {"network": False}}
        assert b.register_tool_from_code("reach", REACH) is True


def test_a_sandbox_entry_added_after_construction_one_slip_from_a_library_is_a_500(
        make_binding):
    b = make_binding()
    b.host_tool_configs["Faults"] = {"sandbox": {"network": False}}
    r = b.execute_tool("tool_get_state")
    assert r["status_code"] == 500, r
    assert "host_tool_configs['Faults'] has 'sandbox' settings and is one slip from this " \
           "library's name: put them under host_tool_configs['faults']" in r["error"]
    assert b.stats() == []


def _libraries(folder):
    from lcp_sandbox.core.discovery import iter_libraries
    return list(iter_libraries([folder]))


@pytest.mark.parametrize("entry, named", [
    ({"Sandbox": {"network": False}}, "has 'Sandbox', which is not 'sandbox'"),
    ({"sandbox": False}, "host_tool_configs['faults']['sandbox'] must be a dict"),
    ({"sandbox": []}, "host_tool_configs['faults']['sandbox'] must be a dict"),
    ([], "host_tool_configs['faults'] must be a dict"),
])
def test_an_entry_changed_after_construction_is_checked_at_the_call(make_binding, entry,
                                                                    named):
    b = make_binding()
    b.host_tool_configs["faults"] = entry
    r = b.execute_tool("tool_get_state")
    assert r["status_code"] == 500 and named in r["error"], r
    assert b.stats() == []


# ---------------------------------------------------------------- uids
@pytest.mark.parametrize("value", [[True, True], [1.9, 1.9], ["1", "1"], (1,), 1000,
                                   "nobody", (1000, 0), (-1, 5), (2**32 - 1, 5)])
def test_run_as_is_two_ints_in_range(value):
    with pytest.raises(ValueError, match="run_as"):
        run_as_setting(value)
    with pytest.raises(ValueError, match="run_as"):
        Supervisor(run_as=value)
    with pytest.raises(ValueError, match="run_as"):
        Limits(run_as=value)


@pytest.mark.parametrize("value, named", [
    ((1.8e9, 10.0), "two whole numbers"), (("1800000000", "10"), "two whole numbers"),
    ((True, True), "two whole numbers"), ((1_800_000_000,), "two whole numbers"),
    ((1_800_000_000.9, 10), "two whole numbers"),
    ((500, 10), "from 1000 (above the system's)"), ((0, 10), "from 1000"),
    ((2**32 - 10, 20), "and at least one"), ((1_800_000_000, 0), "and at least one"),
    ((5000, 10), "overlaps the login users' uids (1000 to 60000"),
    ((59_990, 20), "overlaps the login users' uids"),
    ((65_000, 1000), "holds 65534, nobody's uid"),
    ((5000, 10, "login"), "two whole numbers"),
    ((1_799_999_990, 20), "the uid of the environment builder"),
])
def test_uid_range_is_two_ints_outside_the_system_and_login_uids(value, named):
    with pytest.raises(ValueError) as caught:
        uid_range_setting(value)
    assert named in str(caught.value), caught.value
    with pytest.raises(ValueError, match="uid_range"):
        Supervisor(run_as="per-tenant", uid_range=value)


def test_no_worker_runs_as_the_environment_builder():
    """The builder's uid owns the store every library's environment comes from."""
    from lcp_sandbox.core.policy import BUILDER_IDS
    for value in (BUILDER_IDS, (BUILDER_IDS[0], 4242), (4242, BUILDER_IDS[1])):
        with pytest.raises(ValueError, match="environment builder"):
            run_as_setting(value)
        with pytest.raises(ValueError, match="environment builder"):
            Supervisor(run_as=value)


def test_login_uids_are_taken_when_the_host_says_they_belong_to_no_one():
    assert uid_range_setting((5000, 10, "login-uids")) == (5000, 10)
    assert uid_range_setting([60_001, 5]) == (60_001, 5)
    with pytest.raises(ValueError, match="nobody"):
        uid_range_setting((65_000, 1000, "login-uids"))
    with Supervisor(run_as="per-tenant", uid_range=(5000, 10, "login-uids")) as sup:
        assert (sup.uids.first, sup.uids.count) == (5000, 10)


def test_the_login_range_is_the_systems():
    assert login_range("# comment\nUID_MIN\t\t 500\nUID_MAX 30000\nSYS_UID_MAX 499\n") == \
        (500, 30000)
    assert login_range("") == (1000, 60000)


# ---------------------------------------------------------------- supervisors' keywords
@pytest.mark.parametrize("given, named", [
    ({"max_workers": 0}, "'max_workers' is 0: at least 1"),
    ({"max_workers": 2.5}, "'max_workers' must be a whole number"),
    ({"max_workers_per_tenant": True}, "'max_workers_per_tenant' must be a whole number"),
    ({"idle_timeout_s": "5"}, "'idle_timeout_s' must be a number"),
    ({"idle_timeout_s": -1}, "'idle_timeout_s' is -1: it cannot be negative"),
    ({"on_event": 5}, "'on_event' must be callable"),
    ({"crash_policy": True}, "'crash_policy' must be a CrashPolicy"),
    ({"watch_interval_s": 0}, "'watch_interval_s' is 0: it must be above 0"),
    ({"start_method": 0}, "'start_method' must be a non-empty string"),
    ({"tenants_root": 5}, "'tenants_root' must be a path"),
    ({"envs_dir": True}, "'envs_dir' must be a path"),
    ({"env_wait_s": math.inf}, "'env_wait_s' is inf"),
    ({"max_processes_per_tenant": 1.0}, "'max_processes_per_tenant' must be a whole number"),
    ({"confine": 1}, "confine=1"),
    ({"network": 0}, "'network' must be true, false or a dict"),
])
def test_a_supervisor_keyword_of_the_wrong_kind_is_refused(given, named):
    with pytest.raises((TypeError, ValueError)) as caught:
        Supervisor(**given)
    assert str(caught.value).startswith("Supervisor: ") and named in str(caught.value)


@pytest.mark.parametrize("given, named", [
    ({"address": 5}, "'address' must be a non-empty string"),
    ({"max_workers_per_node": 0}, "'max_workers_per_node' is 0"),
    ({"max_workers_per_tenant": 1.5}, "'max_workers_per_tenant' must be a whole number"),
    ({"idle_timeout_s": True}, "'idle_timeout_s' must be a number"),
    ({"confine": 1.0}, "confine=1.0"),
    ({"on_event": "log"}, "'on_event' must be callable"),
])
def test_a_ray_supervisor_keyword_of_the_wrong_kind_is_refused(given, named):
    with pytest.raises((TypeError, ValueError)) as caught:
        RaySupervisor(**given)
    assert str(caught.value).startswith("RaySupervisor: ") and named in str(caught.value)


@pytest.mark.parametrize("owner, cls", [("SandboxedBinding", SandboxedBinding),
                                        ("Supervisor", Supervisor),
                                        ("RaySupervisor", RaySupervisor)])
def test_every_keyword_has_a_kind(owner, cls):
    params = inspect.signature(cls.__dict__["__init__"]).parameters
    keywords = {n for n, p in params.items() if n != "self" and p.kind is not p.VAR_KEYWORD}
    extra = {"tools_folder_path"} if owner == "SandboxedBinding" else set()
    assert set(TABLES[owner]) == keywords | extra


# ---------------------------------------------------------------- what a slip is
@pytest.mark.parametrize("word, meant", [
    ("Confine", "confine"), ("confine_", "confine"), ("confined", "confine"),
    ("netwrok", "network"), ("sand_box", "sandbox"), ("sandbox ", "sandbox"),
    ("CONFINE", "confine"), ("confne", "confine"), ("conf-ine", "confine"),
    ("enable_auto_model_selection", None), ("cwd", None), ("system_dir", None),
    ("confine", None), ("ENV", "env"), ("envs", None), ("confining", None),
])
def test_a_slip_is_case_separators_and_one_edit(word, meant):
    known = ["confine", "network", "sandbox", "env"]
    assert spelling.near_miss(word, known) == meant
