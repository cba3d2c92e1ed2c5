"""The debug address of envoyproxy/ratelimit: `GET /rlconfig` and `POST /json`.

Operators of the reference read the loaded rules at `/rlconfig` (one line per limit) and try a
decision with `curl -XPOST --data '{"domain": ..., "descriptors": [...]}' .../json`. Both are off
unless `--debug-address` is set: `/json` counts hits like any request, so it is not for the
metrics port that anyone scraping may reach.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from google.protobuf.json_format import MessageToJson, Parse, ParseError

from ratelimit_sidecar._proto.wire import RateLimitRequest, RateLimitResponse
from ratelimit_sidecar.config.model import RateLimit, Rule, RuleSet
from ratelimit_sidecar.http_server.server import Reply, Request, json_error, text_reply
from ratelimit_sidecar.service.validation import InvalidRequest

MAX_JSON_BYTES = 64 * 1024
Respond = Callable[[bytes], Awaitable[bytes]]  # wire request in, wire response out
_STATUS = {RateLimitResponse.OK: 200, RateLimitResponse.OVER_LIMIT: 429}


class DebugApi:
    """Dispatches the debug address's requests; reads the live rules and asks the handler."""

    def __init__(self, get_rules: Callable[[], RuleSet], respond: Respond) -> None:
        self._get_rules = get_rules
        self._respond = respond

    async def dispatch(self, request: Request) -> Reply:
        if request.path == "/rlconfig":
            if request.method not in ("GET", "HEAD"):
                return json_error(405, "method_not_allowed", "GET /rlconfig")
            return text_reply(rlconfig_text(self._get_rules()))
        if request.path == "/json":
            if request.method != "POST":
                return json_error(405, "method_not_allowed", "POST a RateLimitRequest as JSON")
            return await self._decide(request.body)
        return json_error(404, "not_found", "the debug address serves /rlconfig and /json")

    async def _decide(self, body: bytes) -> Reply:
        """The reference's `/json`: 200 OK, 429 OVER_LIMIT, the response in proto JSON."""
        try:
            request = Parse(body.decode("utf-8"), RateLimitRequest())
        except (ParseError, UnicodeDecodeError) as exc:
            return json_error(400, "bad_request", f"not a RateLimitRequest in JSON: {exc}")
        try:
            raw = await self._respond(request.SerializeToString())
        except InvalidRequest as exc:
            return json_error(400, "invalid_request", str(exc))
        response = RateLimitResponse.FromString(raw)
        text = MessageToJson(response, indent=None) + "\n"
        return _STATUS.get(response.overall_code, 500), "application/json", text.encode()


def rlconfig_text(rules: RuleSet) -> str:
    """Every limit as `domain.key_value.key: unit=MINUTE requests_per_unit=N, shadow_mode: …`,
    the reference's dump format, one line per limit of a rule (`rate_limits` may hold several)."""
    lines: list[str] = []
    for name in sorted(rules.domains):
        for rule in rules.domains[name].rules():
            full_key = ".".join([name, *(k + "_" + v if v else k for k, v in rule.path)])
            limits: tuple[RateLimit | None, ...] = rule.limits
            if rule.unlimited:  # the reference dumps an unlimited rule with no unit
                limits = (None,)
            lines.extend(_dump_line(full_key, rule, limit) for limit in limits)
    return "".join(lines)


def _dump_line(full_key: str, rule: Rule, limit: RateLimit | None) -> str:
    unit, count = ("UNKNOWN", 0) if limit is None else (limit.unit.name, limit.requests_per_unit)
    shadow, quota = str(rule.shadow_mode).lower(), str(rule.quota_mode).lower()
    return (
        f"{full_key}: unit={unit} requests_per_unit={count}, "
        f"shadow_mode: {shadow}, quota_mode: {quota}\n"
    )
