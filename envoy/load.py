"""Drive one or more gateways with the same API key and print 200/429 counts per second.

    python envoy/load.py http://127.0.0.1:PORT_A http://127.0.0.1:PORT_B --key k1 --seconds 10

Bounded: at most --rate requests per second per gateway, for --seconds seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor


def fetch(url: str, key: str) -> int:
    request = urllib.request.Request(url, headers={"x-api-key": key})
    try:
        with urllib.request.urlopen(request, timeout=2) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as error:
        return int(error.code)
    except OSError:
        return 0


async def drive(urls: list[str], key: str, rate: int, seconds: int) -> None:
    loop = asyncio.get_running_loop()
    with ThreadPoolExecutor(max_workers=16) as pool:
        for second in range(seconds):
            started = time.monotonic()
            calls = [
                loop.run_in_executor(pool, fetch, url, key) for url in urls for _ in range(rate)
            ]
            codes = collections.Counter(await asyncio.gather(*calls))
            print(f"t={second + 1:>3}s  200: {codes[200]:>4}  429: {codes[429]:>4}  other: "
                  f"{sum(codes.values()) - codes[200] - codes[429]}", flush=True)  # fmt: skip
            await asyncio.sleep(max(0.0, 1 - (time.monotonic() - started)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("urls", nargs="+")
    parser.add_argument("--key", default="load")
    parser.add_argument("--rate", type=int, default=5, help="requests per second per gateway")
    parser.add_argument("--seconds", type=int, default=10)
    args = parser.parse_args()
    asyncio.run(drive(args.urls, args.key, min(args.rate, 500), min(args.seconds, 600)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
