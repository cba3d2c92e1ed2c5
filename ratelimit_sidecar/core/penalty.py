"""Progressive penalties: longer blocks for a client that keeps sending while it is blocked.

A limit with a cooldown may set `penalty: {factor, max, forgive_after}`. The rule, in one place (the
sync scripts' arithmetic is tested against `block_ms`):

1. A block starting at level L (0 at first) lasts min(cooldown x factor^L, max), at least the
   cooldown; an extended block keeps its starting level.
2. An offence is a refused request arriving before the end this node stated in its last refusal (its
   Retry-After), once the client could have heard it: never the block's first refusal, nor one
   within GRACE of it (in flight), nor a retry up to GRACE before the stated end (Retry-After is
   rounded to seconds; clocks and flags differ by ms). An obedient client never offends.
3. A block's first offence raises the level to the block's level + 1 (capped where the block reaches
   `max`): one step per block however hard the client hammers.
4. After `forgive_after` without an offence the level is 0 again (not one step down: one expiring
   store key does it, the same on every node).

Fleet-wide (penalty.lua, sync_common.lua) the level lives beside the block flag with a TTL of
`forgive_after` renewed by each offence; a node reports the level it wants with its next push, the
store keeps the highest, starts blocks at its level (the flag's value) and answers both levels.
"""

from __future__ import annotations

from ratelimit_sidecar.config.model import Penalty

MAX_GRACE_MS = 250  # see 2.: in-flight requests and early retries that are no offence
MAX_LEVELS = 300  # bound on the search for the level whose block reaches `max`
NEVER = -(2**62)


def block_ms(cooldown_ms: int, penalty: Penalty, level: int) -> int:
    if level <= 0:
        return cooldown_ms
    grown = int(cooldown_ms * penalty.factor**level)
    return max(cooldown_ms, min(penalty.max_ms, grown))


def top_level(cooldown_ms: int, penalty: Penalty) -> int:
    """The lowest level whose block lasts `max`: levels never pass it."""
    level = 0
    while level < MAX_LEVELS and block_ms(cooldown_ms, penalty, level) < penalty.max_ms:
        level += 1
    return level


def flag_level(level: int, blocking: int) -> int:
    """The level of a block the store starts at `level` for a node whose own block runs at
    `blocking` (-1: none). A node blocks alone when only it sees the count over MAX, and an offence
    in that block already raised the store's level by one: it is the same block. A node further
    behind (just started) is not believed."""
    return blocking if blocking >= 0 and level - 1 <= blocking <= level else level


def grace_ms(cooldown_ms: int) -> int:
    return min(MAX_GRACE_MS, cooldown_ms // 4)


class RaisedLevels:
    """Offences that raised a level, for the limiter's metric."""

    __slots__ = ("applied",)

    def __init__(self) -> None:
        self.applied = 0


class PenaltyState:
    """One key's penalty (KeyState.penalty)."""

    __slots__ = (
        "block_end",
        "block_level",
        "fresh_ms",
        "level",
        "penalty",
        "raised",
        "told_at",
        "told_until",
        "wanted",
    )

    def __init__(self, penalty: Penalty, raised: RaisedLevels | None = None) -> None:
        self.penalty = penalty
        self.raised = raised or RaisedLevels()
        self.level = 0
        self.fresh_ms = NEVER  # the last offence, or the store's last word that level > 0
        self.block_level = 0  # the level the key's current (or last) block started at
        self.block_end = NEVER  # ... and when that block ends, as far as this node knows
        self.told_at = NEVER  # the first refusal of the client's current Retry-After
        self.told_until = NEVER  # the end the last refusal stated
        self.wanted = 0  # the level an offence asks the store for; 0: nothing to report

    def block_length(self, cooldown_ms: int, now_ms: int) -> int:
        if now_ms >= self.block_end:  # a new block: at the level of now
            self.forgive(now_ms)
            self.block_level = self.level
        length = block_ms(cooldown_ms, self.penalty, self.block_level)
        self.block_end = max(self.block_end, now_ms + length)
        return length

    def length_at(self, cooldown_ms: int, at_ms: int) -> int:
        """What `block_length` will say at `at_ms`, changing nothing: a Retry-After counting a block
        still to be set or re-armed."""
        if at_ms < self.block_end:
            return block_ms(cooldown_ms, self.penalty, self.block_level)
        forgiven = at_ms - self.fresh_ms >= self.penalty.forgive_after_ms
        return block_ms(cooldown_ms, self.penalty, 0 if forgiven else self.level)

    def refused(self, cooldown_ms: int, now_ms: int, blocked_until: int) -> bool:
        """True if this refusal is an offence that raised the level (2., 3.)."""
        if now_ms >= self.told_until:  # the first refusal, or back after the end it was told
            self.told_at, self.told_until = now_ms, blocked_until
            return False
        grace = grace_ms(cooldown_ms)
        offence = self.told_at + grace <= now_ms < self.told_until - grace
        self.told_until = blocked_until
        if not offence:
            return False
        self.fresh_ms = now_ms
        wanted = min(self.block_level + 1, top_level(cooldown_ms, self.penalty))
        raised = wanted > self.level
        self.level = max(self.level, wanted)
        self.wanted = self.level  # reported even when not raised: renews the store's TTL
        self.raised.applied += raised
        return raised

    def forgive(self, now_ms: int) -> None:
        if self.level and now_ms - self.fresh_ms >= self.penalty.forgive_after_ms:
            self.level = 0

    def current_level(self, now_ms: int) -> int:
        self.forgive(now_ms)
        return self.level

    def take_store(self, now_ms: int, level: int, block_level: int, block_left_ms: int) -> None:
        """The store's answer: the fleet's level, the block flag's level and ms left (0: none)."""
        if self.wanted <= level:
            self.wanted = 0  # reported (or overtaken)
        self.level = max(level, self.wanted)
        if level > 0:
            self.fresh_ms = max(self.fresh_ms, now_ms)  # alive in the store until its TTL
        if block_left_ms > 0:
            self.take_block(now_ms, block_level, block_left_ms)

    def take_block(self, now_ms: int, block_level: int, block_left_ms: int) -> None:
        self.block_level = block_level
        self.block_end = now_ms + block_left_ms
        self.level = max(self.level, block_level)
