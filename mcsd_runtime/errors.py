"""User-facing errors: raised for bad input, printed by the CLIs without a traceback."""


class MCSDError(ValueError):
    """A problem the user can fix; the message says what to change."""
