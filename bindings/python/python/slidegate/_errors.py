"""The package's exceptions: one base, and one class per party an error is on."""


class Error(Exception):
    """The base of every exception slidegate raises."""


class InvalidArgument(Error, ValueError):
    """An argument the limiter refuses; the message names the bound that is not met."""


class BackendUnavailable(Error):
    """The backend cannot decide now (unreachable, past its deadline, refusing for now) and no
    failure policy answered for it."""


class BackendError(Error):
    """The backend answered with an error (a script error, a key of another type, a refused
    command): not hidden by a failure policy."""
