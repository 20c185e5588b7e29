//! The AsyncAPI document of a relay's configuration: what it says about channels, parameters,
//! headers and contract payloads, and that the AsyncAPI specification's own JSON Schema
//! (`@asyncapi/specs`) and AsyncAPI's parser (`@asyncapi/parser`, which resolves every `$ref`)
//! accept it, both run by scripts/asyncapi-check with Node.js.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use figment::Figment;
use figment::providers::{Format, Toml};
use relay_asyncapi::AsyncApiError;
use relay_runtime::config::RelayConfig;
use serde_json::Value;

/// A configuration with two outbox tables (one with a contract, CloudEvents, a TTL and
/// delivery times), two `[[messages]]` prefixes
/// (one with a subject template) and a dead-letter subject; the contract files copied into
/// `dir`.
fn config_in(dir: &Path) -> RelayConfig {
    let fixtures =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../outbox-schema/tests/fixtures/contracts");
    std::fs::create_dir_all(dir.join("shared")).expect("contracts directory");
    for file in ["order-placed.json", "shared/money.json"] {
        std::fs::copy(fixtures.join(file), dir.join(file)).expect("fixture copied");
    }
    let contract = dir.join("order-placed.json");
    let draft_7 = dir.join("order-cancelled.json");
    std::fs::write(
        &draft_7,
        r#"{"$schema": "http://json-schema.org/draft-07/schema#", "title": "OrderCancelled",
            "type": "object", "required": ["order_id"],
            "properties": {"order_id": {"type": "string"}}}"#,
    )
    .expect("draft 7 contract written");
    let toml = format!(
        r#"
        [nats]
        url = "nats://relay:s3cret@broker.example:4222,nats://relay:s3cret@second:4222"
        stream = "ORDERS"

        [relay]
        dead_letter_subject = "outbox.dlq"

        [[outbox]]
        table = "public.outbox"

        [[outbox]]
        table = "sales.orders"
        subject = "orders.{{levels:region}}.{{type}}"
        payload_format = "json"
        ttl_column = "ttl"
        schedule_column = "deliver_at"
        schedule_subject = "order_schedules"
        headers = {{ "Outbox-Event-Type" = "type", "Trace" = "trace?" }}
        cloudevents = {{ source = "/orders" }}

        [outbox.contracts]
        types = {{ "order.placed" = '{}' }}
        subjects = {{ "orders.*.cancelled" = '{}' }}

        [[messages]]
        prefix = "outbox"

        [[messages]]
        prefix = "audit"
        subject = "audit.{{actor}}"
        subjects = ["audit.*"]
        "#,
        contract.display(),
        draft_7.display()
    );
    let file = dir.join("relay.toml");
    std::fs::write(&file, toml).expect("configuration written");
    let config: RelayConfig = Figment::from(Toml::file(&file))
        .extract()
        .expect("configuration loads");
    config.validate().expect("configuration is valid");
    config
}

/// The document of [`config_in`], built in a temporary directory.
fn sample_document() -> (Value, RelayConfig, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("temporary directory");
    let config = config_in(dir.path());
    let document = relay_asyncapi::document(&config).expect("document builds");
    (document, config, dir)
}

/// The value a local `$ref` (`#/a/b`) names.
fn resolve<'a>(document: &'a Value, reference: &Value) -> &'a Value {
    let reference = reference.as_str().expect("a $ref is a string");
    let pointer = reference.strip_prefix('#').expect("a local $ref");
    document
        .pointer(pointer)
        .unwrap_or_else(|| panic!("{reference} names nothing"))
}

/// The Message Object a channel's message `key` refers to.
fn message<'a>(document: &'a Value, channel: &str, key: &str) -> &'a Value {
    resolve(
        document,
        &document["channels"][channel]["messages"][key]["$ref"],
    )
}

fn keys(value: &Value) -> Vec<&str> {
    let mut keys: Vec<&str> = value
        .as_object()
        .expect("an object")
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort_unstable();
    keys
}

