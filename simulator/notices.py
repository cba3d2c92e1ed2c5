"""The store's pub/sub notices, as the engine delivers them: the sync scripts announce a push
that takes a fixed window to NEAR_SHARE of MAX (sync.lua) and a block that a push starts
(sync_common.lua); every node, the pusher included, hears them (sync/fleet_blocks.py)."""

from __future__ import annotations

from typing import NamedTuple

from ratelimit_sidecar.config.model import AlgorithmName, RateLimit
from ratelimit_sidecar.core import FleetLimiter, SyncBatch, SyncResult
from ratelimit_sidecar.core.quiet_keys import NEAR_SHARE
from ratelimit_sidecar.core.types import KeyId, Push
from ratelimit_sidecar.storage.keys import digest


class Near(NamedTuple):
    key: KeyId
    window: int
    total: int
    edge: bool = False  # a push at the edge (core/edge.py)


class Block(NamedTuple):
    key: KeyId
    left_ms: int
    set_for: int  # the limit the block was set under


Notice = Near | Block


def announces_near(limit: RateLimit, total: int, hits: int, announce: bool = False) -> bool:
    """sync.lua's rule: a fixed window's push of `hits` that took its total to NEAR_SHARE of MAX,
    or, marked `announce`, added to a total from there up to MAX."""
    rpu = limit.requests_per_unit
    near, before = NEAR_SHARE * rpu, total - hits
    again = announce and before < total <= rpu
    return (
        limit.algorithm is AlgorithmName.FIXED_WINDOW and total >= near and (before < near or again)
    )


def announces_edge(push: Push, total: int) -> bool:
    """sync.lua's rule for a push at the edge: every push that adds to a total not yet past MAX."""
    before = total - push.hits
    return push.edge and before < total and before <= push.limit.requests_per_unit


def announced(batch: SyncBatch, answer: SyncResult) -> list[Notice]:
    notices: list[Notice] = []
    for push, result in zip(batch.pushes, answer.pushes, strict=True):
        if result.error:
            continue
        if announces_edge(push, result.total):
            notices.append(Near(push.key, push.window, result.total, True))
        elif announces_near(push.limit, result.total, push.hits, push.announce):
            notices.append(Near(push.key, push.window, result.total))
        if result.block_ms and result.block_ms == push.limit.cooldown:  # started just now
            notices.append(Block(push.key, result.block_ms, push.limit.requests_per_unit))
    return notices


def deliver(fleet: FleetLimiter, notice: Notice, now_ms: int, late_ms: int) -> None:
    """`late_ms`: how long the notice took to arrive (a block's time left is shorter by it)."""
    if isinstance(notice, Near):
        key, window, total = notice.key, notice.window, notice.total
        fleet.apply_near(key, digest(key), window, total, now_ms, notice.edge)
    else:
        fleet.apply_block(notice.key, notice.left_ms - late_ms, now_ms, 0, notice.set_for)
