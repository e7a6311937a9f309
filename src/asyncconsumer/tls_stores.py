"""Java key stores and trust stores for TLS: JKS, PKCS12 and PEM, as the Java client reads them.

``from_properties`` builds its ``ssl.SSLContext`` with :func:`ssl_context_from_properties` from
the Java client's ``ssl.*`` properties (and librdkafka's ``ssl.ca.location`` and friends):

- a **trust store** (``ssl.truststore.location`` + ``ssl.truststore.type`` JKS, PKCS12 or PEM, or
  ``ssl.truststore.certificates`` as PEM text) gives the CAs the broker's certificate must chain to;
- a **key store** (``ssl.keystore.location`` + type, or ``ssl.keystore.key`` and
  ``ssl.keystore.certificate.chain`` as PEM text) gives the client certificate and its key.

JKS is read here (its format: trusted certificates, and private keys protected by Sun's
SHA-1 key protector; the store's SHA-1 integrity digest is checked when a password is given).
PKCS12 is read with the ``cryptography`` package (``pip install cryptography``).  JCEKS and other
types are rejected: convert them with ``keytool -importkeystore -deststoretype PKCS12``.

A private key may be encrypted (a PEM key store, ``ssl.keystore.key``, librdkafka's
``ssl.key.location``): ``ssl.key.password`` decrypts it.  Every key goes through
:func:`load_cert_chain`, which always hands OpenSSL a password callback: without one, OpenSSL
would ask on the terminal ("Enter PEM pass phrase:") and wait there, or fail with ``EINVAL``
where there is none.  A key that needs a password nobody gave is a :class:`ConfigError` naming
``ssl.key.password``.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import os
import ssl
import struct
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .errors import ConfigError

__all__ = ["KeyStore", "load_cert_chain", "load_store", "ssl_context_from_properties"]

_JKS_MAGIC = 0xFEEDFEED
_JCEKS_MAGIC = 0xCECECECE
_JKS_PRIVATE_KEY, _JKS_TRUSTED_CERT = 1, 2
# The Sun JKS key protector (1.3.6.1.4.1.42.2.17.1.1), DER-encoded.
_JKS_KEY_PROTECTOR_OID = bytes.fromhex("2b060104012a02110101")
_TLS_VERSIONS = {
    "TLSv1": ssl.TLSVersion.TLSv1,
    "TLSv1.1": ssl.TLSVersion.TLSv1_1,
    "TLSv1.2": ssl.TLSVersion.TLSv1_2,
    "TLSv1.3": ssl.TLSVersion.TLSv1_3,
}


@dataclass
class KeyStore:
    """What a store holds, as PEM text: trusted certificates, and a private key with its chain."""

    certificates: list[str] = field(default_factory=list)
    key: str | None = None
    chain: list[str] = field(default_factory=list)


def load_store(path: str, store_type: str, password: str | None, key_password: str | None = None) -> KeyStore:
    """Read the JKS, PKCS12 or PEM store at ``path``; a :class:`ConfigError` names what is wrong."""
    kind = store_type.strip().upper()
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise ConfigError(f"cannot read the {kind} store {path}: {exc}") from exc
    if kind == "PEM":
        return _pem_store(data.decode("ascii", errors="replace"))
    if kind == "PKCS12":
        return _pkcs12_store(data, path, password, key_password)
    if kind == "JKS":
        if len(data) >= 4 and struct.unpack(">I", data[:4])[0] == _JCEKS_MAGIC:
            raise ConfigError(f"{path} is a JCEKS store: convert it with keytool -importkeystore -deststoretype PKCS12")
        if len(data) >= 4 and struct.unpack(">I", data[:4])[0] != _JKS_MAGIC:
            # Java's JKS type also reads PKCS12 files (keystore.type.compat), and so does this.
            return _pkcs12_store(data, path, password, key_password)
        return _jks_store(data, path, password, key_password)
    raise ConfigError(f"store type {store_type!r} of {path} is not supported: use JKS, PKCS12 or PEM")


# -------------------------------------------------------------------------------------- PEM


def _pem_blocks(text: str) -> Iterator[tuple[str, str]]:
    """(label, whole block) for each PEM block in ``text``."""
    pos = 0
    while (begin := text.find("-----BEGIN ", pos)) >= 0:
        label_end = text.find("-----", begin + 11)
        label = text[begin + 11 : label_end]
        end_marker = f"-----END {label}-----"
        end = text.find(end_marker, label_end)
        if label_end < 0 or end < 0:
            return
        pos = end + len(end_marker)
        yield label, text[begin:pos] + "\n"


def _pem_store(text: str) -> KeyStore:
    store = KeyStore()
    for label, block in _pem_blocks(text):
        if label == "CERTIFICATE":
            store.certificates.append(block)
        elif label.endswith("PRIVATE KEY"):
            store.key = block
    store.chain = list(store.certificates) if store.key is not None else []
    return store


# ----------------------------------------------------------------------------------- PKCS12


def _pkcs12_store(data: bytes, path: str, password: str | None, key_password: str | None) -> KeyStore:
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.serialization import pkcs12
    except ImportError:
        raise ConfigError(f"{path}: PKCS12 stores need the cryptography package (pip install cryptography)") from None
    last: Exception | None = None
    for secret in dict.fromkeys((password, key_password, None)):
        try:
            loaded = pkcs12.load_pkcs12(data, secret.encode() if secret else None)
            break
        except ValueError as exc:  # wrong password, or not PKCS12
            last = exc
    else:
        raise ConfigError(f"cannot open the PKCS12 store {path} (wrong password?): {last}")
    pem = serialization.Encoding.PEM
    store = KeyStore(
        certificates=[c.certificate.public_bytes(pem).decode() for c in loaded.additional_certs],
    )
    if loaded.key is not None and loaded.cert is not None:
        store.key = loaded.key.private_bytes(
            pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ).decode()
        store.chain = [loaded.cert.certificate.public_bytes(pem).decode(), *store.certificates]
    elif loaded.cert is not None:
        store.certificates.insert(0, loaded.cert.certificate.public_bytes(pem).decode())
    return store


# -------------------------------------------------------------------------------------- JKS


class _Reader:
    def __init__(self, data: bytes, path: str) -> None:
        self.data, self.pos, self.path = data, 0, path

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise ConfigError(f"{self.path} is not a valid JKS store (truncated)")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def u16(self) -> int:
        return int(struct.unpack(">H", self.take(2))[0])

    def u32(self) -> int:
        return int(struct.unpack(">I", self.take(4))[0])

    def utf(self) -> str:
        return self.take(self.u16()).decode("utf-8", errors="replace")


def _jks_store(data: bytes, path: str, password: str | None, key_password: str | None) -> KeyStore:
    r = _Reader(data, path)
    r.u32()  # the magic, checked by the caller
    version = r.u32()
    if version not in (1, 2):
        raise ConfigError(f"{path}: JKS version {version} is not supported")
    store = KeyStore()
    encrypted_keys: list[bytes] = []
    for _ in range(r.u32()):
        tag = r.u32()
        r.utf()  # alias
        r.take(8)  # creation time
        if tag == _JKS_TRUSTED_CERT:
            store.certificates.append(_jks_cert(r, version))
        elif tag == _JKS_PRIVATE_KEY:
            encrypted_keys.append(r.take(r.u32()))
            chain = [_jks_cert(r, version) for _ in range(r.u32())]
            if not store.chain:
                store.chain = chain
        else:
            raise ConfigError(f"{path}: JKS entry type {tag} is not supported (convert the store to PKCS12)")
    body_end = r.pos
    digest = r.take(20)
    if password:
        expected = hashlib.sha1(
            password.encode("utf-16-be") + b"Mighty Aphrodite" + data[:body_end], usedforsecurity=False
        ).digest()
        if not hmac.compare_digest(digest, expected):
            raise ConfigError(f"{path}: the JKS store's integrity check failed (wrong ssl.*store.password?)")
    if encrypted_keys:
        secret = key_password if key_password is not None else password
        if secret is None:
            raise ConfigError(f"{path}: the JKS private key needs ssl.key.password (or the store password)")
        store.key = _jks_private_key(encrypted_keys[0], secret, path)
    return store


def _jks_cert(r: _Reader, version: int) -> str:
    if version == 2:
        kind = r.utf()
        if kind != "X.509":
            raise ConfigError(f"{r.path}: certificate type {kind!r} is not supported")
    return ssl.DER_cert_to_PEM_cert(r.take(r.u32()))


def _der(data: bytes, pos: int) -> tuple[int, int, int]:
    """(tag, start of the value, end of the value) of the DER element at ``pos``."""
    tag, length = data[pos], data[pos + 1]
    pos += 2
    if length & 0x80:
        count = length & 0x7F
        length = int.from_bytes(data[pos : pos + count], "big")
        pos += count
    return tag, pos, pos + length


def _jks_private_key(encrypted_info: bytes, password: str, path: str) -> str:
    """The PKCS#8 key of a JKS key entry (EncryptedPrivateKeyInfo with Sun's key protector)."""
    try:
        _, body, _ = _der(encrypted_info, 0)  # SEQUENCE
        _, alg_body, alg_end = _der(encrypted_info, body)  # AlgorithmIdentifier
        _, oid_start, oid_end = _der(encrypted_info, alg_body)
        oid = encrypted_info[oid_start:oid_end]
        _, data_start, data_end = _der(encrypted_info, alg_end)  # OCTET STRING
    except IndexError:
        raise ConfigError(f"{path}: a JKS private key entry is malformed") from None
    if oid != _JKS_KEY_PROTECTOR_OID:
        raise ConfigError(f"{path}: the JKS private key is not protected by the JKS key protector")
    protected = encrypted_info[data_start:data_end]
    salt, cipher, check = protected[:20], protected[20:-20], protected[-20:]
    secret = password.encode("utf-16-be")
    stream = bytearray()
    digest = salt
    while len(stream) < len(cipher):
        digest = hashlib.sha1(secret + digest, usedforsecurity=False).digest()
        stream.extend(digest)
    plain = bytes(a ^ b for a, b in zip(cipher, stream, strict=False))
    if not hmac.compare_digest(hashlib.sha1(secret + plain, usedforsecurity=False).digest(), check):
        raise ConfigError(f"{path}: cannot decrypt the JKS private key (wrong ssl.key.password?)")
    lines = base64.encodebytes(plain).decode("ascii").replace("\n", "")
    wrapped = "\n".join(lines[i : i + 64] for i in range(0, len(lines), 64))
    return f"-----BEGIN PRIVATE KEY-----\n{wrapped}\n-----END PRIVATE KEY-----\n"


