"""Loads one tool file as the in-process binding does (import, init_tools_library).

The baselines run this file's text in fresh interpreters too (``python -c``, spawn,
the ceiling's processes), so it imports nothing heavy: they pay only for what a
minimal loader needs.
"""


def load_tool_file(path, name):
    import importlib.util
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    init = getattr(mod, "init_tools_library", None)
    if callable(init):
        code = getattr(init, "__code__", None)
        if code is None or code.co_argcount or code.co_flags & 4:
            init({})
        else:
            init()
    return mod


def child_code(body: str) -> str:
    """Source for a fresh interpreter: this loader, then ``body`` (which calls it)."""
    with open(__file__) as f:
        return f.read() + "\n" + body
