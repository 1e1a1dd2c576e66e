"""Raw Kubernetes responses for tests: kubernetes_asyncio calls with `_preload_content=False`.

Such a call returns the aiohttp response itself, not the model its stubs declare (`V1Pod`,
`V1Node`, ...): `raw` awaits the call and gives the response its real type, checked at run time.
The request bodies tests send are plain JSON dicts, which the client serializes as they are
(its stubs ask for the model: those arguments carry `type: ignore[arg-type]`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import aiohttp

if TYPE_CHECKING:
    from collections.abc import Awaitable


async def raw(call: Awaitable[object]) -> aiohttp.ClientResponse:
    """The HTTP response of a `_preload_content=False` call (read and release it)."""
    response = await call
    assert isinstance(response, aiohttp.ClientResponse), f"not a raw response: {response!r}"
    return response