# ------------------------------------------------------------------------------- SSLContext


def ssl_context_from_properties(props: Mapping[str, str]) -> ssl.SSLContext:
    """An ``SSLContext`` from the Java client's and librdkafka's ``ssl.*`` properties."""
    cadata: list[str] = []
    cafile = props.get("ssl.ca.location")
    if "ssl.truststore.location" in props:
        trust_type = props.get("ssl.truststore.type", "JKS")
        trust = load_store(props["ssl.truststore.location"], trust_type, props.get("ssl.truststore.password"))
        cadata.extend(trust.certificates or trust.chain)
        if not cadata:
            raise ConfigError(f"the trust store {props['ssl.truststore.location']} holds no certificate")
    if "ssl.truststore.certificates" in props:
        cadata.extend(block for _, block in _pem_blocks(props["ssl.truststore.certificates"]))
    try:
        context = ssl.create_default_context(cafile=cafile, cadata="".join(cadata) or None)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load the trusted certificates given in ssl.* properties: {exc}") from exc
    # librdkafka turns hostname checks off with "none", the Java client with "" (empty).
    if props.get("ssl.endpoint.identification.algorithm", "https").strip().lower() in ("none", ""):
        context.check_hostname = False
    _set_versions(context, props)
    key_password = props.get("ssl.key.password")
    try:
        if "ssl.certificate.location" in props:
            where = props.get("ssl.key.location") or props["ssl.certificate.location"]
            load_cert_chain(context, props["ssl.certificate.location"], props.get("ssl.key.location"),
                            password=key_password, where=where)
        elif "ssl.keystore.location" in props:
            store = load_store(
                props["ssl.keystore.location"],
                props.get("ssl.keystore.type", "JKS"),
                props.get("ssl.keystore.password"),
                key_password,
            )
            if store.key is None:
                raise ConfigError(f"the key store {props['ssl.keystore.location']} holds no private key")
            # JKS and PKCS12 keys come out decrypted; a PEM store's key may still be encrypted.
            _load_chain(context, store.key, store.chain, key_password, props["ssl.keystore.location"])
        elif "ssl.keystore.key" in props:
            chain = [block for _, block in _pem_blocks(props.get("ssl.keystore.certificate.chain", ""))]
            if not chain:
                raise ConfigError("ssl.keystore.key needs ssl.keystore.certificate.chain (PEM)")
            _load_chain(context, props["ssl.keystore.key"], chain, key_password, "ssl.keystore.key")
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load the client certificate given in ssl.* properties: {exc}") from exc
    return context


