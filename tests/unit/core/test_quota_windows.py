"""Which windows an RLQS bucket of an edge limit takes as leases (core/quota_windows.py)."""

from __future__ import annotations

from ratelimit_sidecar.core.quota_windows import LeaseWindows, TrailingLeases

MAX, NEAR = 240, 0.95
WINDOW_MS, TRAILING_NEAR = 10_000, (1.5, 2.0)


def test_a_bucket_that_saw_no_window_before_is_leased() -> None:
    """Nothing is known of the key's traffic: a plain share of a count of 0 may pass MAX."""
    assert LeaseWindows().choose(7, MAX, NEAR)


def test_a_window_after_one_near_max_is_leased_after_a_quiet_one_plain() -> None:
    windows = LeaseWindows()
    windows.choose(1, MAX, NEAR)
    windows.saw(1, 120)
    windows.saw(1, 228)  # 0.95 x MAX: the fleet came near it
    windows.saw(2, 0)  # another window's count: not this one's
    assert windows.choose(2, MAX, NEAR)
    windows.saw(2, 227)
    assert windows.choose(2, MAX, NEAR)  # the choice stands to the window's end
    assert not windows.choose(3, MAX, NEAR)  # the one before stayed under 0.95 x MAX
    assert not windows.choose(3, MAX, NEAR)


def test_a_trailing_window_is_plain_until_its_pace_comes_near() -> None:
    trail = TrailingLeases()
    assert not trail.choose(0, MAX, WINDOW_MS, TRAILING_NEAR)  # nothing reported yet
    trail.report(200)  # 0.83 x MAX a window: far under the bar
    assert not trail.choose(5_000, MAX, WINDOW_MS, TRAILING_NEAR)


def test_a_trailing_window_is_leased_for_a_window_after_its_pace_came_near() -> None:
    """Near: the blended pace at 1.5 x MAX a window, or one report at 2 x; a window later, plain
    again. One report at 1.9 x MAX after a quiet pace is not near: 0.95 x MAX is that noisy."""
    trail = TrailingLeases()
    trail.report(200)
    trail.report(456)  # blended 328: 1.37 x MAX
    assert not trail.choose(5_000, MAX, WINDOW_MS, TRAILING_NEAR)
    trail.report(480)  # one report at 2 x MAX
    assert trail.choose(10_000, MAX, WINDOW_MS, TRAILING_NEAR)
    trail.report(200)
    trail.report(200)
    assert trail.choose(19_999, MAX, WINDOW_MS, TRAILING_NEAR)  # within a window of it
    assert not trail.choose(20_000, MAX, WINDOW_MS, TRAILING_NEAR)
    for _ in range(3):
        trail.report(420)  # 1.75 x MAX, blended past 1.5 on the second
    assert trail.pace >= 1.5 * MAX and trail.choose(25_000, MAX, WINDOW_MS, TRAILING_NEAR)
