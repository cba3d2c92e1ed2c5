"""Answers every algorithm gives alike: without a counter, and a counted key's refusal."""

from __future__ import annotations

from collections.abc import Callable

from ratelimit_sidecar.config.model import RateLimit, Rule
from ratelimit_sidecar.core.keystate import KeyState
from ratelimit_sidecar.core.types import OK, OVER_LIMIT, Verdict

UNMATCHED = Verdict(OK)
WaitMs = Callable[[KeyState, int, int], int]  # (state, hits, now_ms) -> Retry-After
UNLIMITED = Verdict(OK, unlimited=True)


def unlimited_verdict(rule: Rule | None) -> Verdict:
    """The answer of a descriptor no limit applies to: none matched, or its rule is unlimited."""
    return UNLIMITED if rule is not None and rule.unlimited else UNMATCHED


def deny_verdict(limit: RateLimit, hits: int, shadow: bool) -> Verdict:
    """A limit that admits nothing (a deny list), or more hits than it ever admits; no hits: OK."""
    code = OK if shadow or hits <= 0 else OVER_LIMIT
    over = shadow and hits > 0
    return Verdict(code, limit, reset_ms=limit.cooldown, shadow_refused=over, shadow=shadow)


def refusal(limit: RateLimit, shadow: bool, reset_ms: int) -> Verdict:
    return Verdict(OK if shadow else OVER_LIMIT, limit, False, 0, reset_ms, shadow, shadow, False)


def refuse_for_cooldown(
    state: KeyState, hits: int, now_ms: int, wait_ms: WaitMs, *, block: bool
) -> Verdict:
    """Refuse, after blocking the key for its cooldown if `block` (a count known over the limit)."""
    if not block:
        return refusal(state.limit, state.rule.shadow_mode, wait_ms(state, hits, now_ms))
    state.block(state.cooldown_end(now_ms))
    return refuse_blocked(state, hits, now_ms, wait_ms(state, hits, now_ms))


def refuse_blocked(state: KeyState, hits: int, now_ms: int, wait_ms: int) -> Verdict:
    """Refuse under a block, and record a penalised key's offence: only here, never on the way to an
    admitted request, can its client be offending (core/penalty.py)."""
    penalty = state.penalty
    if penalty is not None and hits > 0 and not state.rule.shadow_mode:
        # The block's end, not the stated wait (which may count re-arms that never come):
        # a new block's first refusal must not look like a retry before the last one's end.
        penalty.refused(state.limit.cooldown, now_ms, state.blocked_until)
    return refusal(state.limit, state.rule.shadow_mode, wait_ms)
