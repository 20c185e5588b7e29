//! Decoder and routing micro-benchmarks: one core, one outbox row at a time.
//!
//! Target: >= 1,000,000 rows/s for decode and for routing, so neither is the
//! relay's bottleneck. Run with `cargo bench -p relay-bench --bench decode_route`.
//!
//! The input is the pgoutput frame of a real row of the bench table (Debezium outbox shape plus
//! the polling baseline's `published_at`): uuid, two short varchars, a type, a ~300-byte jsonb
//! payload, a NULL trace context, `created_at` and a NULL `published_at`.
//!
//! The framework mapping shapes route a CAP-shaped row (`Id`, `Name`, `Content`, the same
//! ~300-byte body) three ways beside it: the topic as dotted subject levels, a 5-member JSON
//! header column, and the whole CAP envelope (body and headers as members of `Content`).
//!
//! Event contracts: a row of the same table whose ~300-byte payload has the 10 properties of
//! the bench contract (contracts/bench-order-created.json, the relay-bench contracts rows'),
//! routed with `[outbox.contracts]` on and without it, its JSON parse, and the contract check
//! alone.

use std::hint::black_box;
use std::sync::Arc;

use bytes::Bytes;
use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, Throughput, criterion_group, criterion_main};
use outbox_schema::{Contract, Limits, SchemaError};
use pgoutput::{LogicalMessage, Lsn, decode};
use relay_core::message::TxContext;
use relay_core::route::{
    ContractFile, ContractsConfig, LoadedContract, OutboxTableConfig, Router, TableContracts,
};

const OID: u32 = 16_385;

fn cstr(buf: &mut Vec<u8>, s: &str) {
    buf.extend_from_slice(s.as_bytes());
    buf.push(0);
}

/// `R` message of `public.outbox` with the bench columns.
fn relation_frame() -> Bytes {
    relation_of(
        OID,
        "public",
        "outbox",
        &[
            ("id", 2950),
            ("aggregatetype", 1043),
            ("aggregateid", 1043),
            ("type", 1043),
            ("payload", 3802),
            ("tracingspancontext", 1043),
            ("created_at", 1184),
            ("published_at", 1184),
        ],
    )
}

/// `I` message of one bench row (~300-byte jsonb payload, as the bench inserts).
fn insert_frame() -> Bytes {
    let payload = format!(
        r#"{{"ts": 1795952324123456, "note": "{}", "items": [{{"qty": 1, "sku": "SKU-42", "price": 1999}}], "amount": 1999, "currency": "EUR", "customer": "customer-123", "order_id": 123456}}"#,
        "x".repeat(120)
    );
    insert_frame_with(&payload)
}

/// `I` message of one bench row with `payload`.
fn insert_frame_with(payload: &str) -> Bytes {
    insert_of(
        OID,
        &[
            Some("9b2e6a4c-6f0e-4f7e-9d55-0c6a3a6f8f21"),
            Some("Order"),
            Some("123456"),
            Some("OrderCreated"),
            Some(payload),
            None,
            Some("2026-11-29 11:38:44.123456+00"),
            None,
        ],
    )
}

/// A relation frame of `schema.table` with `columns` (name, type oid).
fn relation_of(oid: u32, schema: &str, table: &str, columns: &[(&str, u32)]) -> Bytes {
    let mut b = vec![b'R'];
    b.extend_from_slice(&oid.to_be_bytes());
    cstr(&mut b, schema);
    cstr(&mut b, table);
    b.push(b'd');
    b.extend_from_slice(&(columns.len() as i16).to_be_bytes());
    for (i, (name, type_oid)) in columns.iter().enumerate() {
        b.push(u8::from(i == 0));
        cstr(&mut b, name);
        b.extend_from_slice(&type_oid.to_be_bytes());
        b.extend_from_slice(&(-1_i32).to_be_bytes());
    }
    Bytes::from(b)
}

/// An insert frame of relation `oid` with text `values` (`None`: NULL).
fn insert_of(oid: u32, values: &[Option<&str>]) -> Bytes {
    let mut b = vec![b'I'];
    b.extend_from_slice(&oid.to_be_bytes());
    b.push(b'N');
    b.extend_from_slice(&(values.len() as i16).to_be_bytes());
    for v in values {
        match v {
            None => b.push(b'n'),
            Some(v) => {
                b.push(b't');
                b.extend_from_slice(&(v.len() as u32).to_be_bytes());
                b.extend_from_slice(v.as_bytes());
            }
        }
    }
    Bytes::from(b)
}

/// Sets a CAP-shaped table's mapping keys.
type Shape = fn(&mut OutboxTableConfig);

