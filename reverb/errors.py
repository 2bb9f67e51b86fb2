"""Exceptions raised by reverb.

`ReverbError` and `DeadlineExceededError` are the reference's classes. The others are ours:
they subclass `ReverbError` *and* `RuntimeError`, because the reference raised a bare
`RuntimeError` in those cases, so existing `except RuntimeError` code keeps working.
"""


class ReverbError(Exception):
    """Base class of reverb's errors."""


class DeadlineExceededError(ReverbError):
    """A call did not finish within its timeout (or a rate limiter timed out)."""


class NotFoundError(ReverbError, RuntimeError):
    """A table (or other named thing) does not exist on the server."""


class UnavailableError(ReverbError, RuntimeError):
    """The server could not be reached (not started, stopped, or the network failed)."""


class UnauthenticatedError(ReverbError, RuntimeError):
    """The server requires an auth token and the call did not carry it (see `auth_token=`
    and `REVERB_AUTH_TOKEN`). Not in the reference, whose servers have no authentication."""


class ResourceExhaustedError(ReverbError, IndexError):
    """A limit was reached (e.g. a message larger than the transport accepts); an `IndexError`
    too, as the reference raised `IndexError` there."""
