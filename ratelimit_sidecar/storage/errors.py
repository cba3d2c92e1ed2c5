"""What a store raises when a sync fails, so callers never guess from exception names."""

from __future__ import annotations


class StoreError(Exception):
    """A sync did not complete. `may_have_applied`: the store may have applied the batch."""

    may_have_applied = False
    kind = "other"


class StoreTimeout(StoreError):
    """No answer in time: a pipeline the store did apply may hide behind it."""

    may_have_applied = True
    kind = "timeout"


class StoreUnavailable(StoreError):
    """No connection: nothing was sent."""

    kind = "connection"


class StoreRefused(StoreError):
    """The store answered with an error, or with something that does not parse."""

    kind = "refused"