/// A router for a CAP-shaped table mapped by `mapping` (on top of `Id`, `Content`), and
/// one decoded row of it whose `Content` holds `content`.
fn cap_shape(mapping: Shape, content: &str) -> (Router, pgoutput::Insert) {
    const CAP_OID: u32 = 16_400;
    let mut config = OutboxTableConfig::with_defaults("cap.published");
    config.event_id = "Id".into();
    config.headers.clear();
    config.payload = "Content".into();
    mapping(&mut config);
    let mut router = Router::new(&[config]).expect("mapping is valid");
    let relation = relation_of(
        CAP_OID,
        "cap",
        "published",
        &[("Id", 20), ("Name", 1043), ("Content", 25), ("Headers", 25)],
    );
    match decode(&relation) {
        Ok(LogicalMessage::Relation(r)) => router.on_relation(r, None).expect("relation matches"),
        other => panic!("relation frame did not decode: {other:?}"),
    }
    let headers = r#"{"cap-msg-id":"1884513265453617152","cap-msg-name":"orders.created","cap-msg-type":"OrderCreated","cap-corr-seq":"0","traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}"#;
    let insert = insert_of(
        CAP_OID,
        &[
            Some("1884513265453617152"),
            Some("orders.created"),
            Some(content),
            Some(headers),
        ],
    );
    match decode(&insert) {
        Ok(LogicalMessage::Insert(i)) => (router, i),
        other => panic!("insert frame did not decode: {other:?}"),
    }
}

fn router() -> Router {
    let router = Router::new(&[OutboxTableConfig::with_defaults("public.outbox")])
        .expect("default mapping is valid");
    with_bench_relation(router)
}

/// `router` after the bench table's relation frame.
fn with_bench_relation(mut router: Router) -> Router {
    match decode(&relation_frame()) {
        Ok(LogicalMessage::Relation(r)) => {
            router.on_relation(r, None).expect("bench relation matches")
        }
        other => panic!("relation frame did not decode: {other:?}"),
    }
    router
}

/// The contract every 10-property row is checked against (the relay-bench contracts rows').
const CONTRACT_FILE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/contracts/bench-order-created.json"
);

/// A ~300-byte payload with the contract's 10 properties: the bench payload's 7 plus `status`,
/// `channel` and `country`, with a shorter `note` so the size stays that of the bench payload.
fn contract_payload() -> String {
    format!(
        r#"{{"ts": 1795952324123456, "note": "{}", "items": [{{"qty": 1, "sku": "SKU-42", "price": 1999}}], "amount": 1999, "status": "created", "channel": "web", "country": "DE", "currency": "EUR", "customer": "customer-123", "order_id": 123456}}"#,
        "x".repeat(64)
    )
}

/// The bench table's router with `[outbox.contracts]` naming the bench contract for event type
/// `OrderCreated`, compiled as the relay compiles it, and that contract.
fn contract_router() -> (Router, Arc<LoadedContract>) {
    // Through serde, as the relay reads the TOML: the section's defaults (limits) apply.
    let contracts: ContractsConfig =
        serde_json::from_value(serde_json::json!({ "types": { "OrderCreated": CONTRACT_FILE } }))
            .expect("contracts section is valid");
    let mut config = OutboxTableConfig::with_defaults("public.outbox");
    config.contracts = Some(contracts);
    let load = |file: &ContractFile| -> Result<Arc<LoadedContract>, SchemaError> {
        let contract = Contract::load(file.path(), file.name())?;
        Ok(Arc::new(LoadedContract::new(
            contract,
            file.path().display().to_string(),
        )))
    };
    let router = Router::new(&[config])
        .expect("mapping is valid")
        .with_contracts(|_, contracts| TableContracts::new(contracts, load).map(Arc::new))
        .expect("the bench contract compiles");
    let (_, contract) = router.contracts().into_iter().next().expect("one contract");
    (with_bench_relation(router), contract)
}

