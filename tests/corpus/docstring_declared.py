"""Functions without visible parameters may declare them in the docstring."""


def tool_kwargs_declared(**kwargs):
    """Accepts anything.

    Args:
        query (str): The query.
        limit (int, optional): How many.
        ratio (float): A ratio.
        enabled (bool): A flag.
        items (list): Declared lists stay strings.
        score (number): "number" is not in the docstring table.
        fallback (str, default 'x'): Has a default.
        plain: No type given.
    Returns:
        dict: the result
    """
    return {"success": True}


def tool_hidden_declared(tool_context=None, lollms_client_instance=None):
    """Only hidden parameters, but the docstring names them.

    Args:
        tool_context (dict): Host context.
        lollms_client_instance: The client.
        topic (str): A real parameter.
    """
    return {"success": True}


def tool_kwargs_named_in_doc(**kwargs):
    """Declares kwargs itself.

    Parameters:
        kwargs (dict): Extra options.
        mode (str): The mode.
    Example: tool_kwargs_named_in_doc(mode="a")
    """
    return {"success": True}
