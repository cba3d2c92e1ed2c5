"""Why a sync failed, in the terms the caller acts on: may the store have applied the batch?

Every store raises only these from `sync`. The caller resends a failed batch's counts with the
next push unless `may_have_applied` is set: counting a span twice is worse than losing it.
"""

from __future__ import annotations


class StoreError(Exception):
    """A sync that did not produce an answer. `kind` names it in metrics and /readyz."""

    may_have_applied: bool = False
    kind = "other"


class StoreTimeout(StoreError):
    """No answer in time: the request may have reached the store and run there."""

    may_have_applied = True
    kind = "timeout"


class StoreUnavailable(StoreError):
    """No usable connection (refused, closed, unreachable, not authenticated)."""

    may_have_applied = False
    kind = "connection"


class StoreRefused(StoreError):
    """The store answered with an error (OOM, READONLY, WRONGTYPE, MOVED...) or with a reply
    that does not parse.

    Treated as not applied, as before typed errors existed. An error reply in the middle of a
    pipeline can follow commands that did run; telling those apart is left to a later change.
    """

    may_have_applied = False
    kind = "refused"
