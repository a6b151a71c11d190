"""Errors an operator's request can meet, shared by the engine and the modules its actions live in."""


class OperatorError(Exception):
    """An operator asked for something the flow's state does not allow (say which and why)."""


class ChangedSince(OperatorError):
    """The flow changed since a person was shown it (``operator_actions.Seen``): their confirmation was of
    the flow as it was, so nothing is done to it (a new look, a new dry run, decides)."""
