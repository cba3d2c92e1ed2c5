"""The token bucket rule: `capacity` tokens (burst, or requests_per_unit), refilled continuously
at requests_per_unit per window; a request takes one token per hit.

GCRA: one number per key, the theoretical arrival time (TAT) when the bucket is full again. A
token is T = window_ms / requests_per_unit of debt (how far TAT is ahead of now); tokens left:
capacity - debt / T. Times are in ticks of 1/requests_per_unit ms, so T is window_ms ticks and a
node alone decides in exact integers. Windows only serve the push and `nodes`.

A request of `hits` (`check`, then `count` and `admitted` when it is admitted):

1. A key under an active block (only with a `cooldown`) is refused until the block ends.
2. Otherwise its TAT is projected: each own hit stands for `nodes` hits of the fleet, itself now
   and nodes - 1 others spread evenly since TAT was last updated (own hit or store answer):
       projected = max(now, TAT + hits x (nodes - 1) x T) + hits x T
   admitted if projected - now <= capacity x T; alone (nodes = 1) this is GCRA. Others spread
   over time keep a small bucket usable by many nodes (capacity 1 on 4 nodes: own hits 4 T
   apart). A new key starts full (TAT 0); the first store answer tells the fleet's debt.
3. A refusal's Retry-After is when the tokens are there (more than the capacity: when full). It
   blocks only with a cooldown and the bucket over without the others' guessed hits; a refusal
   only the guess makes counts as offered for `nodes`, as the fixed window's do.
4. `count` moves TAT to the projection at the hit (negative hits give tokens back, TAT never
   before now). An admitted answer reports the whole tokens left and the time until full.

A span end:

- The store's answer is the fleet's debt in ms (there TAT = max(TAT, now) + count x T): TAT =
  now + debt + own hits since the push left (the others' of that round trip show in the next).
  Own hits are pushed unscaled. The store takes a span's hits as if at its end, so its debt may
  exceed the truth by up to a span's refill: never lenient, but a bucket not much larger than
  that refuses more than it should (more spans help).
- At the edge (`consistency: edge`, core/edge.py): a key that never pushed reads the fleet's
  debt after a few own hits; a span's first answer may lack the others' pushes of it, so a
  bucket this node projects nearly empty keeps its projection and reads the debt again a
  moment later, when every node's push is in.
- The store failed: nothing to add (the projection counts each own hit for `nodes`);
  local-only mode: every hit moved TAT when it was counted. `nodes`: as the fixed window's.

A key is not forgotten while its bucket is not full (KeyState.settled). An evicted key leaves its
debt, in hits as of its last hit, to core/evicted.py; back in the same window it resumes with that
debt from its return (the refill meanwhile is not credited: an eviction never frees tokens).
"""

from __future__ import annotations

from dataclasses import dataclass

from ratelimit_sidecar.core.algorithm import SharedAlgorithm
from ratelimit_sidecar.core.edge import bucket_near
from ratelimit_sidecar.core.keystate import Bucket, KeyState
from ratelimit_sidecar.core.quiet_keys import EarlySync, read_again_asked
from ratelimit_sidecar.core.types import OK, Push, PushResult, Verdict
from ratelimit_sidecar.core.verdicts import refuse_for_cooldown


