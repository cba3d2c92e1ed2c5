"""Which fixed windows an RLQS bucket of an edge limit takes as leases (core/quota_windows.py)."""

from __future__ import annotations

from ratelimit_sidecar.core.quota_windows import LeaseWindows

MAX, NEAR = 240, 0.95


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
