"""Contract validation in the consumer, against real nats-server (KV bucket, streams) and
PostgreSQL processes: events carrying the relay's headers and an ``Outbox-Schema`` key."""

import uuid

import pytest
from conftest import DLQ_STREAM, Client, Running, recording_handler
from harness import STREAM
from test_consumer import FAST, run, wait_async
from test_schema import FIXTURE, REQUIRED_REASON

from outbox_consumer import Consumer, ConsumerError, contract as c

VALID = next(case for case in FIXTURE["cases"] if case["valid"])
INVALID = next(case for case in FIXTURE["cases"] if case.get("keyword") == "type")
SUBJECT = "outbox.Order.order-placed"


def relay_headers(event_id, n, schema_key=None):
    """The headers the relay puts on an event (as the stored copies in test_consumer.py have
    them), and the contract key when there is one."""
    headers = {
        c.HEADER_MSG_ID: event_id,
        c.HEADER_EXPECTED_STREAM: STREAM,
        c.HEADER_COMMIT_LSN: f"0/{0x16B3748 + n:X}",
        c.HEADER_XID: str(700 + n),
        c.HEADER_COMMIT_TIME: f"2026-11-29T11:38:44.{n:06d}Z",
        c.HEADER_TABLE: "public.outbox",
        c.HEADER_TX_INDEX: "0",
        c.HEADER_AGGREGATE_TYPE: "Order",
        c.HEADER_AGGREGATE_ID: "7",
        c.HEADER_EVENT_TYPE: "order-placed",
    }
    if schema_key is not None:
        headers[c.HEADER_SCHEMA] = schema_key
    return headers


async def publish(t, payload, schema_key=None):
    """Publishes one event to the relay's stream; returns its event id."""
    event_id = str(uuid.uuid4())
    n = (await t.js.stream_info(STREAM)).state.messages + 1
    await t.js.publish(SUBJECT, payload.encode(), headers=relay_headers(event_id, n, schema_key))
    return event_id


async def put_fixture(t, bucket=c.CONTRACTS_BUCKET):
    kv = await t.js.create_key_value(bucket=bucket)
    await kv.put(FIXTURE["key"], FIXTURE["stored"].encode())


async def dead_letters(t, n):
    await t.wait_stream(n, stream=DLQ_STREAM)
    return [await t.message(seq, stream=DLQ_STREAM) for seq in range(1, n + 1)]


def test_a_valid_event_is_applied_and_one_breaking_its_contract_parked_with_the_reason(env):
    async def body():
        async with Client(env) as t:
            await t.js.add_stream(name=DLQ_STREAM, subjects=["dlq.>"])
            await put_fixture(t)
            good = await publish(t, VALID["payload"], FIXTURE["key"])
            bad = await publish(t, INVALID["payload"], FIXTURE["key"])
            unchecked = await publish(t, '{"no": "contract"}')

            consumer = Consumer(t.js, env.pg.url(), "svc", validate_contracts=True, **FAST)
            handler = lambda conn, ev: recording_handler(conn, ev, "svc")  # noqa: E731
            async with Running(consumer, handler):
                rows = await t.wait_ledger("svc", 2)
                (dl,) = await dead_letters(t, 1)
            # The valid event and the one without the header applied; the invalid one not.
            assert [r[0] for r in rows] == [good, unchecked]
            assert [e[0] for e in await t.effects("svc")] == [good, unchecked]
            reason = dl.headers[c.HEADER_DLQ_REASON]
            assert reason.startswith(
                f"contract {FIXTURE['key']}: at {INVALID['pointer']}: keyword "
                f"`{INVALID['keyword']}` expected \"integer\", found \"1250\""
            ), reason
            assert dl.headers[c.HEADER_DLQ_EVENT_ID] == bad
            assert dl.headers[c.HEADER_DLQ_DELIVERIES] == "1"
            assert dl.headers[c.HEADER_SCHEMA] == FIXTURE["key"]
            assert dl.data.decode() == INVALID["payload"]
            s = consumer.stats
            assert (s.applied, s.parked, s.retried, s.infra_errors) == (2, 1, 0, 0)
            assert (s.contracts_passed, s.contracts_refused) == (1, 1)

    run(body())


def test_a_key_missing_from_the_bucket_and_a_missing_header_are_refused(env):
    async def body():
        async with Client(env) as t:
            await t.js.add_stream(name=DLQ_STREAM, subjects=["dlq.>"])
            await put_fixture(t, bucket="contracts-x")
            missing_key = f"{FIXTURE['key'].rsplit('.', 1)[0]}.000000000000"
            unknown = await publish(t, VALID["payload"], missing_key)
            headerless = await publish(t, VALID["payload"])
            good = await publish(t, VALID["payload"], FIXTURE["key"])

            consumer = Consumer(t.js, env.pg.url(), "svc", validate_contracts=True,
                                contracts_bucket="contracts-x", require_contract=True, **FAST)
            handler = lambda conn, ev: recording_handler(conn, ev, "svc")  # noqa: E731
            async with Running(consumer, handler):
                rows = await t.wait_ledger("svc", 1)
                parked = await dead_letters(t, 2)
            assert [r[0] for r in rows] == [good]
            assert [e[0] for e in await t.effects("svc")] == [good]
            reasons = {dl.headers[c.HEADER_DLQ_EVENT_ID]: dl.headers[c.HEADER_DLQ_REASON]
                       for dl in parked}
            assert reasons == {
                unknown: f"contract {missing_key}: no such key in the contracts bucket"
                ' "contracts-x"',
                headerless: REQUIRED_REASON,
            }
            assert (consumer.stats.applied, consumer.stats.parked) == (1, 2)

    run(body())


def test_an_event_whose_bucket_does_not_exist_yet_waits_for_it_unparked(env):
    async def body():
        async with Client(env) as t:
            await t.js.add_stream(name=DLQ_STREAM, subjects=["dlq.>"])
            good = await publish(t, VALID["payload"], FIXTURE["key"])
            consumer = Consumer(t.js, env.pg.url(), "svc", validate_contracts=True, **FAST)
            handler = lambda conn, ev: recording_handler(conn, ev, "svc")  # noqa: E731
            async with Running(consumer, handler):
                await wait_async(lambda: consumer.stats.infra_errors >= 2,
                                 "deliveries put back while the bucket is missing")
                assert await t.ledger("svc") == []
                assert (await t.js.stream_info(DLQ_STREAM)).state.messages == 0
                await put_fixture(t)
                rows = await t.wait_ledger("svc", 1)
            assert [r[0] for r in rows] == [good]
            assert (consumer.stats.applied, consumer.stats.parked) == (1, 0)

    run(body())


def test_contract_settings_are_checked_when_the_consumer_is_made():
    with pytest.raises(ConsumerError, match="require_contract needs validate_contracts"):
        Consumer(js=None, conninfo="", service="svc", require_contract=True)
    with pytest.raises(ConsumerError, match="contracts bucket 'a.b' must be"):
        Consumer(js=None, conninfo="", service="svc", validate_contracts=True,
                 contracts_bucket="a.b")
