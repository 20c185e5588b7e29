//! The framework-shape rows: the same ~300-byte body in 100-row transactions, caught up once
//! per mapping shape in one run: the plain Debezium row (the default mapping on `outbox`, the
//! baseline), then a CAP-shaped table (`"Id"`, `"Name"`, `"Content"`, `"Headers"`) mapped with
//! dotted subject levels, with a 5-member JSON header column, and as CAP's whole envelope
//! (`payload_pointer` and `headers_json_pointer` into `Content`), as the decode_route
//! micro-benchmark routes them.

use anyhow::{Context as _, Result};

use crate::Args;

use super::relay::{CatchUpConfig, relay_catch_up_with};
use super::setup::{Env, PAYLOAD_SQL, insert_lsn, insert_sql, reset, write_backlog_with};
use super::{PUBLICATION, RelayRun, say};

/// Rows per transaction of every shape's backlog.
pub const SHAPES_PER_TX: u64 = 100;
/// The CAP-shaped table of the framework shapes.
const TABLE: &str = "framework_outbox";
/// The topic every CAP-shaped row carries: two subject levels, or one escaped token.
const TOPIC: &str = "orders.created";

/// One mapping shape the bench relays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// The Debezium outbox row with the default mapping: the baseline.
    Plain,
    /// `subject = "outbox.{levels:Name}"`.
    Levels,
    /// `headers_json` on a column holding a 5-member JSON object (subject one token).
    HeaderColumn,
    /// CAP's envelope: `Content` = `{"Headers": {5 members}, "Value": body}`.
    Envelope,
}

impl Shape {
    const ALL: [Self; 4] = [
        Self::Plain,
        Self::Levels,
        Self::HeaderColumn,
        Self::Envelope,
    ];

    /// The row's name in the table.
    pub fn label(self) -> &'static str {
        match self {
            Self::Plain => "plain Debezium row (default mapping)",
            Self::Levels => "dotted subject levels (`outbox.{levels:Name}`)",
            Self::HeaderColumn => "a 5-member JSON header column (`headers_json`)",
            Self::Envelope => {
                "the CAP envelope (`payload_pointer` + `headers_json_pointer` into `Content`)"
            }
        }
    }

    /// The slot and log name part of this shape's run.
    fn variant(self) -> &'static str {
        match self {
            Self::Plain => "_shape_plain",
            Self::Levels => "_shape_levels",
            Self::HeaderColumn => "_shape_headers_json",
            Self::Envelope => "_shape_envelope",
        }
    }

    /// The `[[outbox]]` entry of this shape (none: the default mapping of `public.outbox`).
    fn mapping(self) -> String {
        let entry = |keys: &str| {
            format!(
                "\n[[outbox]]\ntable = \"public.{TABLE}\"\nevent_id = \"Id\"\npayload = \"Content\"\nheaders = {{}}\n{keys}"
            )
        };
        match self {
            Self::Plain => String::new(),
            Self::Levels => entry("subject = \"outbox.{levels:Name}\"\n"),
            Self::HeaderColumn => {
                entry("subject = \"outbox.{Name}\"\nheaders_json = \"Headers\"\n")
            }
            Self::Envelope => entry(
                "subject = \"outbox.{levels:Name}\"\npayload_pointer = \"/Value\"\nheaders_json = \"Content\"\nheaders_json_pointer = \"/Headers\"\n",
            ),
        }
    }

    /// The statement that writes events `from..=to` of this shape.
    fn rows_sql(self) -> fn(u64, u64) -> String {
        match self {
            Self::Plain => insert_sql,
            Self::Levels => |from, to| cap_rows_sql("({PAYLOAD})::text", "NULL", from, to),
            Self::HeaderColumn => {
                |from, to| cap_rows_sql("({PAYLOAD})::text", "({HEADERS})::text", from, to)
            }
            Self::Envelope => |from, to| {
                cap_rows_sql(
                    "json_build_object('Headers', {HEADERS}, 'Value', {PAYLOAD})::text",
                    "NULL",
                    from,
                    to,
                )
            },
        }
    }
}

/// The five members CAP writes into `Content.Headers` (as JSON of event `g`).
const HEADERS_SQL: &str = "json_build_object('cap-msg-id', g::text, 'cap-msg-name', 'orders.created', \
     'cap-msg-type', 'OrderCreated', 'cap-corr-seq', '0', \
     'traceparent', '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01')";

