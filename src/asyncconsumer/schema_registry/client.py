"""An async client of a Confluent-compatible schema registry (Confluent Schema Registry, Apicurio's
``/apis/ccompat/v7``, Redpanda, Karapace ...), on httpx, for asyncio and trio alike.

It reads; it never registers.  The deserializers ask it for a writer schema by id
(``GET /schemas/ids/{id}``) and for the schemas that one references by subject and version
(``GET /subjects/{subject}/versions/{version}``).  The story of one lookup:

1. **Cache.**  An answer is kept by id (and by subject and version), in a bounded LRU cache
   (``cache_size`` entries each): a schema id never changes meaning, so a cached answer is final.
2. **One request per need.**  Lookups of the same id that arrive while its request is in flight
   wait for that request instead of sending their own (:class:`SingleFlight`): a thousand records
   of fifty unknown ids cause fifty requests.  If the task that sent it is cancelled, one of the
   waiters sends it again.
3. **Time bound.**  A lookup takes at most ``timeout`` seconds, however the registry behaves:
   connection failures and answers saying "later" (429, 502, 503, 504) are retried with a short
   backoff until then, and then raise :class:`SchemaRegistryUnavailableError`; other error statuses
   raise at once (:class:`SchemaNotFoundError` for 404, else :class:`SchemaRegistryError`), naming
   the URL, the status and the registry's own error code and message.

Credentials (``basic_auth``, a ``user:password@`` in the URL, bearer tokens) go only into request
headers: never into errors, ``repr()`` or logs.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import ssl
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from types import TracebackType
from typing import Any, Generic, Self, TypeVar
from urllib.parse import quote, unquote, urlsplit, urlunsplit

import anyio

from .errors import SchemaNotFoundError, SchemaRegistryError, SchemaRegistryUnavailableError, scrub

try:
    import httpx
except ImportError:  # pragma: no cover - depends on the install
    raise ImportError(
        "asyncconsumer.schema_registry needs httpx: pip install 'asyncconsumer[avro]' (or [protobuf], [jsonschema])"
    ) from None

__all__ = ["DEFAULT_TIMEOUT", "RegisteredSchema", "SchemaReference", "SchemaRegistryClient", "SingleFlight"]

#: Seconds one lookup may take, retries included, when ``timeout`` is not given.
DEFAULT_TIMEOUT = 10.0
#: Entries kept in each cache (by id, by subject and version) when ``cache_size`` is not given.
DEFAULT_CACHE_SIZE = 1000
#: Statuses that mean "try again later": retried until the timeout.
RETRY_STATUSES = frozenset({429, 502, 503, 504})

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

#: ``bearer_token_provider``: returns the token (or an awaitable of it); called before each request,
#: so it can refresh the token (and should cache it).
TokenProvider = Callable[[], "str | Awaitable[str]"]


@dataclasses.dataclass(frozen=True, slots=True)
class SchemaReference:
    """A named reference of a schema to another registered schema (an Avro named type, a Protobuf
    import, a JSON Schema ``$ref``): its ``name`` in the referring schema, and where it is."""

    name: str
    subject: str
    version: int


@dataclasses.dataclass(frozen=True, slots=True)
class RegisteredSchema:
    """A schema as the registry returned it."""

    #: The schema's text: Avro or JSON Schema JSON, Protobuf ``.proto`` text or a base64
    #: ``FileDescriptorProto`` (what the registry stored or, with ``format="serialized"``, gave).
    schema: str
    #: ``"AVRO"`` (the registry's default, also when it names none), ``"PROTOBUF"`` or ``"JSON"``.
    schema_type: str = "AVRO"
    references: tuple[SchemaReference, ...] = ()
    schema_id: int | None = None
    subject: str | None = None
    version: int | None = None


class _LRU(Generic[K, V]):
    def __init__(self, size: int) -> None:
        self._size = size
        self._items: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        value = self._items.get(key)
        if value is not None:
            self._items.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self._size:
            self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)


class _Flight(Generic[V]):
    __slots__ = ("abandoned", "error", "event", "value")

    def __init__(self) -> None:
        self.event = anyio.Event()
        self.value: V | None = None
        self.error: Exception | None = None
        self.abandoned = False


class SingleFlight(Generic[K, V]):
    """Runs one call per key at a time: callers of :meth:`run` with a key whose call is in flight
    wait for its result (or its exception) instead of calling again.  If the task running the call
    is cancelled, a waiter takes over."""

    def __init__(self) -> None:
        self._flights: dict[K, _Flight[V]] = {}

    def in_flight(self, key: K) -> bool:
        return key in self._flights

    async def run(self, key: K, call: Callable[[], Awaitable[V]]) -> V:
        while True:
            flight = self._flights.get(key)
            if flight is None:
                return await self._lead(key, call)
            await flight.event.wait()
            if flight.abandoned:
                continue
            if flight.error is not None:
                raise flight.error
            return flight.value  # type: ignore[return-value]

    async def _lead(self, key: K, call: Callable[[], Awaitable[V]]) -> V:
        flight: _Flight[V] = _Flight()
        self._flights[key] = flight
        try:
            flight.value = await call()
        except Exception as exc:
            flight.error = exc
            raise
        except BaseException:  # cancelled: a waiter sends it again
            flight.abandoned = True
            raise
        finally:
            del self._flights[key]
            flight.event.set()
        return flight.value


def _split_credentials(url: str) -> tuple[str, tuple[str, str] | None]:
    """``url`` without ``user:password@``, and those credentials (None if it had none)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"url: expected http(s)://host[:port][/path], got {scrub(url)!r}")
    if parts.username is None:
        return url.rstrip("/"), None
    host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
    netloc = host if parts.port is None else f"{host}:{parts.port}"
    clean = urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment)).rstrip("/")
    return clean, (unquote(parts.username), unquote(parts.password or ""))


