"""The data path's channel to one PS node, in C++ (``recstore._native.DataChannel``).

Pull, Push, Update, MultiPull and MultiUpdate leave the trainer through gRPC
C++ (the system's libgrpc++, callback API, raw bytes): the request is sent from
the caller's bytes without a copy and the GIL is released while the call is in
flight, so the step's encoder, the other nodes' senders and the trainer run
meanwhile. The rest of the SDK sees a grpcio call: a failure is raised as a
``grpc.RpcError`` with ``code()``, ``details()`` and ``trailing_metadata()``,
read by the same mapping to the SDK's errors (``nodes.map_rpc_error``) and the
same resend rule as before. The channel takes grpcio's options (message
limits, reconnect backoff, ``ssl_target_name_override``) and the same TLS
files; control calls and the row streams stay on grpcio.
"""

from __future__ import annotations

from typing import Any

import grpc

from recstore import _native as _native_module
from recstore.core.tls import ChannelOptions, ClientTls

#: the compiled module (no type stubs)
_native: Any = _native_module
#: gRPC's status codes by number, as the C++ call reports them
CODES = {code.value[0]: code for code in grpc.StatusCode}
#: the details of a call given up on because its node could not be reached
UNREACHABLE: str = _native.DataChannel.UNREACHABLE


class NativeRpcError(grpc.RpcError):
    """A failed native call, read like grpcio's ``grpc.Call`` by the SDK's error mapping."""

    def __init__(self, code: grpc.StatusCode, details: str, trailing: tuple[Any, ...]) -> None:
        super().__init__(f"{code.name}: {details}")
        self._code, self._details, self._trailing = code, details, trailing

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple[Any, ...]:
        return self._trailing


#: a request's bytes, whole or in parts (sent one after the other, none copied)
Message = bytes | tuple[bytes, ...]


def unreachable(error: grpc.RpcError) -> bool:
    """Whether a call failed because its node could not be reached (it was never sent)."""
    return isinstance(error, NativeRpcError) and (
        error.code() is grpc.StatusCode.UNAVAILABLE and error.details() == UNREACHABLE
    )


class PendingCall:
    """A data call in flight (``DataChannel.start``)."""

    def __init__(self, native: Any) -> None:
        self._native = native

    def wait(self, unreachable_after: float = 0.0) -> bytes:
        """The reply; NativeRpcError on failure. ``unreachable_after`` > 0: a call the
        channel could not connect for that many seconds in a row is given up on, never
        sent (``unreachable`` tells that failure)."""
        code, payload, trailing = self._native.wait(unreachable_after)
        if code:
            raise NativeRpcError(CODES[code], payload, trailing)
        reply: bytes = payload
        return reply


class DataChannel:
    """Raw unary calls to one endpoint: plaintext, or TLS (mutual when ``tls`` has an identity)."""

    def __init__(self, endpoint: str, tls: ClientTls | None, options: ChannelOptions) -> None:
        arguments = [*options, *(tls.channel_options() if tls is not None else ())]
        pems = None
        if tls is not None:
            ca, key, cert = tls.pems()
            pems = (ca.decode(), (key or b"").decode(), (cert or b"").decode())
        self._channel = _native.DataChannel(endpoint, arguments, pems)

    def start(
        self, method: str, request: Message, *, timeout: float | None,
        metadata: tuple[tuple[str, str], ...], wait_for_ready: bool,
    ) -> PendingCall:  # fmt: skip
        """Send ``request`` on ``method`` (its full path) now; its answer waits in the
        returned call. A request in parts goes out as the message of their bytes one
        after the other, each sent from its own buffer. Calls started one after another
        are in flight together: waiting for one drives the others' transfers too."""
        return PendingCall(
            self._channel.start(method, request, timeout or 0.0, wait_for_ready, list(metadata))
        )

    def call(
        self, method: str, request: Message, *, timeout: float | None,
        metadata: tuple[tuple[str, str], ...], wait_for_ready: bool,
        unreachable_after: float = 0.0,
    ) -> bytes:  # fmt: skip
        """``start`` and wait: the reply, or NativeRpcError (``PendingCall.wait``)."""
        pending = self.start(
            method, request, timeout=timeout, metadata=metadata, wait_for_ready=wait_for_ready
        )
        return pending.wait(unreachable_after)

    def close(self) -> None:
        self._channel.close()
