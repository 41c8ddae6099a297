"""gRPC plumbing shared by workers (servers) and the learner (client): channel options,
the shared-token check, and the server and channel factories.

Every RPC carries `authorization: Bearer <token>`; the server compares it in constant
time and answers UNAUTHENTICATED before any handler (or decoder) runs. The token comes
from the HETRL_TOKEN environment variable, never from a command line (which `ps`
shows). Servers bind to the address they are given (loopback by default). This module
knows nothing of fragments or training.
"""

from __future__ import annotations

import hmac
import os
import secrets
from concurrent import futures

import grpc

from rollout.errors import ConfigError

TOKEN_ENV = "HETRL_TOKEN"

# Both ends use the same limit, so a message one side may send the other accepts.
MAX_MESSAGE_BYTES = 256 * 1024 * 1024

# Keepalive: pings every 10 s, a peer silent for 10 s more is dead. The server accepts
# pings down to 5 s apart, so the client's pings are never punished with GOAWAY.
CHANNEL_OPTIONS: list[tuple[str, int]] = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2_000),
]
SERVER_OPTIONS: list[tuple[str, int]] = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 5_000),
    ("grpc.http2.max_ping_strikes", 0),
    ("grpc.so_reuseport", 0),
]


def new_token() -> str:
    """A fresh random shared secret."""
    return secrets.token_urlsafe(32)


def token_from_env() -> str:
    """The shared token from HETRL_TOKEN.

    Raises:
        ConfigError: the variable is unset or empty.
    """
    token = os.environ.get(TOKEN_ENV, "")
    if not token:
        raise ConfigError(
            f"{TOKEN_ENV} is not set. Every hetrl process needs the same shared secret: "
            f"export {TOKEN_ENV}=$(python -c 'import secrets; print(secrets.token_urlsafe(32))') "
            "on every host (hetrl local and hetrl launch set it for you)."
        )
    return token


def auth_metadata(token: str) -> tuple[tuple[str, str], ...]:
    """Call metadata that authenticates a client."""
    return (("authorization", f"Bearer {token}"),)


class TokenAuthInterceptor(grpc.ServerInterceptor):
    """Refuse every call whose bearer token does not match, before its handler runs."""

    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

        def deny(_request, context: grpc.ServicerContext):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong hetrl token")

        self._deny = {
            (False, False): grpc.unary_unary_rpc_method_handler(deny),
            (False, True): grpc.unary_stream_rpc_method_handler(deny),
            (True, False): grpc.stream_unary_rpc_method_handler(deny),
            (True, True): grpc.stream_stream_rpc_method_handler(deny),
        }

    def intercept_service(self, continuation, handler_call_details):
        given = dict(handler_call_details.invocation_metadata or ()).get("authorization", "")
        if hmac.compare_digest(given.encode(), self._expected):
            return continuation(handler_call_details)
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        return self._deny[(handler.request_streaming, handler.response_streaming)]


def create_server(
    address: str, token: str, max_workers: int = 4
) -> tuple[grpc.Server, int]:
    """A token-checking server bound to `address` ("host:port", port 0 picks one).

    Returns:
        The started-but-not-yet-serving server and the bound port.

    Raises:
        ConfigError: the address cannot be bound.
    """
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="grpc-server"),
        interceptors=[TokenAuthInterceptor(token)],
        options=SERVER_OPTIONS,
        maximum_concurrent_rpcs=max_workers,
    )
    try:
        port = server.add_insecure_port(address)
    except RuntimeError as exc:
        raise ConfigError(f"cannot bind {address}: {exc}") from exc
    if port == 0:
        raise ConfigError(f"cannot bind {address}: is it in use, or not an address of this host?")
    return server, port


def create_channel(address: str) -> grpc.Channel:
    """A client channel with hetrl's options (keepalive, limits, bounded backoff)."""
    return grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