def load_cert_chain(
    context: ssl.SSLContext,
    certfile: str | Path,
    keyfile: str | Path | None = None,
    *,
    password: str | None,
    where: str | None = None,
) -> None:
    """``context.load_cert_chain(certfile, keyfile)`` that never lets OpenSSL prompt for a pass phrase.

    ``password`` decrypts an encrypted key (``ssl.key.password``); OpenSSL asks for it only when the
    key is encrypted.  An encrypted key without a password, or with a wrong one, is a
    :class:`ConfigError` naming ``where`` (the key's file, by default) and ``ssl.key.password``.
    """
    where = str(where or keyfile or certfile)
    asked = False

    def key_password() -> str:
        nonlocal asked
        asked = True
        if password is None:
            raise ConfigError(f"the private key in {where} is encrypted: give its password in ssl.key.password")
        return password

    try:
        context.load_cert_chain(certfile, keyfile, password=key_password)
    except ssl.SSLError as exc:
        if asked:  # OpenSSL's "[SSL] PEM lib" says no more
            raise ConfigError(
                f"cannot decrypt the private key in {where} with ssl.key.password (wrong password?): {exc}"
            ) from exc
        raise


def _set_versions(context: ssl.SSLContext, props: Mapping[str, str]) -> None:
    enabled = [v.strip() for v in props.get("ssl.enabled.protocols", "").split(",") if v.strip()]
    protocol = props.get("ssl.protocol", "").strip()
    for name in [*enabled, *([protocol] if protocol not in ("", "TLS") else [])]:
        if name not in _TLS_VERSIONS:
            raise ConfigError(f"TLS version {name!r} is not supported: use {', '.join(_TLS_VERSIONS)}")
    if enabled:
        context.minimum_version = min((_TLS_VERSIONS[v] for v in enabled), key=lambda v: v.value)
        context.maximum_version = max((_TLS_VERSIONS[v] for v in enabled), key=lambda v: v.value)
    if protocol in _TLS_VERSIONS:
        highest = _TLS_VERSIONS[protocol]
        if context.maximum_version.value < 0 or highest.value < context.maximum_version.value:
            context.maximum_version = highest


def _load_chain(context: ssl.SSLContext, key: str, chain: list[str], password: str | None, where: str) -> None:
    """``load_cert_chain`` from PEM text: through a private temporary file, removed at once."""
    fd, name = tempfile.mkstemp(prefix="asyncconsumer-", suffix=".pem")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(key + "".join(chain))
        load_cert_chain(context, name, password=password, where=where)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(name)
