"""OAUTHBEARER tokens the way the Java client gets them from its properties.

- :class:`ClientCredentialsTokenProvider`: the OAuth 2 client-credentials grant against a token
  endpoint (Kafka's ``OAuthBearerLoginCallbackHandler``, KIP-768).  ``from_properties`` makes one
  from ``sasl.oauthbearer.token.endpoint.url`` and the client id, secret and scope (JAAS options
  ``clientId``/``clientSecret``/``scope``, or ``sasl.oauthbearer.client.credentials.*`` and
  ``sasl.oauthbearer.scope``).  A ``file:`` URL names a file holding the token instead.
- :func:`unsecured_token`: the unsigned JWT that Kafka's default OAUTHBEARER login module makes
  from ``unsecuredLoginStringClaim_sub`` (for brokers that use the unsecured validator).

Either one is a ``sasl_oauth_token_provider``.  The HTTP request runs in a worker thread.
"""

from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from pathlib import Path

import anyio
import anyio.to_thread

from .errors import ConfigError, KafkaError
from .java_properties import HIDDEN, is_secret
from .structs import OAuthBearerToken

__all__ = ["ClientCredentialsTokenProvider", "TokenEndpointError", "unsecured_token"]


class TokenEndpointError(KafkaError):
    """The token endpoint refused the client or gave no usable token."""


