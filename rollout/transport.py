"""gRPC plumbing shared by workers (servers) and the learner (client): channel options,
the shared-token check, and the server and channel factories.

Every RPC carries `authorization: Bearer <token>`; the server compares it in constant
time and answers UNAUTHENTICATED before any handler (or decoder) runs. The token comes
from the HETRL_TOKEN environment variable, never from a command line (which `ps`
shows). TLS is optional (HETRL_TLS_* paths). Servers bind to the address they are
given (loopback by default, the cluster interface in a job), never to all interfaces
unless that address is asked for. This module knows nothing of fragments or training.
"""

from __future__ import annotations

import dataclasses
import hmac
import os
import secrets
from concurrent import futures
from pathlib import Path

import grpc

from hetrl.rollout.errors import ConfigError

TOKEN_ENV = "HETRL_TOKEN"
TLS_ENV = {"ca": "HETRL_TLS_CA", "cert": "HETRL_TLS_CERT", "key": "HETRL_TLS_KEY"}
TLS_CLIENT_AUTH_ENV = "HETRL_TLS_CLIENT_AUTH"
TLS_SERVER_NAME_ENV = "HETRL_TLS_SERVER_NAME"

# Both ends use the same limit, so a message one side may send the other accepts.
MAX_MESSAGE_BYTES = 256 * 1024 * 1024


@dataclasses.dataclass(frozen=True)
class TransportOptions:
    """gRPC settings both ends agree on; `channel_options`/`server_options` render them.

    Keepalive: each side pings every `keepalive_time` s, even without calls, and a peer
    that does not answer within `keepalive_timeout` s is declared gone, so a frozen or
    unplugged host is detected within their sum. The server accepts pings down to half
    the client's interval, so the client's pings are never punished with GOAWAY.
    Reconnects back off from 0.2 s to at most 2 s: a restarted worker is found quickly.
    """

    keepalive_time: float = 10.0
    keepalive_timeout: float = 10.0
    max_message_bytes: int = MAX_MESSAGE_BYTES
    max_concurrent_rpcs: int = 4
    max_receive_bytes: int = 0
    """Largest message this end accepts; 0: max_message_bytes. A server sizes it from
    what its peer may send (a worker: one set of weights; an env host: a control
    request), so a peer holding the token cannot make it buffer hundreds of MiB."""

    def _common(self) -> list[tuple[str, int]]:
        return [
            ("grpc.max_send_message_length", self.max_message_bytes),
            ("grpc.max_receive_message_length",
             self.max_receive_bytes or self.max_message_bytes),
            ("grpc.keepalive_time_ms", int(self.keepalive_time * 1000)),
            ("grpc.keepalive_timeout_ms", int(self.keepalive_timeout * 1000)),
            # gRPC >= 1.5x times out a server's keepalive pings with the general ping
            # timeout (default 60 s), not keepalive_timeout: without this a worker never
            # noticed a learner frozen for 25 s.
            ("grpc.http2.ping_timeout_ms", int(self.keepalive_timeout * 1000)),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),
        ]

    def channel_options(self) -> list[tuple[str, int | str]]:
        options: list[tuple[str, int | str]] = [
            *self._common(),
            ("grpc.initial_reconnect_backoff_ms", 200),
            ("grpc.min_reconnect_backoff_ms", 200),
            ("grpc.max_reconnect_backoff_ms", 2_000),
            ("grpc.enable_retries", 0),  # hetrl retries itself, with its own deadlines
        ]
        name = os.environ.get(TLS_SERVER_NAME_ENV, "")
        if name:
            options.append(("grpc.ssl_target_name_override", name))
        return options

    def server_options(self) -> list[tuple[str, int]]:
        return [
            *self._common(),
            ("grpc.http2.min_recv_ping_interval_without_data_ms",
             int(self.keepalive_time * 1000 / 2)),
            ("grpc.http2.max_ping_strikes", 0),
            ("grpc.so_reuseport", 0),
        ]


DEFAULT_OPTIONS = TransportOptions()
# Kept for readers of the defaults; create_server/create_channel take TransportOptions.
CHANNEL_OPTIONS = DEFAULT_OPTIONS.channel_options()
SERVER_OPTIONS = DEFAULT_OPTIONS.server_options()


