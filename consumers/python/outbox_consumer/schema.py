"""Event contracts on the consumer side: the payload checked against the JSON Schema the relay
checked it against before publishing.

The relay names the contract on each event in the ``Outbox-Schema`` header: a key
``<name>.<version>`` of a NATS KV bucket (``outbox-contracts`` unless configured otherwise)
whose value is the bundled schema, every file it refers to embedded under ``$defs`` (or
``definitions``) with a ``file:///`` ``$id``. The version is the first 12 hex digits of the
SHA-256 of those bytes, so a key never changes meaning: a compiled contract is cached for good,
and bytes that do not hash to their key's version are refused. ``format`` is not checked, as in
the relay (``crates/outbox-schema``).
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Tuple

from jsonschema import Draft7Validator, Draft202012Validator, validators
from jsonschema.exceptions import SchemaError, ValidationError
from nats.js.errors import BucketNotFoundError, KeyNotFoundError
from referencing import Registry
from referencing.exceptions import NoSuchResource, Unresolvable
from referencing.jsonschema import DRAFT7, DRAFT202012

from . import contract as c

#: ``<name>.<version>``: the name as the relay allows it, the version 12 lowercase hex digits.
KEY_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,64}\.[0-9a-f]{12}")
VERSION_DIGITS = 12

_DRAFT_2020_12 = "https://json-schema.org/draft/2020-12/schema"
_DRAFT_7 = "http://json-schema.org/draft-07/schema"
_NOT_A_KEY = "not a valid contracts bucket key (<name>.<12 lowercase hex digits>)"
# Longest text of one part of a violation (pointer, expected, found), as the relay cuts it.
_PART_CHARS = 120


def version_of(stored: bytes) -> str:
    """The version a stored contract's bytes are: the first 12 hex digits of their SHA-256."""
    return hashlib.sha256(stored).hexdigest()[:VERSION_DIGITS]


class ContractRefused(Exception):
    """An event that must not be applied: its payload breaks its contract, or the contract it
    names cannot be used (not in the bucket, bytes not of the key's version, not a schema).
    ``str()`` is the dead-letter reason, ``contract <key>: ...``."""

    def __init__(self, key: str, detail: str, violation: Optional["Violation"] = None):
        super().__init__(f"contract {key}: {detail}")
        self.key = key
        self.violation = violation


class ContractUnavailable(RuntimeError):
    """The contract cannot be fetched now (no bucket, NATS trouble): try again later; the event
    is not at fault."""


@dataclass(frozen=True)
class Violation:
    """Why a payload breaks its contract; ``keyword`` is ``None`` when it is not JSON at all."""

    pointer: str  # JSON Pointer to the refused value; "" is the whole payload
    keyword: Optional[str]
    message: str
    expected: str = ""  # the keyword's value in the schema, as JSON (cut)
    found: str = ""  # the refused value, as JSON (cut)

    def __str__(self) -> str:
        if self.keyword is None:
            return self.message
        at = self.pointer or "(root)"
        return (
            f"at {at}: keyword `{self.keyword}` expected {self.expected}, found {self.found}"
            f" ({self.message})"
        )


class EventContract:
    """One stored contract, compiled: ``EventContract.from_stored(key, value).check(payload)``."""

    def __init__(self, key: str, stored: bytes, schema: Any, validator: Any):
        self.key = key
        self.name, self.version = key.rsplit(".", 1)
        self.stored = stored
        self.schema = schema
        self._validator = validator

    @classmethod
    def from_stored(cls, key: str, stored: bytes) -> "EventContract":
        """Compiles the value stored under ``key``; raises ``ContractRefused`` for bytes that
        are not the key's version or not a usable schema. Nothing is read from the network or
        from files: every ``$ref`` must resolve within the stored document."""
        if not KEY_PATTERN.fullmatch(key):
            raise ContractRefused(key, _NOT_A_KEY)
        actual = version_of(stored)
        if actual != key.rsplit(".", 1)[1]:
            raise ContractRefused(
                key,
                f"the stored document hashes to version {actual}, not to the version its key"
                " names",
            )
        try:
            schema = json.loads(stored.decode("utf-8"))
        except ValueError as e:  # UnicodeDecodeError too
            raise ContractRefused(key, f"the stored document is not JSON: {e}") from e
        validator_class, spec = _draft_of(key, schema)
        try:
            validator_class.check_schema(schema)
        except SchemaError as e:
            raise ContractRefused(key, f"not a valid schema: {e.message}") from e
        root = spec.create_resource(schema)
        # The embedded files are found by their $ids; a retrieval would mean a $ref that
        # leaves the document, which is refused rather than fetched.
        registry = Registry(retrieve=_refuse_retrieval).with_resource(
            schema.get("$id", "") if isinstance(schema, dict) else "", root
        ).crawl()
        # format_checker=None: `format` is an annotation, as in the relay.
        validator = validator_class(schema, registry=registry, format_checker=None)
        return cls(key, stored, schema, validator)

    def check(self, payload: bytes) -> Optional[Violation]:
        """``None`` when ``payload`` (UTF-8 JSON bytes) meets the contract; else the first
        violation found, as the relay reports it. Raises ``ContractRefused`` for a ``$ref``
        the stored document does not resolve."""
        try:
            value = json.loads(payload.decode("utf-8"), parse_constant=_no_constant)
        except (ValueError, RecursionError) as e:
            return Violation("", None, f"payload is not JSON: {_cut(str(e), _PART_CHARS)}")
        try:
            error = next(iter(self._validator.iter_errors(value)), None)
        except RecursionError:
            return Violation("", None, "payload nests too deeply to be checked")
        except Unresolvable as e:  # the contract's fault, not the payload's
            raise ContractRefused(
                self.key, f"keyword `$ref`: {e} is not embedded in the stored document"
            ) from e
        if error is None:
            return None
        return Violation(
            pointer=_cut(_pointer(error.absolute_path), _PART_CHARS),
            keyword=str(error.validator),
            message=_cut(error.message, 2 * _PART_CHARS),
            expected=_json_text(error.validator_value),
            found=_json_text(error.instance),
        )

    def validate(self, payload: bytes) -> None:
        """Raises ``ContractRefused`` when ``payload`` breaks the contract."""
        violation = self.check(payload)
        if violation is not None:
            raise ContractRefused(self.key, str(violation), violation)


