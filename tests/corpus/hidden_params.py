"""Host-injected parameters never reach the schema."""


def tool_with_hidden(query: str, tool_context=None, lollms_client_instance=None,
                     discussion_instance=None, user_interaction_handler=None, *args, **kwargs):
    """Searches with host objects.

    Args:
        query (str): What to search.
        tool_context (dict): Host context (hidden).
    """
    return {"success": True}


def tool_args_named_plainly(args, kwargs, visible: int = 1):
    """Parameters literally named args / kwargs are hidden too."""
    return {"success": True}


def tool_star_only(*args, **kwargs):
    """No parameters at all and no docstring params."""
    return {"success": True}