class SchemaRegistryClient:
    """Reads schemas from a Confluent-compatible schema registry; shared by any number of
    deserializers (and consumers).

    ``url``
        The registry's base URL, under which ``/schemas/ids/{id}`` answers: for example
        ``http://registry:8081`` (Confluent) or ``http://registry:8080/apis/ccompat/v7`` (Apicurio).
        A ``user:password@`` in it is taken as ``basic_auth`` and removed from the URL.
    ``basic_auth``
        ``(user, password)`` for HTTP basic authentication (Confluent Cloud: the API key and secret).
    ``bearer_token_provider``
        A function returning a bearer token (or a coroutine function): called before every request,
        so it may refresh the token; it should cache it.  Not together with ``basic_auth``.
    ``ssl_context``
        The TLS settings for an ``https`` URL (a private CA, a client certificate); by default the
        system's trusted CAs.
    ``timeout``
        Seconds one lookup may take, retries included (default 10): then
        :class:`SchemaRegistryUnavailableError`.
    ``cache_size``
        Answers kept by id, and by subject and version (default 1000 each, least recently used
        dropped first).

    Use it as ``async with SchemaRegistryClient(url) as registry:``, or call :meth:`aclose` when
    done; the connections are opened on first use, in the event loop of that use.
    """

    def __init__(
        self,
        url: str,
        *,
        basic_auth: tuple[str, str] | None = None,
        bearer_token_provider: TokenProvider | None = None,
        ssl_context: ssl.SSLContext | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        cache_size: int = DEFAULT_CACHE_SIZE,
    ) -> None:
        if not isinstance(url, str):
            raise TypeError(f"url: expected a str, got {type(url).__name__}")
        self.url, url_auth = _split_credentials(url)
        if basic_auth is None:
            basic_auth = url_auth
        if basic_auth is not None:
            if not (
                isinstance(basic_auth, tuple) and len(basic_auth) == 2 and all(isinstance(s, str) for s in basic_auth)
            ):
                raise TypeError("basic_auth: expected a (user, password) tuple of two str")
            if bearer_token_provider is not None:
                raise ValueError("give basic_auth or bearer_token_provider, not both")
        if bearer_token_provider is not None and not callable(bearer_token_provider):
            raise TypeError("bearer_token_provider: expected a function returning the token")
        if not (isinstance(timeout, int | float) and timeout > 0):
            raise ValueError(f"timeout: expected seconds > 0, got {timeout!r}")
        if not (isinstance(cache_size, int) and cache_size > 0):
            raise ValueError(f"cache_size: expected an int > 0, got {cache_size!r}")
        self.timeout = float(timeout)
        self.cache_size = cache_size
        self._auth_kind = (
            "basic" if basic_auth is not None else "bearer" if bearer_token_provider is not None else "none"
        )
        self._token_provider = bearer_token_provider
        self._http = httpx.AsyncClient(
            auth=httpx.BasicAuth(*basic_auth) if basic_auth is not None else None,
            verify=ssl_context if ssl_context is not None else True,
            timeout=httpx.Timeout(self.timeout),
            headers={"Accept": "application/vnd.schemaregistry.v1+json, application/json"},
            follow_redirects=True,
        )
        self._by_id: _LRU[tuple[int, str | None], RegisteredSchema] = _LRU(cache_size)
        self._by_version: _LRU[tuple[str, int, str | None], RegisteredSchema] = _LRU(cache_size)
        self._flights: SingleFlight[tuple[Any, ...], RegisteredSchema] = SingleFlight()

    def __repr__(self) -> str:
        return f"<SchemaRegistryClient {self.url} auth={self._auth_kind} timeout={self.timeout:g}s>"

    # -- lookups ----------------------------------------------------------------------------------

    def cached_schema(self, schema_id: int, *, format: str | None = None) -> RegisteredSchema | None:
        """The schema of ``schema_id`` if an earlier lookup cached it, else None (no request)."""
        return self._by_id.get((schema_id, format))

    async def get_schema(self, schema_id: int, *, format: str | None = None) -> RegisteredSchema:
        """The schema registered under ``schema_id`` (``GET /schemas/ids/{id}``), from the cache when
        it is there.  ``format="serialized"`` asks for Protobuf schemas as a base64
        ``FileDescriptorProto`` (Confluent's registry; others may ignore it).

        Raises :class:`SchemaNotFoundError` (no such id), :class:`SchemaRegistryUnavailableError`
        (no answer within ``timeout``) or :class:`SchemaRegistryError`."""
        key = (schema_id, format)
        cached = self._by_id.get(key)
        if cached is not None:
            return cached

        async def fetch() -> RegisteredSchema:
            body = await self._get(f"/schemas/ids/{int(schema_id)}", format)
            schema = _registered(body, self.url, schema_id=schema_id)
            self._by_id.put(key, schema)
            return schema

        return await self._flights.run(("id", *key), fetch)

    async def get_version(self, subject: str, version: int, *, format: str | None = None) -> RegisteredSchema:
        """The schema of ``subject`` at ``version`` (``GET /subjects/{subject}/versions/{version}``),
        from the cache when it is there (a registered version never changes)."""
        if not isinstance(version, int) or isinstance(version, bool):
            raise TypeError(f"version: expected an int, got {version!r} (get_latest_version reads the latest)")
        key = (subject, version, format)
        cached = self._by_version.get(key)
        if cached is not None:
            return cached

        async def fetch() -> RegisteredSchema:
            body = await self._get(f"/subjects/{quote(subject, safe='')}/versions/{version}", format)
            schema = _registered(body, self.url)
            self._by_version.put(key, schema)
            if schema.schema_id is not None:
                self._by_id.put((schema.schema_id, format), schema)
            return schema

        return await self._flights.run(("version", *key), fetch)

    async def get_latest_version(self, subject: str, *, format: str | None = None) -> RegisteredSchema:
        """The newest schema of ``subject`` (never cached: it changes when a version is added)."""
        body = await self._get(f"/subjects/{quote(subject, safe='')}/versions/latest", format)
        return _registered(body, self.url)

    # -- HTTP ---------------------------------------------------------------------------------------

    async def _headers(self) -> dict[str, str]:
        if self._token_provider is None:
            return {}
        token = self._token_provider()
        if inspect.isawaitable(token):
            token = await token
        if not isinstance(token, str):
            raise TypeError(f"bearer_token_provider returned {type(token).__name__}, expected a str")
        return {"Authorization": f"Bearer {token}"}

    async def _get(self, path: str, format: str | None) -> Any:
        url = self.url + path
        params = {"format": format} if format else None
        shown = url + (f"?format={format}" if format else "")
        last = "no answer"
        status: int | None = None
        delay = 0.05
        with anyio.move_on_after(self.timeout):
            while True:
                try:
                    response = await self._http.get(url, params=params, headers=await self._headers())
                except httpx.TransportError as exc:
                    status, last = None, f"no answer ({type(exc).__name__}: {exc or 'no details'})"
                else:
                    if response.status_code == 200:
                        try:
                            return response.json()
                        except ValueError:
                            raise SchemaRegistryError(
                                f"schema registry {shown} answered 200 with a body that is not JSON: "
                                f"{response.text[:200]!r}", url=shown, status=200,
                            ) from None
                    status = response.status_code
                    error_code, message = _error_body(response)
                    if status not in RETRY_STATUSES:
                        kind = SchemaNotFoundError if status == 404 else SchemaRegistryError
                        raise kind(
                            f"schema registry {shown} answered {status}{_describe(error_code, message)}",
                            url=shown, status=status, error_code=error_code,
                        )
                    last = f"answered {status}{_describe(error_code, message)}"
                await anyio.sleep(delay)
                delay = min(delay * 2, 1.0)
        raise SchemaRegistryUnavailableError(
            f"schema registry {shown}: {last}; gave up after the timeout of {self.timeout:g} s",
            url=shown, status=status,
        )

    async def aclose(self) -> None:
        """Close the connections (the caches stay usable, lookups open new ones)."""
        await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


