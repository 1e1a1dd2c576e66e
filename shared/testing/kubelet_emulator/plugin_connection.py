"""kubelet's client side of one registered device plugin.

Made inside the Register call, as kubelet does: dial the plugin's socket, ask
GetDevicePluginOptions, then keep ListAndWatch open in a task this connection
owns. The generated gRPC stub has no type information, so every call to it is
wrapped here in a small typed method and nothing else in the emulator touches
the stub.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

from grpc import aio  # type: ignore[import-untyped, unused-ignore]

from proto.v1beta1 import api_pb2, api_pb2_grpc
from shared.testing.kubelet_emulator.ledger import PluginDevice

if TYPE_CHECKING:
    from pathlib import Path

__all__ = ["DevicesCallback", "EndedCallback", "PluginConnection", "describe_rpc_error"]

logger = logging.getLogger(__name__)

DevicesCallback = Callable[["PluginConnection", list[PluginDevice]], Awaitable[None]]
"""Called with every ListAndWatch message (the full device list)."""
EndedCallback = Callable[["PluginConnection"], Awaitable[None]]
"""Called once when the ListAndWatch stream ends or fails (not when closed by kubelet)."""


class PluginConnection:
    """An open channel to one plugin plus its ListAndWatch task."""

    def __init__(
        self,
        resource: str,
        socket_path: Path,
        channel: aio.Channel,
        options: api_pb2.DevicePluginOptions,
    ) -> None:
        self.resource = resource
        self.socket_path = socket_path
        self.options = options
        self._channel = channel
        self._stub = api_pb2_grpc.DevicePluginStub(channel)  # type: ignore[no-untyped-call]
        self._watch: asyncio.Task[None] | None = None
        self.connected = True
        """False once the ListAndWatch stream has ended."""

    @classmethod
    async def connect(
        cls, resource: str, socket_path: Path, *, dial_timeout: float
    ) -> PluginConnection:
        """Dial the plugin (``socket_path`` absolute) and fetch its options.

        The channel is closed again on any failure, cancellation included.
        """
        channel = aio.insecure_channel(f"unix://{socket_path}")
        try:
            async with asyncio.timeout(dial_timeout):
                await channel.channel_ready()
            stub = api_pb2_grpc.DevicePluginStub(channel)  # type: ignore[no-untyped-call]
            options: api_pb2.DevicePluginOptions = await stub.GetDevicePluginOptions(
                api_pb2.Empty()
            )
        except BaseException:
            await channel.close()
            raise
        return cls(resource, socket_path, channel, options)

    def start_watching(self, on_devices: DevicesCallback, on_ended: EndedCallback) -> None:
        """Open ListAndWatch in a task owned by this connection."""
        if self._watch is not None:
            raise RuntimeError("already watching")
        self._watch = asyncio.create_task(
            self._list_and_watch(on_devices, on_ended), name=f"list-and-watch:{self.resource}"
        )

    async def get_preferred_allocation(
        self, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str] | None:
        """The plugin's advice for one container; None when it sent no container response."""
        request = api_pb2.PreferredAllocationRequest(
            container_requests=[
                api_pb2.ContainerPreferredAllocationRequest(
                    available_deviceIDs=list(available),
                    must_include_deviceIDs=list(must_include),
                    allocation_size=size,
                )
            ]
        )
        response: api_pb2.PreferredAllocationResponse = await self._stub.GetPreferredAllocation(
            request
        )
        if not response.container_responses:
            return None
        return list(response.container_responses[0].deviceIDs)

    async def allocate(self, device_ids: Sequence[str]) -> api_pb2.AllocateResponse:
        request = api_pb2.AllocateRequest(
            container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=list(device_ids))]
        )
        response: api_pb2.AllocateResponse = await self._stub.Allocate(request)
        return response

    async def close(self) -> None:
        """Stop watching and close the channel (kubelet dropping the plugin)."""
        self.connected = False
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        await self._channel.close()

    async def _list_and_watch(self, on_devices: DevicesCallback, on_ended: EndedCallback) -> None:
        error = "end of stream"
        try:
            async for message in self._stub.ListAndWatch(api_pb2.Empty()):
                await on_devices(self, _devices_of(message))
        except aio.AioRpcError as exc:
            error = describe_rpc_error(exc)
        except Exception as exc:  # a failing callback must not end the stream silently
            logger.exception("list and watch failed", extra={"resource": self.resource})
            error = repr(exc)
        logger.warning("list and watch ended", extra={"resource": self.resource, "error": error})
        self.connected = False
        await on_ended(self)


def _devices_of(message: api_pb2.ListAndWatchResponse) -> list[PluginDevice]:
    return [PluginDevice.from_proto(device) for device in message.devices]


def describe_rpc_error(exc: aio.AioRpcError) -> str:
    """An RPC error the way kubelet's Go client prints it."""
    code = "".join(part.capitalize() for part in exc.code().name.split("_"))
    return f"rpc error: code = {code} desc = {exc.details()}"
