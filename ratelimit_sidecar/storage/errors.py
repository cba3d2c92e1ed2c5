"""Why a sync failed, in the terms the caller acts on: may the store have applied the batch?

Raised only when the sync as a whole has no answer (one command's error is answered in place:
storage/codec.py). A failed batch's counts are resent with the next push unless
`may_have_applied`: counting a span twice is worse than losing it.
"""

from __future__ import annotations


class StoreError(Exception):
    """`kind` names it in metrics and /readyz."""

    may_have_applied: bool = False
    kind = "other"


class StoreTimeout(StoreError):
    """No answer in time after sending."""

    may_have_applied = True
    kind = "timeout"


class StoreUnavailable(StoreError):
    """No usable connection before sending (refused, unreachable, unauthenticated, no Cluster
    slot route)."""

    kind = "connection"


class StoreLost(StoreError):
    """The connection broke after (part of) the pipeline was sent."""

    may_have_applied = True
    kind = "connection"


class StoreRefused(StoreError):
    """Refused before sending (a Cluster slot with no node)."""

    kind = "refused"


class StoreUnreadable(StoreRefused):
    """An answer in a form the script never sends: it ran, what it applied is unknown."""

    may_have_applied = True
