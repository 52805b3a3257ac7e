"""What a request task's wakeup and its generator layers cost per streamed token, alone.

The router hands each token to its request's task by resolving a future the task awaits
(router/request_stream.py), and the token then climbs a few async-generator layers (the lifecycle,
the formatter) to the route that writes it. This times both on a uvloop event loop, without any of
the router's work: a future resolved through `call_soon` and awaited, per item; and `--layers`
async-generator layers over a source, per item and layer.

    python benchmarks/serving/wakeup_cost.py --items 200000 --layers 4
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import AsyncIterator


async def _source(n: int) -> AsyncIterator[int]:
    for i in range(n):
        yield i


async def _layer(inner: AsyncIterator[int]) -> AsyncIterator[int]:
    async for item in inner:
        yield item


async def generator_us(items: int, layers: int) -> float:
    """us per item through `layers` generator layers (0: the source alone)."""
    stream = _source(items)
    for _ in range(layers):
        stream = _layer(stream)
    began = time.perf_counter()
    async for _ in stream:
        pass
    return (time.perf_counter() - began) / items * 1e6


async def wakeup_us(items: int) -> float:
    """us per future resolved from a callback and awaited (a task woken for one token)."""
    loop = asyncio.get_running_loop()
    began = time.perf_counter()
    for _ in range(items):
        future = loop.create_future()
        loop.call_soon(future.set_result, None)
        await future
    return (time.perf_counter() - began) / items * 1e6


async def _main(items: int, layers: int) -> None:
    bare = await generator_us(items, 0)
    layered = await generator_us(items, layers)
    print(f"async-generator layer: {(layered - bare) / max(layers, 1):.3f} us per item and layer")
    print(f"wakeup through a future: {await wakeup_us(items // 4):.3f} us per item")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--items", type=int, default=200_000)
    p.add_argument("--layers", type=int, default=4)
    a = p.parse_args()
    if a.items < 4 or a.layers < 1:
        p.error("--items must be >= 4 and --layers >= 1")
    import uvloop

    uvloop.run(_main(a.items, a.layers))


if __name__ == "__main__":
    main()