#[test]
fn asyncapi_document_has_a_channel_per_mapping_prefix_and_dead_letter_subject() {
    let (document, _config, _dir) = sample_document();
    assert_eq!(document["asyncapi"], "3.0.0");
    assert_eq!(document["info"]["title"], "outbox-relay: ORDERS");
    assert_eq!(document["info"]["version"], env!("CARGO_PKG_VERSION"));
    let server = &document["servers"]["nats"];
    assert_eq!(server["host"], "broker.example:4222");
    assert_eq!(server["protocol"], "nats");
    let text = document.to_string();
    assert!(
        !text.contains("s3cret") && !text.contains("relay@"),
        "{text}"
    );

    assert_eq!(
        keys(&document["channels"]),
        [
            "dead-letters",
            "messages.audit",
            "messages.outbox",
            "table.public.outbox",
            "table.sales.orders",
            "table.sales.orders.schedules"
        ]
    );
    let channels = &document["channels"];
    assert_eq!(
        channels["table.public.outbox"]["address"],
        "outbox.{aggregatetype}.{type}"
    );
    assert_eq!(
        channels["table.sales.orders"]["address"],
        "orders.{region}.{type}"
    );
    assert_eq!(
        channels["table.sales.orders.schedules"]["address"],
        "order_schedules.{id}"
    );
    assert_eq!(channels["messages.audit"]["address"], "audit.{actor}");
    // Only filters are known for a prefix without a template: no address, the filters said.
    assert!(channels["messages.outbox"].get("address").is_none());
    assert!(
        channels["messages.outbox"]["description"]
            .as_str()
            .unwrap()
            .contains("`outbox.>`")
    );
    assert_eq!(channels["dead-letters"]["address"], "outbox.dlq");

    for (id, _) in channels.as_object().unwrap() {
        let operation = &document["operations"][format!("send.{id}")];
        assert_eq!(operation["action"], "send", "{id}");
        assert_eq!(operation["channel"]["$ref"], format!("#/channels/{id}"));
        for reference in operation["messages"].as_array().unwrap() {
            resolve(&document, &reference["$ref"]);
        }
    }
}

#[test]
fn asyncapi_parameters_name_their_column_and_escaping_rule() {
    let (document, _config, _dir) = sample_document();
    let parameters = &document["channels"]["table.public.outbox"]["parameters"];
    assert_eq!(keys(parameters), ["aggregatetype", "type"]);
    let token = parameters["aggregatetype"]["description"].as_str().unwrap();
    assert!(
        token.starts_with("Column `aggregatetype` as one subject token"),
        "{token}"
    );
    assert!(token.contains("`%XX`"), "{token}");
    let levels = document["channels"]["table.sales.orders"]["parameters"]["region"]["description"]
        .as_str()
        .unwrap();
    assert!(
        levels.starts_with("Column `region` as subject levels (`{levels:region}`)"),
        "{levels}"
    );
    let field = document["channels"]["messages.audit"]["parameters"]["actor"]["description"]
        .as_str()
        .unwrap();
    assert!(field.starts_with("Envelope field `actor`"), "{field}");
}

/// `(properties, required)` of a message's headers.
fn headers(message: &Value) -> (&serde_json::Map<String, Value>, Vec<&str>) {
    let schema = &message["headers"];
    assert_eq!(schema["type"], "object");
    let required = schema["required"]
        .as_array()
        .expect("headers have `required`")
        .iter()
        .map(|h| h.as_str().expect("a header name"))
        .collect();
    let properties = schema["properties"]
        .as_object()
        .expect("headers have `properties`");
    (properties, required)
}

