"""The one set of checks for what the controller takes in: ``controller/openapi.json``'s
component schemas (types, lengths, maxima), applied to REST request bodies
(``controller.rest``) and to every entry of a loaded state (``controller.state``), so an
entry the API would refuse is never restored, and one the API accepted is never refused
at the next start. Pure: no Ryu, no I/O but reading the document once.
"""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator, FormatChecker
from jsonschema.exceptions import best_match
from referencing import Registry
from referencing.jsonschema import DRAFT202012

from controller.errors import CoreError
from controller.topoview import is_ipv4

OPENAPI_PATH = Path(__file__).with_name("openapi.json")
OPENAPI_URI = "urn:modelcast:openapi"
IPV4_REF = "#/components/schemas/IPv4"


class SchemaError(CoreError):
    """An instance does not match its schema: a 400 over REST (``detail``: the message,
    the JSON path and the schema path of the most relevant violation)."""

    def __init__(self, message: str, detail: dict[str, str]) -> None:
        super().__init__(message)
        self.detail = detail


@functools.lru_cache(maxsize=1)
def openapi_bytes() -> bytes:
    return OPENAPI_PATH.read_bytes()


@functools.lru_cache(maxsize=1)
def openapi() -> dict[str, Any]:
    """The parsed document, loaded once."""
    return json.loads(openapi_bytes())


def _validator(doc: dict[str, Any], schema: str) -> Draft202012Validator:
    registry = Registry().with_resource(OPENAPI_URI, DRAFT202012.create_resource(doc))
    return Draft202012Validator({"$ref": f"{OPENAPI_URI}#/components/schemas/{schema}"},
                                registry=registry, format_checker=FormatChecker())


@functools.lru_cache(maxsize=None)
def validator(schema: str) -> Draft202012Validator:
    """A validator for ``#/components/schemas/<schema>``; its ``$ref``s resolve inside
    the same document."""
    doc = openapi()
    if schema not in doc["components"]["schemas"]:
        raise KeyError(f"no schema {schema!r} in {OPENAPI_PATH.name}")
    return _validator(doc, schema)


@functools.lru_cache(maxsize=None)
def fast_validator(schema: str) -> tuple[Draft202012Validator, tuple[str, ...]]:
    """``validator(schema)`` except that the items of the schema's arrays of IPv4
    addresses (``receivers``: up to ~18,000 in a 256 KiB body) are left to
    ``_check_ipv4_items``: jsonschema spends ~5-13 us per item (a ``$ref`` and a format
    check each). Returns the validator and the names of the properties checked by hand."""
    doc = copy.deepcopy(openapi())
    target = doc["components"]["schemas"][schema]
    hoisted = []
    for name, prop in target.get("properties", {}).items():
        if prop.get("type") == "array" and prop.get("items") == {"$ref": IPV4_REF}:
            del prop["items"]
            hoisted.append(name)
    # every $ref replaced by its schema: resolving them per check cost ~0.2 ms an entry
    # (a loaded state checks thousands)
    return Draft202012Validator(_inlined(target, doc["components"]["schemas"]),
                                format_checker=FormatChecker()), tuple(hoisted)


def _inlined(node: Any, schemas: dict[str, Any]) -> Any:
    """``node`` with each ``{"$ref": "#/components/schemas/X"}`` replaced by X (inlined in
    turn; the document's schemas refer to each other without cycles)."""
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/components/schemas/"):
            merged = {k: v for k, v in node.items() if k != "$ref"}
            return {**_inlined(schemas[ref.rsplit("/", 1)[1]], schemas), **merged}
        return {k: _inlined(v, schemas) for k, v in node.items()}
    if isinstance(node, list):
        return [_inlined(v, schemas) for v in node]
    return node


def _check_ipv4_items(instance: Any, names: tuple[str, ...]) -> tuple[str, str] | None:
    """(path, message) of the first array item that is not an IPv4 address string, in
    jsonschema's words; one pass, one regex match per item."""
    if not isinstance(instance, dict):
        return None
    for name in names:
        items = instance.get(name)
        if not isinstance(items, list):
            continue
        for i, item in enumerate(items):
            if not isinstance(item, str):
                return f"/{name}/{i}", f"{item!r} is not of type 'string'"
            if not is_ipv4(item):
                return f"/{name}/{i}", f"{item!r} is not a 'ipv4'"
    return None


def check(schema: str, instance: Any) -> None:
    """Raise SchemaError naming the first (most relevant) violation and where it is.
    Linear in the instance: no ``uniqueItems`` in the schemas (callers check duplicates
    with a set) and arrays of addresses checked in one pass."""
    checker, hoisted = fast_validator(schema)
    err = None if checker.is_valid(instance) else best_match(checker.iter_errors(instance))
    if err is not None:
        where = "/" + "/".join(str(p) for p in err.absolute_path)
        message, schema_path = err.message, "/".join(str(p) for p in err.absolute_schema_path)
    else:
        bad = _check_ipv4_items(instance, hoisted)
        if bad is None:
            return
        (where, message), schema_path = bad, f"properties/{bad[0].split('/')[1]}/items"
    raise SchemaError(f"does not match the {schema} schema at {where}: {_short(message)}",
                      {"message": message, "path": where, "schema_path": schema_path})


def _short(message: str, limit: int = 200) -> str:
    """jsonschema quotes the offending value whole: a 5,000-character name stays a line."""
    return message if len(message) <= limit else message[:limit] + "..."


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def loads(raw: bytes | str) -> Any:
    """JSON as RFC 8259 has it: ``NaN`` and ``Infinity`` (which Python's parser takes) are
    refused, as is an integer longer than Python converts (4,300 digits); every refusal
    is a ValueError (``json.JSONDecodeError`` for syntax)."""
    return json.loads(raw, parse_constant=_refuse_constant)
