"""Fronts sit on the binding: the command line, the lollms tools binding."""
