"""Security 13: TLS with certificates made here, server-only and mutual. Real gRPC on
loopback. (Checkpoints 9, the fallback from a corrupt newest checkpoint, is in
tests/learner/test_checkpoint.py, beside its subject.)"""

from __future__ import annotations

import datetime
import ipaddress
import queue
from pathlib import Path

import grpc
import pytest

from hetrl.learner.connections import WorkerStream
from hetrl.protos import hetrl_pb2_grpc
from hetrl.rollout.settings import WorkerSettings
from hetrl.rollout.transport import auth_metadata, create_server
from hetrl.rollout.worker import RolloutWorker, add_to_server
from tests.learner.test_stream import make_spec, weights_message

x509 = pytest.importorskip("cryptography.x509")
from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402

TOKEN = "test-token"


def _cert(name: str, issuer_key, issuer_name, key, ca: bool = False):
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder()
               .subject_name(x509.Name([x509.NameAttribute(x509.NameOID.COMMON_NAME, name)]))
               .issuer_name(issuer_name or x509.Name(
                   [x509.NameAttribute(x509.NameOID.COMMON_NAME, name)]))
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(hours=1))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if not ca:
        builder = builder.add_extension(x509.SubjectAlternativeName(
            [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def write_pki(root: Path) -> dict[str, Path]:
    """A CA, a server and a client certificate, as PEM files."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _cert("hetrl-test-ca", ca_key, None, ca_key, ca=True)
    paths = {"ca": root / "ca.pem"}
    paths["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    for who in ("server", "client"):
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _cert(who, ca_key, ca.subject, key)
        paths[f"{who}_cert"], paths[f"{who}_key"] = root / f"{who}.pem", root / f"{who}.key"
        paths[f"{who}_cert"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        paths[f"{who}_key"].write_bytes(key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption()))
    return paths


@pytest.mark.parametrize("client_auth", [False, True], ids=["server-tls", "mutual-tls"])
def test_tls_streams_and_refuses_plaintext(tmp_path: Path, monkeypatch, client_auth) -> None:
    pki = write_pki(tmp_path)
    monkeypatch.setenv("HETRL_TLS_CA", str(pki["ca"]))
    monkeypatch.setenv("HETRL_TLS_CERT", str(pki["server_cert"]))
    monkeypatch.setenv("HETRL_TLS_KEY", str(pki["server_key"]))
    monkeypatch.setenv("HETRL_TLS_CLIENT_AUTH", "1" if client_auth else "0")
    settings = WorkerSettings(env="CartPole-v1", envs_per_worker=2, fragment_length=4)
    worker = RolloutWorker(settings)
    server, port = create_server("127.0.0.1:0", TOKEN)
    add_to_server(worker, server)
    server.start()
    address = f"127.0.0.1:{port}"
    try:
        # A plaintext client gets nowhere.
        stub = hetrl_pb2_grpc.RolloutStub(grpc.insecure_channel(address))
        with pytest.raises(grpc.RpcError) as info:
            next(stub.Stream(iter([]), metadata=auth_metadata(TOKEN), timeout=3))
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        if client_auth:  # a TLS client without a certificate gets nowhere either
            creds = grpc.ssl_channel_credentials(root_certificates=pki["ca"].read_bytes())
            stub = hetrl_pb2_grpc.RolloutStub(grpc.secure_channel(address, creds))
            with pytest.raises(grpc.RpcError) as info:
                next(stub.Stream(iter([]), metadata=auth_metadata(TOKEN), timeout=3))
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
            monkeypatch.setenv("HETRL_TLS_CERT", str(pki["client_cert"]))
            monkeypatch.setenv("HETRL_TLS_KEY", str(pki["client_key"]))
        fan_in: queue.Queue = queue.Queue()
        stream = WorkerStream(address, TOKEN, make_spec(worker), fan_in,
                              weights_message(worker, settings, 2), credits=1,
                              connect_timeout=10)
        stream.start()
        assert fan_in.get(timeout=20)[2].policy_version == 2
        stream.stop("done", timeout=10)
    finally:
        worker.request_stop("test over")
        server.stop(0).wait(5)
        worker.close()
