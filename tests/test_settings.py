"""Settings the host got wrong are refused by name, before any worker starts."""
from __future__ import annotations

import pytest

from lcp_sandbox.core.limits import Limits, library_limits
from lcp_sandbox.core.outcomes import CallFailed


@pytest.mark.parametrize("sandbox, named", [
    ({"networks": False}, "'networks' is no sandbox setting (did you mean 'network'?)"),
    ({"timeout": 5}, "did you mean 'timeout_s'?"),
    ({"network": {"allow": ["example.com"]}}, "'network' is a policy, which only a confined"),
    ({"network": {"allow": ["example.com"], "confine": True}}, "'network' has 'confine'"),
    ({"network": "off"}, "'network' must be true, false or a dict of rules"),
    ({"timeout_s": "5"}, "'timeout_s' must be a number"),
    ({"timeout_s": True}, "'timeout_s' must be a number"),
    ({"memory_mb": -1}, "'memory_mb' is -1: it cannot be negative"),
    ({"max_open_files": 10.5}, "'max_open_files' must be a whole number"),
    ({"env": {"A": ["x"]}}, "'env' must be a dict of names"),
    ({"read_paths": "/data"}, "'read_paths' must be a list of paths"),
    ({"template": "no"}, "'template' must be true or false"),
    ({"confine": "yes"}, "confine='yes'"),
    ({"run_as": [0, 0]}, "unprivileged uid"),
    (["network"], "must be a dict of settings"),
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
                                    "max_open_files": 64.0}, "lib")
    assert (lim.timeout_s, lim.memory_mb, lim.network, lim.read_paths) == (5, None, False,
                                                                          ("/data",))
    assert library_limits(Limits(), None, "lib") == Limits()


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
