"""worker/signature.py reads a plain function's parameters from its code object:
the same answers as inspect.signature, for every kind of parameter and callable."""
import functools
import inspect

from lcp_sandbox.worker.signature import accepts, positional


def _by_inspect(fn):
    params = inspect.signature(fn).parameters.values()
    names = frozenset(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
    return (names, any(p.kind == p.VAR_KEYWORD for p in params),
            any(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL) for p in params))


def plain(a, b=1): return a


def kwonly(*, x, y=2): return x


def everything(p, /, a, *args, k, **kw): return p


def only_var(*args): return args


def only_kw(**kw): return kw


def locals_too(a):
    inner = a * 2          # a local variable is no parameter
    return inner


def _wrapped(a, b): return a


@functools.wraps(_wrapped)
def decorated(*args, **kwargs): return _wrapped(*args, **kwargs)


def signed(*args, **kwargs): return args


signed.__signature__ = inspect.Signature([inspect.Parameter("q", inspect.Parameter.KEYWORD_ONLY)])


class Tool:
    def method(self, a, *, b): return a

    def __call__(self, z): return z


CALLABLES = [plain, kwonly, everything, only_var, only_kw, locals_too, decorated, signed, lambda: 1,
             Tool().method, Tool(), functools.partial(plain, 1), Tool]


def test_same_answers_as_inspect():
    for fn in CALLABLES:
        names, var_kw, pos = _by_inspect(fn)
        assert accepts(fn) == (names, var_kw), fn
        assert positional(fn) == pos, fn


def test_wrappers_report_what_they_wrap():
    assert accepts(decorated) == (frozenset({"a", "b"}), False)     # not (*args, **kwargs)
    assert accepts(signed) == (frozenset({"q"}), False)
    assert not positional(signed)
