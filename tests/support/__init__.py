"""Helpers the tests share: the kinds of confined worker (confined_kinds), environment
libraries and an offline uv (envs_support), docs/internals.md's module table (module_map),
and the scripts run as hosts of their own (host_kind_attack, egress_by_port_host,
without_landlock)."""
