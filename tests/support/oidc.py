"""A tiny OAuth 2 token endpoint and JWKS server on loopback, signing real JWTs (RS256).

``POST /token`` takes the client-credentials grant (HTTP Basic client id and secret) and answers
``{"access_token": <JWT>, "token_type": "Bearer", "expires_in": ...}``; ``GET /jwks`` serves the
public key, which Apache Kafka's OAuthBearerValidatorCallbackHandler (KIP-768) checks tokens with.
"""

from __future__ import annotations

import base64
import json
import threading
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from asyncconsumer.testing.kafka import OAUTH_AUDIENCE, OAUTH_ISSUER


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _uint(value: int) -> str:
    return _b64url(value.to_bytes((value.bit_length() + 7) // 8, "big"))


@dataclass
class TokenServer:
    """Issues tokens to ``clients`` (id -> secret); counts the token requests it answered."""

    clients: dict[str, str]
    lifetime_s: int = 3600
    kid: str = "test-key-1"
    port: int = 0
    token_requests: list[dict[str, str]] = field(default_factory=list)
    key: rsa.RSAPrivateKey = field(
        default_factory=lambda: rsa.generate_private_key(public_exponent=65537, key_size=2048)
    )

    @property
    def token_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/token"

    @property
    def jwks_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/jwks"

    def jwks(self) -> dict[str, Any]:
        numbers = self.key.public_key().public_numbers()
        return {
            "keys": [
                {
                    "kty": "RSA",
                    "use": "sig",
                    "alg": "RS256",
                    "kid": self.kid,
                    "n": _uint(numbers.n),
                    "e": _uint(numbers.e),
                }
            ]
        }

    def sign(self, claims: dict[str, Any]) -> str:
        header = _b64url(json.dumps({"alg": "RS256", "typ": "JWT", "kid": self.kid}).encode())
        payload = _b64url(json.dumps(claims).encode())
        signature = self.key.sign(f"{header}.{payload}".encode(), padding.PKCS1v15(), hashes.SHA256())
        return f"{header}.{payload}.{_b64url(signature)}"

    def issue(self, client_id: str, scope: str | None) -> str:
        now = int(time.time())
        claims: dict[str, Any] = {
            "sub": client_id,
            "iat": now,
            "exp": now + self.lifetime_s,
            "iss": OAUTH_ISSUER,
            "aud": OAUTH_AUDIENCE,
        }
        if scope:
            claims["scope"] = scope
        return self.sign(claims)


@contextmanager
def token_server(clients: dict[str, str], *, lifetime_s: int = 3600) -> Iterator[TokenServer]:
    server_state = TokenServer(clients=clients, lifetime_s=lifetime_s)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

        def _send(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/jwks":
                self._send(200, server_state.jwks())
            else:
                self._send(404, {"error": "not_found"})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            form = dict(urllib.parse.parse_qsl(self.rfile.read(length).decode()))
            auth = self.headers.get("Authorization", "")
            try:
                user, _, secret = base64.b64decode(auth.removeprefix("Basic ")).decode().partition(":")
            except ValueError:
                user, secret = "", ""
            server_state.token_requests.append({"client_id": user, **form})
            if self.path != "/token" or form.get("grant_type") != "client_credentials":
                self._send(400, {"error": "unsupported_grant_type"})
            elif server_state.clients.get(user) != secret:
                self._send(401, {"error": "invalid_client"})
            else:
                token = server_state.issue(user, form.get("scope"))
                self._send(200, {"access_token": token, "token_type": "Bearer", "expires_in": server_state.lifetime_s})

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server_state.port = httpd.server_address[1]
    thread = threading.Thread(target=httpd.serve_forever, name="token-server", daemon=True)
    thread.start()
    try:
        yield server_state
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()
