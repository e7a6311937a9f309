"""Throw-away X.509 material for TLS tests: a self-signed CA, a server cert and a client cert (needs `cryptography`).

The server certificate is valid for ``127.0.0.1``, ``::1`` and ``localhost`` so clients can keep
hostname checking switched on.  Everything is PEM; private keys are unencrypted PKCS#8.
"""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from ..tls_stores import load_cert_chain

__all__ = ["TLSMaterial", "generate_certs"]


@dataclass(frozen=True)
class TLSMaterial:
    """Paths of the generated PEM files."""

    directory: Path
    ca_file: Path
    server_cert_file: Path
    server_key_file: Path
    client_cert_file: Path
    client_key_file: Path

    def client_context(self, *, with_client_cert: bool = False) -> ssl.SSLContext:
        """A client-side context that trusts only the test CA (hostname checking stays on)."""
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(self.ca_file))
        if with_client_cert:
            load_cert_chain(ctx, self.client_cert_file, self.client_key_file, password=None)
        return ctx

    def server_context(self, *, require_client_cert: bool = False) -> ssl.SSLContext:
        """A server-side context presenting the server cert (optionally demanding a client cert)."""
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(self.ca_file))
        load_cert_chain(ctx, self.server_cert_file, self.server_key_file, password=None)
        ctx.verify_mode = ssl.CERT_REQUIRED if require_client_cert else ssl.CERT_NONE
        return ctx


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _key_usage(*, ca: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=not ca,
        data_encipherment=False,
        key_agreement=not ca,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


def _leaf(
    *,
    common_name: str,
    key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    usage: x509.ObjectIdentifier,
    sans: list[x509.GeneralName],
    not_before: datetime.datetime,
    not_after: datetime.datetime,
) -> x509.Certificate:
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(ca=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(ca_key, hashes.SHA256())


def generate_certs(directory: Path, *, valid_days: int = 2) -> TLSMaterial:
    """Create ``ca.pem``, ``server.pem``/``server.key`` and ``client.pem``/``client.key`` in *directory*."""
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    not_before = now - datetime.timedelta(hours=1)
    not_after = now + datetime.timedelta(days=valid_days)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "asyncconsumer tests"),
            x509.NameAttribute(NameOID.COMMON_NAME, "asyncconsumer test CA"),
        ]
    )
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(ca=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    server_key = ec.generate_private_key(ec.SECP256R1())
    server_cert = _leaf(
        common_name="localhost",
        key=server_key,
        ca_cert=ca_cert,
        ca_key=ca_key,
        usage=ExtendedKeyUsageOID.SERVER_AUTH,
        sans=[
            x509.DNSName("localhost"),
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
            x509.IPAddress(ipaddress.ip_address("::1")),
        ],
        not_before=not_before,
        not_after=not_after,
    )

    client_key = ec.generate_private_key(ec.SECP256R1())
    client_cert = _leaf(
        common_name="asyncconsumer-test-client",
        key=client_key,
        ca_cert=ca_cert,
        ca_key=ca_key,
        usage=ExtendedKeyUsageOID.CLIENT_AUTH,
        sans=[],
        not_before=not_before,
        not_after=not_after,
    )

    material = TLSMaterial(
        directory=directory,
        ca_file=directory / "ca.pem",
        server_cert_file=directory / "server.pem",
        server_key_file=directory / "server.key",
        client_cert_file=directory / "client.pem",
        client_key_file=directory / "client.key",
    )
    material.ca_file.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    material.server_cert_file.write_bytes(server_cert.public_bytes(serialization.Encoding.PEM))
    _write_key(material.server_key_file, server_key)
    material.client_cert_file.write_bytes(client_cert.public_bytes(serialization.Encoding.PEM))
    _write_key(material.client_key_file, client_key)
    return material
