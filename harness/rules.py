"""Rule files used by tests that run a real server."""

from __future__ import annotations

from pathlib import Path

GATEWAY_RULES = """\
domain: gateway
descriptors:
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 100}
    descriptors:
      - key: path
        value: /v1/orders
        rate_limit: {unit: minute, requests_per_unit: 20, name: orders-writes}
  - key: tier
    value: internal
    rate_limit: {unlimited: true}
  - key: remote_address
    value: "10.9.*"
    rate_limit: {unit: second, requests_per_unit: 0}
    shadow_mode: true
  - key: client
    rate_limit: {unit: second, requests_per_unit: 3, spans: 2, cooldown: 2s}
  - key: blocked
    rate_limit: {unit: second, requests_per_unit: 0}
"""


def write_rules(directory: Path, text: str = GATEWAY_RULES, name: str = "gateway.yaml") -> Path:
    path = directory / name
    path.write_text(text)
    return path
