"""Office-family library: admitted only with the enable_word session flag."""


def tool_word_count_words(text: str):
    """Counts words."""
    return {"success": True}