class ClientCredentialsTokenProvider:
    """Gets tokens with the client-credentials grant (RFC 6749 4.4) from ``token_endpoint_url``.

    The client id and secret go in a Basic ``Authorization`` header (URL-encoded first with
    ``url_encode_header``, as ``sasl.oauthbearer.header.urlencode``), ``scope`` in the form body.
    A failed request is retried with a doubling wait from ``retry_backoff_ms`` up to
    ``retry_backoff_max_ms`` (as the Java client's ``sasl.login.retry.backoff.*``); an answer the
    endpoint gives with a 4xx status is final.  The token's expiry is its JWT ``exp``, else the
    answer's ``expires_in``.  ``extensions`` are SASL extensions sent with each token.
    """

    def __init__(
        self,
        token_endpoint_url: str,
        client_id: str | None = None,
        client_secret: str | None = None,
        scope: str | None = None,
        *,
        url_encode_header: bool = False,
        connect_timeout_ms: int = 10_000,
        read_timeout_ms: int = 10_000,
        retry_backoff_ms: int = 100,
        retry_backoff_max_ms: int = 10_000,
        extensions: Mapping[str, str] | None = None,
    ) -> None:
        parsed = urllib.parse.urlparse(token_endpoint_url)
        if parsed.scheme not in ("http", "https", "file"):
            raise ConfigError(
                "sasl.oauthbearer.token.endpoint.url must be an http(s): or file: URL, got "
                f"{_masked_url(token_endpoint_url)!r}"
            )
        if parsed.scheme != "file" and (not client_id or client_secret is None):
            raise ConfigError("the client-credentials grant needs a client id and a client secret")
        self.url = token_endpoint_url
        self._shown_url = _masked_url(token_endpoint_url)
        self._client_id = client_id or ""
        self._client_secret = client_secret or ""
        self.scope = scope or None
        self._url_encode = url_encode_header
        self._timeout = max(connect_timeout_ms, read_timeout_ms) / 1000
        self._backoff = retry_backoff_ms / 1000
        self._backoff_max = retry_backoff_max_ms / 1000
        self.extensions = dict(extensions or {})

    def __repr__(self) -> str:  # no secret in it
        return (
            f"ClientCredentialsTokenProvider({self._shown_url!r}, client_id={self._client_id!r}, scope={self.scope!r})"
        )

    async def token(self) -> OAuthBearerToken:
        """A fresh token (called by the client when a connection authenticates and the last
        token is near its expiry)."""
        wait = self._backoff
        while True:
            try:
                value, expires_in = await anyio.to_thread.run_sync(self._fetch)
                break
            except TokenEndpointError:
                raise
            except (OSError, ValueError) as exc:
                if wait > self._backoff_max:
                    raise TokenEndpointError(
                        f"the token endpoint {self._shown_url} failed: {self._masked(exc)}"
                    ) from exc
            await anyio.sleep(wait)
            wait *= 2
        expires_at = time.time() + expires_in if expires_in is not None else None
        return OAuthBearerToken(value, expires_at=expires_at, extensions=self.extensions)

    def _masked(self, text: object) -> str:
        """``text`` (an answer of the endpoint, an error) with the client secret taken out, should the
        endpoint echo it."""
        text = str(text)
        secret = self._client_secret
        for form in {secret, urllib.parse.quote(secret, safe=""), urllib.parse.quote_plus(secret)} if secret else ():
            text = text.replace(form, HIDDEN)
        return text

    def _fetch(self) -> tuple[str, float | None]:
        if self.url.startswith("file:"):
            path = Path(urllib.parse.unquote(urllib.parse.urlparse(self.url).path))
            return path.read_text().strip(), None
        user, secret = self._client_id, self._client_secret
        if self._url_encode:
            user, secret = urllib.parse.quote(user, safe=""), urllib.parse.quote(secret, safe="")
        body = {"grant_type": "client_credentials", **({"scope": self.scope} if self.scope else {})}
        request = urllib.request.Request(
            self.url,
            data=urllib.parse.urlencode(body).encode(),
            method="POST",
            headers={
                "Authorization": "Basic " + base64.b64encode(f"{user}:{secret}".encode()).decode(),
                "Content-Type": "application/x-www-form-urlencoded",
                "Accept": "application/json",
                "Cache-Control": "no-cache",
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=self._timeout) as response:
                answer = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            detail = exc.read()[:300].decode("utf-8", errors="replace")
            if 400 <= exc.code < 500:
                raise TokenEndpointError(
                    f"the token endpoint {self._shown_url} refused the client ({exc.code}): {self._masked(detail)}"
                ) from None
            raise OSError(f"HTTP {exc.code}: {self._masked(detail)}") from None
        token = answer.get("access_token") if isinstance(answer, dict) else None
        if not isinstance(token, str) or not token:
            raise TokenEndpointError(f"the token endpoint {self._shown_url} answered without an access_token")
        expires_in = answer.get("expires_in")
        return token, float(expires_in) if isinstance(expires_in, (int, float)) else None


def _masked_url(url: str) -> str:
    """``url`` as messages show it: a password in it (``https://user:password@host``) and the values
    of query parameters named like secrets (``client_secret=``) hidden."""
    parts = urllib.parse.urlsplit(url)
    netloc = parts.netloc
    if parts.password is not None:
        netloc = f"{parts.username or ''}:{HIDDEN}@{netloc.rpartition('@')[2]}"
    query = "&".join(
        f"{key}={HIDDEN}" if is_secret(key) else f"{key}={value}" if sep else key
        for key, sep, value in (pair.partition("=") for pair in parts.query.split("&") if pair)
    )
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def unsecured_token(
    subject: str,
    *,
    lifetime_seconds: int = 3600,
    scope: str | None = None,
    extensions: Mapping[str, str] | None = None,
) -> OAuthBearerToken:
    """An unsigned JWT (``"alg": "none"``) with ``sub``, ``iat`` and ``exp``: what Kafka's
    ``OAuthBearerLoginModule`` makes from ``unsecuredLoginStringClaim_sub`` (development only)."""

    def part(value: object) -> str:
        return base64.urlsafe_b64encode(json.dumps(value, separators=(",", ":")).encode()).decode().rstrip("=")

    now = int(time.time())
    claims: dict[str, object] = {"sub": subject, "iat": now, "exp": now + lifetime_seconds}
    if scope:
        claims["scope"] = scope
    value = f"{part({'alg': 'none'})}.{part(claims)}."
    return OAuthBearerToken(value, expires_at=float(now + lifetime_seconds), extensions=dict(extensions or {}))