/// INSERT of CAP-shaped rows `from..=to`; `content` and `headers` are SQL of event `g` in which
/// `{PAYLOAD}` is the bench body and `{HEADERS}` the 5-member object.
fn cap_rows_sql(content: &str, headers: &str, from: u64, to: u64) -> String {
    let fill = |sql: &str| {
        sql.replace("{PAYLOAD}", PAYLOAD_SQL)
            .replace("{HEADERS}", HEADERS_SQL)
    };
    format!(
        "INSERT INTO {TABLE} (\"Id\", \"Name\", \"Content\", \"Headers\") \
         SELECT g, '{TOPIC}', {}, {} FROM generate_series({from}, {to}) g",
        fill(content),
        fill(headers)
    )
}

/// One shape's backlog and its catch-up.
#[derive(Debug)]
pub struct ShapeRun {
    pub shape: Shape,
    pub rows: u64,
    pub write_secs: f64,
    pub wal_bytes: u64,
    pub relay: RelayRun,
}

/// Every shape's catch-up of `--shape-rows` events, one after the other in this run.
pub(super) async fn shapes(env: &Env, args: &Args) -> Result<Vec<ShapeRun>> {
    let rows = args.shape_rows();
    if rows == 0 {
        return Ok(Vec::new());
    }
    env.client
        .batch_execute(&format!(
            "DROP TABLE IF EXISTS {TABLE};
             CREATE TABLE {TABLE} (\"Id\" bigint PRIMARY KEY, \"Name\" varchar(200) NOT NULL,
                 \"Content\" text NOT NULL, \"Headers\" text);
             ALTER PUBLICATION {PUBLICATION} ADD TABLE {TABLE};"
        ))
        .await
        .context("creating the framework-shape table")?;
    let mif = args.max_in_flight.first().copied().unwrap_or(1024);
    say(format!(
        "== framework mapping shapes: {rows} events each in {SHAPES_PER_TX}-row txs"
    ));
    let mut out = Vec::new();
    for shape in Shape::ALL {
        out.push(shape_run(env, shape, rows, mif).await?);
    }
    // Dropping the table takes it out of the publication: the later rows never see it.
    env.client
        .batch_execute(&format!("DROP TABLE {TABLE}"))
        .await
        .context("dropping the framework-shape table")?;
    Ok(out)
}

async fn shape_run(env: &Env, shape: Shape, rows: u64, mif: usize) -> Result<ShapeRun> {
    env.client
        .batch_execute(&format!("TRUNCATE {TABLE}"))
        .await?;
    reset(env).await?;
    let before = insert_lsn(&env.client).await?;
    let (inside_last, end, write_secs) =
        write_backlog_with(env, rows, SHAPES_PER_TX, shape.rows_sql()).await?;
    let mapping = shape.mapping();
    let setup = CatchUpConfig {
        relay: &mapping,
        ..Default::default()
    };
    let bin = &env.relay_bin;
    let relay = relay_catch_up_with(env, bin, shape.variant(), mif, rows, inside_last, &setup)
        .await
        .with_context(|| format!("catch-up of the {}", shape.label()))?
        .run;
    say(format!(
        "   {}: written in {write_secs:.1} s ({:.0} MB WAL), relayed at {:.0} events/s ({:.2} s, {:.2} CPU s)",
        shape.label(),
        (end - before) as f64 / 1e6,
        relay.events_per_s,
        relay.secs,
        relay.cpu_secs
    ));
    Ok(ShapeRun {
        shape,
        rows,
        write_secs,
        wal_bytes: end - before,
        relay,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_framework_shape_maps_the_cap_table_its_own_way() {
        assert_eq!(Shape::Plain.mapping(), "", "the default mapping");
        for shape in [Shape::Levels, Shape::HeaderColumn, Shape::Envelope] {
            let mapping = shape.mapping();
            assert!(
                mapping.contains("table = \"public.framework_outbox\""),
                "{mapping}"
            );
            let sql = shape.rows_sql()(1, 100);
            assert!(sql.contains("generate_series(1, 100)"), "{sql}");
            assert!(
                !sql.contains("{PAYLOAD}") && !sql.contains("{HEADERS}"),
                "{sql}"
            );
        }
        assert!(
            Shape::Envelope
                .mapping()
                .contains("payload_pointer = \"/Value\"")
        );
        assert!(Shape::Envelope.rows_sql()(1, 1).contains("'Headers', json_build_object"));
        assert!(
            Shape::HeaderColumn
                .mapping()
                .contains("headers_json = \"Headers\"")
        );
        assert!(Shape::Levels.mapping().contains("{levels:Name}"));
    }
}