#[test]
fn asyncapi_headers_are_the_relays_own_the_mapped_and_the_native_ones() {
    let (document, _config, _dir) = sample_document();
    let (properties, required) = headers(message(&document, "table.public.outbox", "event"));
    for own in outbox_contract::RELAY_HEADERS {
        assert!(
            properties.contains_key(own) && required.contains(&own),
            "{own}"
        );
    }
    assert_eq!(properties["Outbox-Table"]["const"], "public.outbox");
    assert_eq!(properties["Nats-Expected-Stream"]["const"], "ORDERS");
    // Mapped headers are omitted for NULL values: described, never required.
    for mapped in ["Outbox-Aggregate-Type", "Outbox-Event-Type", "traceparent"] {
        assert!(
            properties.contains_key(mapped) && !required.contains(&mapped),
            "{mapped}"
        );
    }
    assert!(
        properties["traceparent"]["description"]
            .as_str()
            .unwrap()
            .contains("optional")
    );
    assert!(!properties.contains_key("Outbox-Schema") && !properties.contains_key("ce-id"));

    let (properties, required) = headers(message(&document, "table.sales.orders", "event"));
    assert_eq!(properties["Outbox-Table"]["const"], "sales.orders");
    for ce in ["ce-id", "ce-source", "ce-type", "ce-time", "ce-specversion"] {
        assert!(required.contains(&ce), "{ce}");
    }
    assert_eq!(properties["ce-source"]["const"], "/orders");
    assert!(properties.contains_key("Nats-TTL") && properties.contains_key("Trace"));
    // Events without a contract carry no Outbox-Schema.
    assert!(!properties.contains_key("Outbox-Schema"));
    // JetStream delivers scheduled events here without Nats-Msg-Id, with Outbox-Event-Id.
    assert!(!required.contains(&"Nats-Msg-Id") && properties.contains_key("Outbox-Event-Id"));

    // The relay publishes a scheduled event on its schedule subject, with the schedule headers.
    let scheduled = message(
        &document,
        "table.sales.orders.schedules",
        "contract.order-placed",
    );
    let (properties, required) = headers(scheduled);
    for schedule in [
        "Nats-Schedule",
        "Nats-Schedule-Target",
        "Outbox-Event-Id",
        "Nats-Msg-Id",
    ] {
        assert!(required.contains(&schedule), "{schedule}");
    }
    assert!(properties.contains_key("Nats-Schedule-TTL") && !properties.contains_key("Nats-TTL"));

    let (properties, required) = headers(message(&document, "messages.outbox", "event"));
    assert!(
        required.contains(&"Outbox-Message-Prefix") && !properties.contains_key("Outbox-Table")
    );
    assert_eq!(properties["Outbox-Message-Prefix"]["const"], "outbox");

    let (_, required) = headers(message(&document, "dead-letters", "dead-letter"));
    assert!(required.contains(&"Outbox-Dlq-Reason"));
}

#[test]
fn asyncapi_payload_of_a_contracted_event_is_the_contracts_schema() {
    let (document, config, _dir) = sample_document();
    let contracts = config.contracts().unwrap();
    assert!(contracts.iter().all(|(table, _)| table == "sales.orders"));
    let named = |name: &str| {
        let (_, loaded) = contracts
            .iter()
            .find(|(_, c)| c.contract().name() == name)
            .unwrap_or_else(|| panic!("no contract {name}: {contracts:?}"));
        loaded.contract()
    };
    let (contract, draft_7) = (named("order-placed"), named("order-cancelled"));
    let placed = message(&document, "table.sales.orders", "contract.order-placed");
    assert_eq!(placed["name"], "order-placed");
    assert_eq!(placed["contentType"], "application/json");
    assert_eq!(
        placed["payload"]["schemaFormat"],
        "application/schema+json;version=draft-2020-12"
    );
    // The bundle, its `$ref` to shared/money.json a pointer to where it embeds that file.
    let at = "/components/messages/table.sales.orders.contract.order-placed/payload/schema";
    let schema = &placed["payload"]["schema"];
    assert_eq!(schema, &outbox_schema::document_refs(contract.schema(), at));
    assert_eq!(schema["title"], "OrderPlaced");
    assert_eq!(
        contract.schema()["properties"]["total"]["$ref"],
        "shared/money.json"
    );
    let money = resolve(&document, &schema["properties"]["total"]["$ref"]);
    assert_eq!(
        money,
        &contract.schema()["$defs"]["file:///shared/money.json"]
    );
    let mut unchanged = schema.clone();
    unchanged["properties"]["total"]["$ref"] = "shared/money.json".into();
    assert_eq!(&unchanged, contract.schema());
    let (properties, required) = headers(placed);
    assert!(required.contains(&"Outbox-Schema"));
    assert_eq!(properties["Outbox-Schema"]["const"], contract.key());
    let description = placed["description"].as_str().unwrap();
    assert!(
        description.contains("`types.order.placed`"),
        "{description}"
    );
    // A draft 7 contract says so: the AsyncAPI schema then checks it as a draft 7 schema.
    let cancelled = message(&document, "table.sales.orders", "contract.order-cancelled");
    assert_eq!(
        cancelled["payload"]["schemaFormat"],
        "application/schema+json;version=draft-07"
    );
    assert_eq!(&cancelled["payload"]["schema"], draft_7.schema());
    let description = cancelled["description"].as_str().unwrap();
    assert!(
        description.contains(r#"`subjects."orders.*.cancelled"`"#),
        "{description}"
    );
    // The event without a contract keeps a message of its own: required is false.
    let unchecked = message_payload(&document, "table.sales.orders", "event");
    assert!(
        unchecked["description"]
            .as_str()
            .unwrap()
            .contains("byte for byte")
    );
}

fn message_payload<'a>(document: &'a Value, channel: &str, key: &str) -> &'a Value {
    &message(document, channel, key)["payload"]
}

