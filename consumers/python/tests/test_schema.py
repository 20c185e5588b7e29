"""Event contracts without servers: the relay's stored fixture judged as the relay judges it."""

import asyncio
import json
from pathlib import Path

import pytest

from outbox_consumer import ContractRefused, ContractValidator, EventContract, contract as c
from outbox_consumer.schema import version_of

REPO = Path(__file__).resolve().parents[3]
REQUIRED_REASON = (
    "contract required: the event has no Outbox-Schema header and this consumer requires one"
)
# What the relay stores for crates/outbox-schema/tests/fixtures/contracts/order-placed.json and
# its verdict on each payload (written by crates/outbox-schema/tests/stored_fixture.rs).
FIXTURE = json.loads((REPO / "crates/outbox-schema/tests/fixtures/stored.json").read_text())


def stored_contract(schema: dict) -> EventContract:
    """A contract stored as the relay stores one: compact JSON under ``<name>.<digest>``."""
    stored = json.dumps(schema, separators=(",", ":")).encode()
    return EventContract.from_stored(f"test.{version_of(stored)}", stored)


def test_the_fixture_key_names_the_digest_of_the_stored_bytes():
    name, version = FIXTURE["key"].rsplit(".", 1)
    assert version == version_of(FIXTURE["stored"].encode())
    contract = EventContract.from_stored(FIXTURE["key"], FIXTURE["stored"].encode())
    assert (contract.name, contract.version) == (name, version)


def test_each_fixture_case_gets_the_relays_verdict_pointer_and_keyword():
    contract = EventContract.from_stored(FIXTURE["key"], FIXTURE["stored"].encode())
    assert len(FIXTURE["cases"]) >= 6 and any(not case["valid"] for case in FIXTURE["cases"])
    for case in FIXTURE["cases"]:
        payload = case["payload"].encode()
        violation = contract.check(payload)
        if case["valid"]:
            assert violation is None, (case, violation)
            contract.validate(payload)
            continue
        assert violation is not None, case
        assert (violation.pointer, violation.keyword) == (case["pointer"], case["keyword"]), case
        with pytest.raises(ContractRefused) as refused:
            contract.validate(payload)
        at = case["pointer"] or "(root)"
        assert str(refused.value).startswith(
            f"contract {FIXTURE['key']}: at {at}: keyword `{case['keyword']}` expected "
        ), str(refused.value)
        assert refused.value.violation == violation


def test_the_reason_names_what_was_expected_and_found():
    contract = EventContract.from_stored(FIXTURE["key"], FIXTURE["stored"].encode())
    bad = next(case for case in FIXTURE["cases"] if case.get("keyword") == "type")
    assert str(contract.check(bad["payload"].encode())) == (
        "at /total/cents: keyword `type` expected \"integer\", found \"1250\""
        " ('1250' is not of type 'integer')"
    )


def test_bytes_changed_by_one_byte_are_refused():
    stored = FIXTURE["stored"].encode()
    for at in (stored.index(b"OrderPlaced") + 5, len(stored) - 2):
        changed = stored[:at] + bytes([stored[at] ^ 0x01]) + stored[at + 1 :]
        with pytest.raises(ContractRefused) as refused:
            EventContract.from_stored(FIXTURE["key"], changed)
        assert str(refused.value) == (
            f"contract {FIXTURE['key']}: the stored document hashes to version "
            f"{version_of(changed)}, not to the version its key names"
        )


def test_a_payload_that_is_not_json_is_refused():
    contract = EventContract.from_stored(FIXTURE["key"], FIXTURE["stored"].encode())
    for payload in (b'{"order_id":', b"\xff\xfe", b'{"order_id": NaN}', b""):
        violation = contract.check(payload)
        assert violation is not None and violation.keyword is None, payload
        assert violation.message.startswith("payload is not JSON: "), violation


def test_a_ref_outside_the_stored_document_is_refused_not_fetched():
    contract = stored_contract(
        {"$id": "file:///a.json", "properties": {"x": {"$ref": "https://example.com/x.json"}}}
    )
    with pytest.raises(ContractRefused) as refused:
        contract.check(b'{"x": 1}')
    assert "keyword `$ref`" in str(refused.value) and "example.com" in str(refused.value)
    assert contract.check(b"{}") is None, "a payload that never reaches the $ref passes"


