"""Helpers only: nothing here is a tool."""


def helper(x):
    return x


def tools_are_prefixed_with_tool_underscore(y):
    return y
