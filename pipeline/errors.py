"""The one exception type for mistakes a user can fix."""


class EtbuildError(Exception):
    """A user-facing error: the message says what was wrong and how to fix it."""
