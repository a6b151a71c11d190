"""Errors an operator's request can meet, shared by the engine and the modules its actions live in."""


class OperatorError(Exception):
    """An operator asked for something the flow's state does not allow (say which and why)."""