def _error_body(response: httpx.Response) -> tuple[int | None, str]:
    """The registry's ``{"error_code": 40403, "message": "..."}``, or the start of the text."""
    try:
        body = response.json()
    except ValueError:
        return None, response.text[:200].strip()
    if isinstance(body, dict):
        code = body.get("error_code")
        return (code if isinstance(code, int) else None), str(body.get("message", ""))[:300]
    return None, str(body)[:200]


def _describe(error_code: int | None, message: str) -> str:
    if error_code is None and not message:
        return ""
    return f" (error {error_code}: {message})" if error_code is not None else f" ({message})"


def _registered(body: Any, url: str, *, schema_id: int | None = None) -> RegisteredSchema:
    if not isinstance(body, dict) or not isinstance(body.get("schema"), str):
        raise SchemaRegistryError(
            f"schema registry {url} answered without a schema: {json.dumps(body)[:200]}", url=url, status=200
        )
    references = tuple(
        SchemaReference(str(ref["name"]), str(ref["subject"]), int(ref["version"]))
        for ref in body.get("references") or ()
    )
    return RegisteredSchema(
        schema=body["schema"],
        schema_type=str(body.get("schemaType") or "AVRO").upper(),
        references=references,
        schema_id=int(body["id"]) if isinstance(body.get("id"), int) else schema_id,
        subject=body.get("subject") if isinstance(body.get("subject"), str) else None,
        version=body.get("version") if isinstance(body.get("version"), int) else None,
    )