@dataclass(frozen=True, slots=True)
class TokenBucket(SharedAlgorithm):
    early: EarlySync | None = None  # where a key at the edge asks to read again (core/fleet.py)

    def start(self, state: KeyState, resumed: int) -> None:
        """`resumed` hits of debt from the key's return."""
        limit, bucket = state.limit, Bucket()
        if resumed:
            bucket.tat = float(state.last_hit * limit.requests_per_unit + resumed * limit.window_ms)
        state.counts = bucket

    def check(self, state: KeyState, hits: int, now_ms: int) -> Verdict | None:
        limit = state.limit
        now = now_ms * limit.requests_per_unit
        if _projected(state, hits, now) - now <= limit.capacity * limit.window_ms:
            return None
        return self._over(state, hits, now_ms)

    def _over(self, state: KeyState, hits: int, now_ms: int) -> Verdict:
        """Step 3; `over`: on what is known (the others' guessed share taken out)."""
        limit, rpu = state.limit, state.limit.requests_per_unit
        now, token = now_ms * rpu, limit.window_ms
        full = limit.capacity * token
        guessed = max(0, state.inflight + state.pending) * (state.nodes.value - 1) * token
        over = max(now, state.bucket().tat - guessed) + hits * token - now > full
        if not over:
            state.nodes.refused += hits
        block = over and limit.cooldown > 0
        return refuse_for_cooldown(state, hits, now_ms, self.wait_ms, block=block)

    def wait_ms(self, state: KeyState, hits: int, now_ms: int) -> int:
        limit, rpu = state.limit, state.limit.requests_per_unit
        now = now_ms * rpu
        wait: float = 0.0
        if 0 < hits <= limit.capacity:
            wait = _projected(state, hits, now) - now - limit.capacity * limit.window_ms
        elif hits > 0:
            wait = state.bucket().tat - now
        return max(state.blocked_until - now_ms, _ceil_div(max(0, wait), rpu))

    def count(self, state: KeyState, hits: int, now_ms: int) -> None:
        """Step 4; the debt stays within the capacity (hits over it are a shadow rule's)."""
        limit, bucket = state.limit, state.bucket()
        now = now_ms * limit.requests_per_unit
        token = limit.window_ms
        if hits >= 0:
            bucket.tat = min(_projected(state, hits, now), now + limit.capacity * token)
        else:  # tokens given back; the push gives back no more than the bucket lacked
            lacked = _ceil_div(max(0, bucket.tat - now), token)
            bucket.tat = max(now, bucket.tat + hits * token)
            hits = max(hits, -lacked)
        state.counted(hits, now_ms)
        if state.edge and not bucket.pushed and hits > 0 and self.early is not None:
            self.early.first_read(state, now_ms)  # a new key at the edge (core/edge.py)

    def admitted(self, state: KeyState, now_ms: int) -> Verdict:
        limit, rpu = state.limit, state.limit.requests_per_unit
        token, full = limit.window_ms, limit.capacity * limit.window_ms
        debt = max(0, state.bucket().tat - now_ms * rpu)
        remaining = int(max(0, full - debt) // token)
        near = debt >= limit.near_limit_ratio * full
        reset = _ceil_div(debt, rpu)  # until the bucket is full again
        return Verdict(OK, limit, False, remaining, reset, False, state.rule.shadow_mode, near)

    def window_count(self, state: KeyState) -> int:
        """The debt as of the last hit (no clock here: the refill since is not credited)."""
        limit = state.limit
        debt = state.bucket().tat - state.last_hit * limit.requests_per_unit
        return _ceil_div(max(0, debt), limit.window_ms)

    def store_answer(
        self,
        state: KeyState,
        push: Push,  # noqa: ARG002  (the debt says all a bucket needs)
        answer: PushResult | None,
        now_ms: int,
    ) -> bool:
        if answer is None:
            return False
        limit, rpu = state.limit, state.limit.requests_per_unit
        tat = float((now_ms + answer.total) * rpu + state.pending * limit.window_ms)
        if state.edge and self.early is not None and self.early.store_up:
            tat = self._edge_answer(state, self.early, tat, now_ms)
        state.bucket().tat = tat
        if limit.cooldown <= 0 or answer.total * rpu <= limit.capacity * limit.window_ms:
            return False
        return state.block(state.cooldown_end(now_ms), now_ms)

    @staticmethod
    def _edge_answer(state: KeyState, early: EarlySync, tat: float, now_ms: int) -> float:
        """A span's first answer may lack the other nodes' pushes of it: a bucket nearly empty
        by this node's projection keeps it and reads again LATE_PUSH_MS later, when every
        node's push is in (the first to push a span sees only its own hits)."""
        bucket = state.bucket()
        asked = read_again_asked(state, bucket, now_ms)
        if asked or not bucket_near(state.limit, bucket.tat, now_ms):
            return tat  # the read again, or a bucket far from empty: the store's debt
        early.read_again(state, bucket, now_ms)
        return max(tat, bucket.tat)


def _projected(state: KeyState, hits: int, now: float) -> float:
    """Step 2, `now` in ticks."""
    token, bucket = state.limit.window_ms, state.bucket()
    spread: float = max(now, bucket.tat + hits * (state.nodes.value - 1) * token)
    return spread + hits * token


def _ceil_div(value: float, divisor: int) -> int:
    return -int(-value // divisor)