class ContractValidator:
    """Checks messages against the contracts their ``Outbox-Schema`` header names, fetched from
    the KV bucket once per key::

        validator = ContractValidator(js)
        key = await validator.validate(msg.headers, msg.data)  # None: no header

    ``validate`` raises ``ContractRefused`` for an event that must not be applied and
    ``ContractUnavailable`` (or a NATS error) when the contract cannot be fetched now."""

    def __init__(self, js: Any, bucket: str = c.CONTRACTS_BUCKET, require: bool = False):
        self.js = js
        self.bucket = bucket
        #: Refuse an event without the header instead of passing it unchecked.
        self.require = require
        self._kv: Any = None
        self._compiled: Dict[str, EventContract] = {}

    async def contract(self, key: str) -> EventContract:
        """The compiled contract stored under ``key`` (cached: a key never changes meaning;
        a refusal is not cached, so a contract put later is found)."""
        found = self._compiled.get(key)
        if found is not None:
            return found
        if not KEY_PATTERN.fullmatch(key):
            raise ContractRefused(key, _NOT_A_KEY)
        if self._kv is None:
            try:
                self._kv = await self.js.key_value(self.bucket)
            except BucketNotFoundError as e:
                raise ContractUnavailable(f"KV bucket {self.bucket} does not exist") from e
        try:
            entry = await self._kv.get(key)
        except KeyNotFoundError as e:
            raise ContractRefused(
                key, f"no such key in the contracts bucket {json.dumps(self.bucket)}"
            ) from e
        compiled = EventContract.from_stored(key, entry.value or b"")
        self._compiled[key] = compiled
        return compiled

    async def validate(
        self, headers: Optional[Mapping[str, str]], payload: bytes
    ) -> Optional[str]:
        """Checks ``payload`` against the contract its headers name; returns that key, or
        ``None`` for a message without the header (refused when ``require`` is set)."""
        value = (headers or {}).get(c.HEADER_SCHEMA)
        key = value.strip() if isinstance(value, str) else ""
        if not key:
            if self.require:
                raise ContractRefused(
                    "required",
                    f"the event has no {c.HEADER_SCHEMA} header and this consumer requires one",
                )
            return None
        (await self.contract(key)).validate(payload or b"")
        return key


@functools.lru_cache(maxsize=1024)
def _ecma_regex(pattern: str) -> "re.Pattern[str]":
    r"""``pattern`` read as ECMA-262 (JSON Schema's regex dialect, as ajv reads it) where
    Python's ``re`` differs: ``$`` is the end of the text only (Python's also matches before a
    final newline), and ``\d`` and ``\w`` are ASCII."""
    out, i, in_class = [], 0, False
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\" and i + 1 < len(pattern):
            pair = pattern[i : i + 2]
            if pair == "\\d":
                pair = "0-9" if in_class else "[0-9]"
            elif pair == "\\w":
                pair = "A-Za-z0-9_" if in_class else "[A-Za-z0-9_]"
            elif pair == "\\D" and not in_class:
                pair = "[^0-9]"
            elif pair == "\\W" and not in_class:
                pair = "[^A-Za-z0-9_]"
            out.append(pair)
            i += 2
            continue
        if in_class:
            in_class = ch != "]"
        elif ch == "[":
            in_class = True
        elif ch == "$":
            ch = "\\Z"
        out.append(ch)
        i += 1
    try:
        return re.compile("".join(out))
    except re.error:  # a construct the rewrite broke: the pattern as Python reads it
        return re.compile(pattern)


def _pattern_keyword(validator: Any, pattern: str, instance: Any, schema: Any) -> Any:
    # jsonschema's own `pattern`, with the pattern read as ECMA-262 (see _ecma_regex).
    if validator.is_type(instance, "string") and not _ecma_regex(pattern).search(instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


_Draft202012 = validators.extend(Draft202012Validator, {"pattern": _pattern_keyword})
_Draft7 = validators.extend(Draft7Validator, {"pattern": _pattern_keyword})


def _draft_of(key: str, schema: Any) -> Tuple[Any, Any]:
    """The validator class and referencing specification ``$schema`` names (2020-12 when
    absent), as the relay picks them."""
    declared = schema.get("$schema") if isinstance(schema, dict) else None
    if declared is None:
        return _Draft202012, DRAFT202012
    if isinstance(declared, str) and declared.rstrip("#") == _DRAFT_2020_12:
        return _Draft202012, DRAFT202012
    if isinstance(declared, str) and declared.rstrip("#") == _DRAFT_7:
        return _Draft7, DRAFT7
    raise ContractRefused(key, f"keyword `$schema` is {declared!r}: not draft 2020-12 or draft 7")


def _refuse_retrieval(uri: str) -> Any:
    raise NoSuchResource(ref=uri)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _pointer(path: Any) -> str:
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in path)


def _json_text(value: Any) -> str:
    return _cut(json.dumps(value, ensure_ascii=False, separators=(",", ":")), _PART_CHARS)


def _cut(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, marked with ``…`` when cut (as the relay cuts)."""
    return text if len(text) <= limit else text[:limit] + "…"
