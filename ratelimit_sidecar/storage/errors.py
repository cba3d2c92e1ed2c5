"""Why a sync failed as a whole, in the terms the caller acts on: a failed batch's counts are
resent unless `may_have_applied` (counting a span twice is worse than losing it).
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
    """No usable connection before sending (refused, unreachable, unauthenticated, no route)."""

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