/// The 10-property row routed without contracts and with its contract checked, decoded and
/// routed both ways, the payload's JSON parse, and the contract check alone.
fn contract_cases(group: &mut BenchmarkGroup<'_, WallTime>, tx: &TxContext) {
    let payload = contract_payload();
    let insert = insert_frame_with(&payload);
    let decoded = match decode(&insert) {
        Ok(LogicalMessage::Insert(i)) => i,
        other => panic!("insert frame did not decode: {other:?}"),
    };
    let (checked, contract) = contract_router();
    let unchecked = router();
    // The "on" cases must check the contract and the "off" ones must not, or the pair compares
    // nothing.
    let schema_header = |router: &Router| {
        let msg = router.route_insert(&decoded, tx, 0).expect("routes");
        msg.expect("an outbox row")
            .headers
            .iter()
            .find(|(name, _)| name.as_ref() == "Outbox-Schema")
            .map(|(_, value)| value.to_string())
    };
    assert_eq!(
        schema_header(&checked).as_deref(),
        Some(contract.contract().key())
    );
    assert_eq!(contract.checked(), 1);
    assert_eq!(schema_header(&unchecked), None);
    for (name, router) in [
        ("route_insert_10_properties", &unchecked),
        ("route_insert_10_properties_contract_checked", &checked),
    ] {
        group.bench_function(name, |b| {
            let mut i = 0_u64;
            b.iter(|| {
                i += 1;
                router
                    .route_insert(black_box(&decoded), tx, i)
                    .expect("routes")
            })
        });
    }
    for (name, router) in [
        ("decode_and_route_10_properties", &unchecked),
        ("decode_and_route_10_properties_contract_checked", &checked),
    ] {
        group.bench_function(name, |b| {
            let mut i = 0_u64;
            b.iter(|| {
                i += 1;
                let Ok(LogicalMessage::Insert(ins)) = decode(black_box(&insert)) else {
                    panic!("not an insert")
                };
                router.route_insert(&ins, tx, i).expect("routes")
            })
        });
    }
    // The check's first half: the payload parsed into a `serde_json::Value`, which the
    // validator walks.
    group.bench_function("json_parse_10_properties", |b| {
        b.iter(|| {
            serde_json::from_slice::<serde_json::Value>(black_box(payload.as_bytes()))
                .expect("the payload is JSON")
        })
    });
    let limits = Limits::default();
    group.bench_function("contract_check_10_properties", |b| {
        b.iter(|| {
            contract
                .contract()
                .check(black_box(payload.as_bytes()), &limits)
                .expect("the payload satisfies the contract")
        })
    });
}

fn benches(c: &mut Criterion) {
    let insert = insert_frame();
    let mut group = c.benchmark_group("outbox_row");
    group.throughput(Throughput::Elements(1));

    group.bench_function("decode_insert", |b| {
        b.iter(|| decode(black_box(&insert)).expect("decodes"))
    });

    let router = router();
    let tx = TxContext::new(7_777, Lsn(0x016B_3748), 848_000_000_000_000);
    let decoded = match decode(&insert) {
        Ok(LogicalMessage::Insert(i)) => i,
        other => panic!("insert frame did not decode: {other:?}"),
    };
    group.bench_function("route_insert", |b| {
        let mut i = 0_u64;
        b.iter(|| {
            i += 1;
            router
                .route_insert(black_box(&decoded), &tx, i)
                .expect("routes")
        })
    });

    group.bench_function("decode_and_route", |b| {
        let mut i = 0_u64;
        b.iter(|| {
            i += 1;
            let Ok(LogicalMessage::Insert(ins)) = decode(black_box(&insert)) else {
                panic!("not an insert")
            };
            router.route_insert(&ins, &tx, i).expect("routes")
        })
    });

    contract_cases(&mut group, &tx);

    // The framework mapping shapes, on a CAP-shaped row with the same body.
    let body = format!(
        r#"{{"ts": 1795952324123456, "note": "{}", "items": [{{"qty": 1, "sku": "SKU-42", "price": 1999}}], "amount": 1999, "currency": "EUR", "customer": "customer-123", "order_id": 123456}}"#,
        "x".repeat(120)
    );
    let envelope = format!(
        r#"{{"Headers":{{"cap-msg-id":"1884513265453617152","cap-msg-name":"orders.created","cap-msg-type":"OrderCreated","cap-corr-seq":"0","cap-senttime":"07/01/2026 16:02:20"}},"Value":{body}}}"#
    );
    let shapes: [(&str, Shape, &str); 4] = [
        (
            "route_cap_one_token",
            |c| c.subject = "cap.{Name}".into(),
            body.as_str(),
        ),
        (
            "route_cap_dotted_levels",
            |c| c.subject = "{levels:Name}".into(),
            body.as_str(),
        ),
        (
            "route_cap_json_header_column",
            |c| {
                c.subject = "cap.{Name}".into();
                c.headers_json = Some("Headers".into());
            },
            body.as_str(),
        ),
        (
            "route_cap_envelope",
            |c| {
                c.subject = "{levels:Name}".into();
                c.payload_pointer = Some("/Value".into());
                c.headers_json = Some("Content".into());
                c.headers_json_pointer = Some("/Headers".into());
            },
            envelope.as_str(),
        ),
    ];
    for (name, mapping, content) in shapes {
        let (router, row) = cap_shape(mapping, content);
        group.bench_function(name, |b| {
            let mut i = 0_u64;
            b.iter(|| {
                i += 1;
                router
                    .route_insert(black_box(&row), &tx, i)
                    .expect("routes")
            })
        });
    }

    group.bench_function("tx_context_per_transaction", |b| {
        let mut xid = 0_u32;
        b.iter(|| {
            xid = xid.wrapping_add(1);
            TxContext::new(black_box(xid), Lsn(0x016B_3748), 848_000_000_000_000)
        })
    });
    group.finish();
}

criterion_group!(decode_route, benches);
criterion_main!(decode_route);
