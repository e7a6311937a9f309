"""JSON Schema records in the schema registry wire format: the header, then JSON text.

The payload is parsed with the standard library's ``json``; with ``validate`` (the default, as
confluent-kafka's ``JSONDeserializer``), it is checked against the writer's schema with
``jsonschema``, the validator class chosen by the schema's ``$schema`` (Draft 7 when it names
none).  Schemas the writer's one references (``$ref`` to another registered subject) are fetched
once and resolved by their reference name through a ``referencing`` registry; a ``$ref`` to
anything else (a URL) is not fetched, and fails validation with a clear error.
"""

from __future__ import annotations

import json
from typing import Any

from ._base import HEADER_SIZE, RegistryDeserializer, SchemaCompileError
from .client import RegisteredSchema, SchemaRegistryClient
from .errors import ContextLike, SerializationError

try:
    import jsonschema
    import jsonschema.validators
    import referencing
    import referencing.jsonschema
except ImportError:  # pragma: no cover - depends on the install
    raise ImportError("JSONSchemaDeserializer needs jsonschema: pip install 'asyncconsumer[jsonschema]'") from None

__all__ = ["JSONSchemaDeserializer"]


class _Compiled:
    __slots__ = ("validator",)

    def __init__(self, validator: Any) -> None:
        self.validator = validator


class JSONSchemaDeserializer(RegistryDeserializer[_Compiled, Any]):
    """Decodes JSON Schema records in the schema registry wire format into Python values (dicts,
    lists, str, int, float, bool, None: what ``json.loads`` returns).

    ``client``
        The :class:`SchemaRegistryClient` to fetch writer schemas from.
    ``validate``
        Check each value against its writer's schema (default True); a value that does not match
        raises :class:`SerializationError` with jsonschema's reason.  False skips the check (and
        the cost of it): the schema is then fetched only to know the id exists.
    """

    def __init__(self, client: SchemaRegistryClient, *, validate: bool = True) -> None:
        super().__init__(client)
        if not isinstance(validate, bool):
            raise TypeError(f"validate: expected a bool, got {validate!r}")
        self.validate = validate

    async def _compile(self, registered: RegisteredSchema, schema_id: int) -> _Compiled:
        if registered.schema_type != "JSON":
            raise SchemaCompileError(f"is a {registered.schema_type} schema, not JSON Schema")
        if not self.validate:
            return _Compiled(None)
        resources: list[tuple[str, referencing.Resource[Any]]] = []

        def add(name: str, referenced: RegisteredSchema) -> None:
            resources.append(
                (name, referencing.Resource.from_contents(
                    json.loads(referenced.schema), default_specification=referencing.jsonschema.DRAFT7
                ))
            )

        await self._references(registered, add)
        schema = json.loads(registered.schema)
        registry: referencing.Registry[Any] = referencing.Registry().with_resources(resources)
        cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft7Validator)
        cls.check_schema(schema)
        return _Compiled(cls(schema, registry=registry))

    def _decode(self, compiled: _Compiled, data: bytes, context: ContextLike | None, schema_id: int) -> Any:
        try:
            value = json.loads(data[HEADER_SIZE:])
        except ValueError as exc:
            raise SerializationError(
                f"the payload of schema id {schema_id} is not JSON: {exc}", context, schema_id
            ) from exc
        if compiled.validator is not None:
            error = jsonschema.exceptions.best_match(compiled.validator.iter_errors(value))
            if error is not None:
                path = "/".join(str(p) for p in error.absolute_path) or "(the root)"
                raise SerializationError(
                    f"the value does not match schema id {schema_id} at {path}: {error.message}", context, schema_id
                ) from error
        return value
