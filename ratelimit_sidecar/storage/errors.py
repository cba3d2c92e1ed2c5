"""Why a sync failed, in the terms the caller acts on: may the store have applied the batch?

Every store raises only these from `sync`, and only when the sync as a whole has no answer: an
error reply to one command of the pipeline is answered in place instead (a key not applied, a
total or clock unknown; see `storage/codec.py`). The caller resends a failed batch's counts with
the next push unless `may_have_applied` is set: counting a span twice is worse than losing it.
"""

from __future__ import annotations


class StoreError(Exception):
    """A sync that did not produce an answer. `kind` names it in metrics and /readyz."""

    may_have_applied: bool = False
    kind = "other"


class StoreTimeout(StoreError):
    """No answer in time after the pipeline was sent: it may have run."""

    may_have_applied = True
    kind = "timeout"


class StoreUnavailable(StoreError):
    """No usable connection before anything was sent (refused, unreachable, not
    authenticated, no route to a Cluster slot): nothing ran."""

    may_have_applied = False
    kind = "connection"


class StoreLost(StoreError):
    """The connection broke after the pipeline was (partly) sent: it may have run."""

    may_have_applied = True
    kind = "connection"


class StoreRefused(StoreError):
    """The client refused the batch before sending it (a Cluster slot with no node): nothing
    ran."""

    may_have_applied = False
    kind = "refused"


class StoreUnreadable(StoreRefused):
    """The store answered the sync script in a form it never sends: the script ran, so what it
    applied cannot be told apart from what it did not."""

    may_have_applied = True
