"""__init__.py is always skipped by discovery, even when it defines tools."""


def tool_from_init(x: int):
    """Must never be discovered."""
    return x