def transport_options(settings: object) -> TransportOptions:
    """TransportOptions from any settings with keepalive_time / keepalive_timeout."""
    return TransportOptions(
        keepalive_time=getattr(settings, "keepalive_time", DEFAULT_OPTIONS.keepalive_time),
        keepalive_timeout=getattr(settings, "keepalive_timeout",
                                  DEFAULT_OPTIONS.keepalive_timeout),
    )


@dataclasses.dataclass(frozen=True)
class TlsFiles:
    """PEM contents for optional TLS, read from HETRL_TLS_CA/CERT/KEY (paths).

    A server needs cert and key (and CA when client certificates are required, with
    HETRL_TLS_CLIENT_AUTH=1); a client needs the CA (and its own cert and key when the
    server requires them). Paths travel in the environment like the token, so every
    process of a job picks them up without a flag on any command line.
    """

    ca: bytes | None
    cert: bytes | None
    key: bytes | None
    client_auth: bool

    @classmethod
    def from_env(cls) -> TlsFiles | None:
        paths = {name: os.environ.get(var, "") for name, var in TLS_ENV.items()}
        if not any(paths.values()):
            return None
        loaded: dict[str, bytes | None] = {}
        for name, path in paths.items():
            try:
                loaded[name] = Path(path).read_bytes() if path else None
            except OSError as exc:
                raise ConfigError(f"{TLS_ENV[name]}={path}: cannot read it ({exc})") from exc
        client_auth = os.environ.get(TLS_CLIENT_AUTH_ENV, "") in ("1", "true", "yes")
        if loaded["ca"] is None:
            raise ConfigError(f"TLS needs {TLS_ENV['ca']} (the CA that signed the certificates)")
        if (loaded["cert"] is None) != (loaded["key"] is None):
            raise ConfigError(f"set both {TLS_ENV['cert']} and {TLS_ENV['key']}, or neither")
        return cls(loaded["ca"], loaded["cert"], loaded["key"], client_auth)


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
    address: str, token: str, max_workers: int = 4,
    options: TransportOptions = DEFAULT_OPTIONS,
) -> tuple[grpc.Server, int]:
    """A token-checking server bound to `address` ("host:port", port 0 picks one), with
    TLS when HETRL_TLS_* is set. At most `max_workers` calls run at once; more are
    refused with RESOURCE_EXHAUSTED rather than queued without bound.

    Returns:
        The started-but-not-yet-serving server and the bound port.

    Raises:
        ConfigError: the address cannot be bound, or the TLS files are incomplete.
    """
    tls = TlsFiles.from_env()
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="grpc-server"),
        interceptors=[TokenAuthInterceptor(token)],
        options=options.server_options(),
        maximum_concurrent_rpcs=max_workers,
    )
    try:
        if tls is None:
            port = server.add_insecure_port(address)
        else:
            if tls.cert is None or tls.key is None:
                raise ConfigError(f"a TLS server needs {TLS_ENV['cert']} and {TLS_ENV['key']}")
            credentials = grpc.ssl_server_credentials(
                [(tls.key, tls.cert)], root_certificates=tls.ca if tls.client_auth else None,
                require_client_auth=tls.client_auth,
            )
            port = server.add_secure_port(address, credentials)
    except RuntimeError as exc:
        raise ConfigError(f"cannot bind {address}: {exc}") from exc
    if port == 0:
        raise ConfigError(f"cannot bind {address}: is it in use, or not an address of this host?")
    return server, port


def create_channel(address: str, options: TransportOptions = DEFAULT_OPTIONS) -> grpc.Channel:
    """A client channel with hetrl's options (keepalive, limits, bounded backoff), over
    TLS when HETRL_TLS_* is set."""
    tls = TlsFiles.from_env()
    if tls is None:
        return grpc.insecure_channel(address, options=options.channel_options())
    credentials = grpc.ssl_channel_credentials(
        root_certificates=tls.ca,
        private_key=tls.key if tls.client_auth else None,
        certificate_chain=tls.cert if tls.client_auth else None,
    )
    return grpc.secure_channel(address, credentials, options=options.channel_options())
