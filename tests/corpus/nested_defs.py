"""Where tool_ functions can hide."""
import sys


class Toolbox:
    def tool_method(self, amount: float = 1.5):
        """A method."""
        return {"success": True}

    def helper(self):
        return None


if sys.version_info >= (3,):
    def tool_conditional(flag: bool):
        """Defined inside an if block."""
        return {"success": True}

try:
    def tool_in_try(x: int):
        """Defined inside a try block."""
        return {"success": True}
except Exception:
    pass


def tool_outer(x: int):
    """Outer function."""

    def tool_inner_of_outer(y: str):
        """Inner function of tool_outer."""
        return y

    return tool_inner_of_outer(str(x))


def plain_helper():
    def tool_inner_of_helper(z: int = 1):
        """Inner function of a helper."""
        return z
    return tool_inner_of_helper


async def tool_async_is_not_a_tool(x: int):
    """Async functions are not tools."""
    return x


def _private():
    return None