#[test]
fn asyncapi_ids_and_parameter_names_are_what_asyncapi_allows() {
    let (document, _config, _dir) = sample_document();
    let component = |k: &str| {
        !k.is_empty()
            && k.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
    };
    for map in ["/channels", "/operations", "/components/messages"] {
        for key in keys(document.pointer(map).unwrap()) {
            assert!(component(key), "{map}: {key}");
        }
    }
    for (_, channel) in document["channels"].as_object().unwrap() {
        for name in channel.get("parameters").map(keys).unwrap_or_default() {
            assert!(
                name.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            );
        }
    }
}

#[test]
fn asyncapi_document_fails_when_a_contract_cannot_be_loaded() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config_in(dir.path());
    std::fs::write(dir.path().join("broken.json"), "{ not json").unwrap();
    let mut tables: Vec<_> = config.outbox.to_vec();
    let contracts = tables[1].contracts.as_mut().unwrap();
    contracts.types.insert(
        "order.cancelled".into(),
        relay_core::route::ContractFile::Path(dir.path().join("broken.json")),
    );
    config.outbox = tables.into();
    let error = relay_asyncapi::document(&config).unwrap_err();
    assert!(matches!(error, AsyncApiError::Contracts(_)), "{error:?}");
    let chain = format!("{error}: {}", std::error::Error::source(&error).unwrap());
    assert!(chain.contains("broken.json"), "{chain}");
}

// ---- the AsyncAPI specification's own JSON Schema, through scripts/asyncapi-check -----------

fn check_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/asyncapi-check")
}

/// `(path, version, integrity)` of every package a lockfile lists.
fn locked_packages(lockfile: &Path) -> Option<BTreeMap<String, (Value, Value)>> {
    let lock: Value = serde_json::from_slice(&std::fs::read(lockfile).ok()?).ok()?;
    let packages = lock.get("packages")?.as_object()?;
    Some(
        packages
            .iter()
            .filter(|(path, _)| !path.is_empty())
            .map(|(path, p)| (path.clone(), (p["version"].clone(), p["integrity"].clone())))
            .collect(),
    )
}

/// Installs scripts/asyncapi-check's packages (@asyncapi/specs, @asyncapi/parser, ajv) with
/// `npm ci` unless node_modules already holds
/// exactly what package-lock.json locks (npm's own record of what it installed); once per test
/// run, however many tests ask.
fn install_checker() -> &'static Result<(), String> {
    static INSTALLED: OnceLock<Result<(), String>> = OnceLock::new();
    INSTALLED.get_or_init(|| {
        let dir = check_dir();
        for tool in ["node", "npm"] {
            if let Err(e) = Command::new(tool).arg("--version").output() {
                return Err(format!(
                    "`{tool}` cannot be run ({e}): the AsyncAPI check needs Node.js 20+ and npm on PATH (Debian: apt-get install nodejs npm)"
                ));
            }
        }
        let locked = locked_packages(&dir.join("package-lock.json"));
        if locked.is_some() && locked == locked_packages(&dir.join("node_modules/.package-lock.json"))
        {
            return Ok(());
        }
        // From npm's cache when it holds the packages; no package's install script is needed.
        let output = Command::new("npm")
            .args([
                "ci",
                "--prefer-offline",
                "--ignore-scripts",
                "--no-audit",
                "--no-fund",
                "--loglevel=error",
            ])
            .current_dir(&dir)
            .output()
            .map_err(|e| format!("npm ci in {}: {e}", dir.display()))?;
        if output.status.success() {
            Ok(())
        } else {
            Err(format!(
                "npm ci in {} failed:\n{}",
                dir.display(),
                String::from_utf8_lossy(&output.stderr)
            ))
        }
    })
}

