"""The xDS client's Node, its reconnect delays and its TLS files."""

from __future__ import annotations

import os
from pathlib import Path

from ratelimit_sidecar.app.options import xds_options, xds_tls_files
from ratelimit_sidecar.app.settings import Settings
from ratelimit_sidecar.rules.xds_channel import Backoff, node_of


def test_node_id_and_metadata_as_the_reference_reads_them() -> None:
    settings = Settings(
        config_xds="127.0.0.1:1",
        config_xds_node_id="envoy-ratelimit",
        config_xds_node_metadata="zone=a, cluster=eu=1,broken,=x",
    )
    node = node_of(xds_options(settings))
    assert node.id == "envoy-ratelimit"
    assert dict(node.metadata) == {"zone": "a", "cluster": "eu=1"}


def test_delays_double_up_to_the_maximum_and_stay_in_their_upper_half() -> None:
    low, high = Backoff(1.0, 8.0, rng=lambda: 0.0), Backoff(1.0, 8.0, rng=lambda: 0.999)
    lows = [low.next_delay() for _ in range(6)]
    highs = [high.next_delay() for _ in range(6)]
    assert lows == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert all(h < 2 * lo for h, lo in zip(highs, lows, strict=True))
    low.reset()
    assert low.next_delay() == 0.5


def test_attempts_in_a_minute_are_bounded_whatever_the_jitter() -> None:
    """The reference's defaults, worst case (every delay at its shortest): a handful of
    attempts in the first minute, then about one a minute; never a busy loop."""
    backoff = Backoff(3.0, 60.0, rng=lambda: 0.0)
    elapsed, attempts = 0.0, 1
    while elapsed < 60.0:
        elapsed += backoff.next_delay()
        attempts += 1
    assert attempts <= 7
    second_minute = 0.0
    for _ in range(3):
        second_minute += backoff.next_delay()
    assert second_minute >= 60.0  # three attempts take at least a minute from then on


def test_tls_files_fingerprint_changes_on_rotation(tmp_path: Path) -> None:
    cert, key, ca = (tmp_path / name for name in ("c.pem", "k.pem", "ca.pem"))
    for path in (cert, key, ca):
        path.write_text("x")
    settings = Settings(
        config_xds="h:1",
        config_xds_client_tls=True,
        config_xds_client_tls_cert=str(cert),
        config_xds_client_tls_key=str(key),
        config_xds_server_tls_cacert=str(ca),
        config_xds_server_tls_san="xds.test",
    )
    files = xds_tls_files(settings)
    assert files is not None and files.san == "xds.test"
    before = files.fingerprint()
    cert.write_text("rotated")
    os.utime(cert, ns=(1, 1))
    assert files.fingerprint() != before
    assert xds_tls_files(Settings(config_xds="h:1")) is None
