"""Fixtures of the launch tests."""

from __future__ import annotations

import socket

import pytest


@pytest.fixture
def aws_offline(monkeypatch, tmp_path):
    """Fake credentials, no metadata service, telemetry off; resolving or connecting fails."""
    sdk_config = tmp_path / "sagemaker-config.yaml"
    sdk_config.write_text(
        "SchemaVersion: '1.0'\nSageMaker:\n  PythonSDK:\n    Modules:\n"
        "      TelemetryOptOut: true\n")
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing", "AWS_SECURITY_TOKEN": "testing",
        "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_CONFIG_FILE": str(tmp_path / "none"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
        "SAGEMAKER_ADMIN_CONFIG_OVERRIDE": str(sdk_config),
        "SAGEMAKER_USER_CONFIG_OVERRIDE": str(sdk_config),
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.delenv("SAGEMAKER_VALIDATE_ROLE", raising=False)

    def refuse(*args, **kwargs):
        raise AssertionError(f"a test tried to reach the network: {args}")

    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
