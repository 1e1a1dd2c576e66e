"""The ``v1beta1.Registration`` service kubelet serves on ``kubelet.sock``.

A thin gRPC adapter: the decision (validate, dial back, replace an older
registration) lives in the emulator's ``register`` coroutine; this module turns
its refusals into gRPC errors the registering plugin sees, as kubelet does.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import grpc  # type: ignore[import-untyped, unused-ignore]
from grpc import aio  # type: ignore[import-untyped, unused-ignore]

from proto.v1beta1 import api_pb2, api_pb2_grpc
from shared.testing.kubelet_emulator.errors import RegistrationError

__all__ = ["RegisterHandler", "RegistrationService"]

logger = logging.getLogger(__name__)

RegisterHandler = Callable[[api_pb2.RegisterRequest], Awaitable[None]]
"""Registers a plugin or raises :class:`RegistrationError` (refused) / ``OSError``, ``TimeoutError``
or ``grpc.aio.AioRpcError`` (the plugin could not be reached)."""


class RegistrationService(api_pb2_grpc.RegistrationServicer):
    """Serves Register by delegating to the emulator."""

    def __init__(self, register: RegisterHandler) -> None:
        self._register = register

    def add_to(self, server: aio.Server) -> None:
        api_pb2_grpc.add_RegistrationServicer_to_server(self, server)  # type: ignore[no-untyped-call]

    async def Register(
        self,
        request: api_pb2.RegisterRequest,
        context: aio.ServicerContext[api_pb2.RegisterRequest, api_pb2.Empty],
    ) -> api_pb2.Empty:
        try:
            await self._register(request)
        except RegistrationError as exc:
            logger.warning(
                "registration refused",
                extra={"resource": request.resource_name, "error": str(exc)},
            )
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except (OSError, TimeoutError, aio.AioRpcError) as exc:
            detail = f"failed to dial device plugin {request.endpoint!r}: {exc or 'timeout'}"
            logger.warning(
                "registration failed", extra={"resource": request.resource_name, "error": detail}
            )
            await context.abort(grpc.StatusCode.UNAVAILABLE, detail)
        return api_pb2.Empty()
