"""This file does not parse: the regex fallback takes over."""


def tool_broken_search(query: str, limit: int = 5, ratio: float=0.5, verbose: bool = False):
    """Searches even though the file is broken.

    Args:
        query (str): Not used by the fallback.
    """
    return {"success": True}


def tool_broken_star(name: str, *args, **kwargs):
    """Star parameters."""
    return {"success": True}


def tool_broken_kwonly(a: int, *, b: str = "z"):
    """Keyword-only marker."""
    return {"success": True}


def tool_broken_hidden(items: List[str], mapping: dict, plain, opt=3, tool_context=None, lollms_client_instance=None):
    '''Single-quoted docstrings are invisible to the fallback.'''
    return {"success": True}


def tool_broken_no_doc(x: int) -> dict:
    return {"success": True}


def tool_broken_after():
    """Docstring after tool_broken_no_doc."""
    return {"success": True}

def this is not python(:
    pass