/// `node check.mjs <file>` on `document`.
fn check(document: &Value) -> Output {
    if let Err(e) = install_checker() {
        panic!("{e}");
    }
    let file = tempfile::Builder::new()
        .suffix(".json")
        .tempfile()
        .expect("temporary file");
    let text = serde_json::to_vec_pretty(document).expect("serializes");
    std::fs::write(file.path(), text).expect("document written");
    Command::new("node")
        .arg("check.mjs")
        .arg(file.path())
        .current_dir(check_dir())
        .output()
        .expect("node runs check.mjs")
}

#[test]
fn asyncapi_document_is_valid_by_the_asyncapi_specifications_schema() {
    let (document, _config, _dir) = sample_document();
    let output = check(&document);
    assert!(
        output.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn asyncapi_check_refuses_a_broken_document() {
    let (document, _config, _dir) = sample_document();
    // An operation without its channel: the specification's schema requires it.
    let mut broken = document.clone();
    let operation = broken["operations"]["send.table.public.outbox"]
        .as_object_mut()
        .unwrap();
    operation.remove("channel");
    let output = check(&broken);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("/operations/send.table.public.outbox") && stderr.contains("'channel'"),
        "{stderr}"
    );
    // A reference to a message that is not there: the check's own rule.
    let mut dangling = document;
    let messages = dangling["components"]["messages"].as_object_mut().unwrap();
    messages.remove("table.public.outbox.event");
    let output = check(&dangling);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("#/components/messages/table.public.outbox.event names nothing"),
        "{stderr}"
    );
}

/// The example of docs/contracts.md: `order-placed.json` refers to `shared/money.json`. AsyncAPI
/// tools resolve `$ref`s as JSON References, without the bundle's `$id`s: the document's `$ref`
/// must point into it, or @asyncapi/parser looks for shared/money.json on disk.
#[test]
fn asyncapi_contract_refs_resolve_inside_the_document_for_asyncapis_parser() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let fixtures =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../outbox-schema/tests/fixtures/contracts");
    let contracts = dir.path().join("contracts");
    std::fs::create_dir_all(contracts.join("shared")).expect("contracts directory");
    for file in ["order-placed.json", "shared/money.json"] {
        std::fs::copy(fixtures.join(file), contracts.join(file)).expect("fixture copied");
    }
    let file = dir.path().join("relay.toml");
    std::fs::write(
        &file,
        format!(
            "[nats]\nurl = \"nats://127.0.0.1:4222\"\nstream = \"ORDERS\"\n\n[[outbox]]\ntable = \"public.orders_outbox\"\nsubject = \"outbox.orders.{{type}}\"\n\n[outbox.contracts]\ntypes = {{ OrderPlaced = '{}' }}\n",
            contracts.join("order-placed.json").display()
        ),
    )
    .expect("configuration written");
    let config: RelayConfig = Figment::from(Toml::file(&file))
        .extract()
        .expect("configuration loads");
    config.validate().expect("configuration is valid");
    let document = relay_asyncapi::document(&config).expect("document builds");
    let total = "/components/messages/table.public.orders_outbox.contract.order-placed/payload/schema/properties/total/$ref";
    assert_eq!(
        document.pointer(total).and_then(Value::as_str),
        Some(
            "#/components/messages/table.public.orders_outbox.contract.order-placed/payload/schema/$defs/file:~1~1~1shared~1money.json"
        )
    );
    let output = check(&document);
    assert!(
        output.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );

    // The bundle's own `$ref`, as the relay stores it: the parser cannot resolve it.
    let mut stored = document;
    *stored.pointer_mut(total).expect("the $ref") = "shared/money.json".into();
    let output = check(&stored);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("parser: invalid-ref") && stderr.contains("shared/money.json"),
        "{stderr}"
    );
    assert!(
        stderr.contains("shared/money.json is not a pointer into the document"),
        "{stderr}"
    );
}
