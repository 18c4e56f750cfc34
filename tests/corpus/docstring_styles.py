"""Description and parameter-description styles."""


def tool_google_style(query: str, limit: int = 10, verbose: bool = False):
    """
    Searches the index for a query.
    The first paragraph may span lines.

    Second paragraph is not part of the description.

    Args:
        query (str): The text to search for.
        limit (int): Maximum number of hits.
        verbose (bool, optional): Whether to add details.
    """
    return {"success": True}


def tool_colon_and_dash(alpha, beta, gamma, delta):
    """Plain styles.

    alpha: colon style description
    beta - dash style description
    - gamma: bulleted colon style
    * delta (float): starred typed style
    """
    return {"success": True}


def tool_numbered(one, two):
    """Numbered styles.

    1. one: the first
    2. two - the second
    """
    return {"success": True}


def tool_no_docstring(x: int):
    return {"success": True}


def tool_empty_docstring(x: int):
    """"""
    return {"success": True}


def tool_single_line(x: int):
    """Just one line."""
    return {"success": True}


def tool_undocumented_param(documented: str, undocumented: str):
    """Only one parameter is documented.

    documented: I am documented.
    """
    return {"success": True}


def tool_last_line_wins(value: str):
    """A parameter described twice keeps the last description.

    value: first description
    value: second description
    """
    return {"success": True}