def test_draft_7_bundles_resolve_their_definitions_and_format_is_not_checked():
    contract = stored_contract(
        {
            "$schema": "http://json-schema.org/draft-07/schema#",
            "$id": "file:///user.json",
            "definitions": {
                "file:///shared/email.json": {
                    "$id": "file:///shared/email.json",
                    "type": "string",
                    "format": "email",
                    "maxLength": 8,
                }
            },
            "properties": {"email": {"$ref": "shared/email.json"}},
            "required": ["email"],
        }
    )
    assert contract.check(b'{"email": "not-one"}') is None, "format is an annotation"
    too_long = contract.check(b'{"email": "123456789"}')
    assert (too_long.pointer, too_long.keyword) == ("/email", "maxLength")
    # Draft 7 has no prefixItems: a 2020-12 keyword is ignored there, not applied.
    ignored = stored_contract(
        {"$schema": "http://json-schema.org/draft-07/schema#", "prefixItems": [{"type": "string"}]}
    )
    assert ignored.check(b"[1]") is None


def test_pointers_escape_slash_and_tilde():
    contract = stored_contract({"properties": {"a/b": {"properties": {"~c": {"type": "null"}}}}})
    violation = contract.check(b'{"a/b": {"~c": 1}}')
    assert (violation.pointer, violation.keyword) == ("/a~1b/~0c", "type")


def test_unusable_contracts_are_refused():
    with pytest.raises(ContractRefused, match="keyword `\\$schema`"):
        stored_contract({"$schema": "http://json-schema.org/draft-04/schema#"})
    with pytest.raises(ContractRefused, match="not a valid schema"):
        stored_contract({"type": 12})
    with pytest.raises(ContractRefused, match="not a valid contracts bucket key"):
        EventContract.from_stored("order placed.565aaced9d08", FIXTURE["stored"].encode())
    with pytest.raises(ContractRefused, match="not a valid contracts bucket key"):
        EventContract.from_stored("order-placed.565AACED9D08", FIXTURE["stored"].encode())


def test_messages_without_the_header_pass_unless_it_is_required():
    async def body():
        # No KV access happens for these: a js that fails on use proves it.
        validator = ContractValidator(js=None)
        assert await validator.validate({"Nats-Msg-Id": "e1"}, b"not json") is None
        assert await validator.validate({c.HEADER_SCHEMA: "  "}, b"not json") is None
        strict = ContractValidator(js=None, require=True)
        with pytest.raises(ContractRefused) as refused:
            await strict.validate({"Nats-Msg-Id": "e1"}, b"{}")
        assert str(refused.value) == REQUIRED_REASON
        with pytest.raises(ContractRefused, match="not a valid contracts bucket key"):
            await strict.validate({c.HEADER_SCHEMA: "../etc"}, b"{}")

    asyncio.run(body())


def test_the_header_and_bucket_names_come_from_the_wire_contract():
    assert (c.HEADER_SCHEMA, c.CONTRACTS_BUCKET) == ("Outbox-Schema", "outbox-contracts")
    assert ContractValidator(js=None).bucket == c.CONTRACTS_BUCKET


def test_patterns_read_as_ecma_262_not_as_python_re():
    contract = EventContract.from_stored(FIXTURE["key"], FIXTURE["stored"].encode())
    base = {"customer": "c-7", "total": {"cents": 1, "currency": "EUR"}}
    # Python's `$` also matches before a final newline; JSON Schema's (ECMA-262) does not.
    for order_id in ("o-1\n", "o-\u0663"):
        violation = contract.check(json.dumps({**base, "order_id": order_id}).encode())
        assert (violation.pointer, violation.keyword) == ("/order_id", "pattern"), order_id
    assert contract.check(json.dumps({**base, "order_id": "o-12"}).encode()) is None
    word = stored_contract({"pattern": "^[\\w$]+$"})
    assert word.check(b'"a_1$"') is None
    assert word.check(b'"\\u00e9"').keyword == "pattern", "\\w is ASCII"
