"""Prompt providers: zero-argument tool_<name>_prompt functions."""


def tool_forecast(city: str):
    """Forecast for a city."""
    return {"success": True}


def tool_forecast_prompt():
    """Describes tool_forecast dynamically."""
    return "Forecasts for known cities."


def tool_weather_prompts_prompt(tool_context=None):
    """Dynamic context for the whole library (the stem is weather_prompts)."""
    return "Weather library."


def tool_summary_prompt():
    """There is no tool_summary: this is an ordinary tool."""
    return "summary"


def tool_search(query: str):
    """Searches."""
    return {"success": True}


def tool_search_prompt(query: str):
    """Has parameters, so it stays a tool."""
    return "search prompt"
