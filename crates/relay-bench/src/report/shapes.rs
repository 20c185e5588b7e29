//! The framework-shape rows: each mapping shape's catch-up beside the plain Debezium row's.

use std::fmt::Write as _;

use crate::workload::{SHAPES_PER_TX, Shape, ShapeRun};

use super::modes::{Beside, cpu_us};

/// The catch-up the bench holds a framework shape to, against the plain shape's.
const RATIO_TARGET: f64 = 0.9;

/// One row per shape, each against the plain row of the same run.
pub(super) fn rows(out: &mut String, shapes: &[ShapeRun], startup_cpu: Option<f64>) {
    let plain = shapes.iter().find(|s| s.shape == Shape::Plain);
    for s in shapes {
        let name = format!(
            "**Framework shape, {}**, {} events in {SHAPES_PER_TX}-row txs (written in {:.1} s, {:.0} MB WAL)",
            s.shape.label(),
            s.rows,
            s.write_secs,
            s.wal_bytes as f64 / 1e6
        );
        let baseline = plain
            .filter(|_| s.shape != Shape::Plain)
            .map(|p| ("plain", &p.relay));
        let ratio = baseline.map(|(_, p)| s.relay.events_per_s / p.events_per_s);
        let cpu = cpu_us(&s.relay, s.rows, startup_cpu);
        let plain_cpu = plain.map(|p| cpu_us(&p.relay, p.rows, startup_cpu));
        let cpu_ratio = match (cpu, plain_cpu) {
            ((_, Some(mine)), Some((_, Some(theirs)))) if theirs > 0.0 => {
                format!("; CPU {:.2}x plain", mine / theirs)
            }
            ((mine, None), Some((theirs, None))) if theirs > 0.0 => {
                format!("; CPU {:.2}x plain", mine / theirs)
            }
            _ => String::new(),
        };
        let target = format!(">= {RATIO_TARGET}x plain catch-up");
        Beside {
            name: &name,
            note: &cpu_ratio,
            run: &s.relay,
            rows: s.rows,
            startup_cpu,
            baseline,
            target: if baseline.is_some() {
                &target
            } else {
                "baseline"
            },
            pass: ratio.is_none_or(|r| r >= RATIO_TARGET),
        }
        .row(out);
    }
}

/// How the framework-shape rows were measured, when they ran.
pub(super) fn note(out: &mut String, shapes: &[ShapeRun]) {
    if shapes.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "Framework shapes: each shape's backlog is written after a reset and caught up by one relay (timed as the catch-up rows), one shape after the other in this run. The plain row is the bench's `outbox` table with the default mapping; the others a CAP-shaped table `framework_outbox` (\"Id\" bigint, \"Name\" = 'orders.created', \"Content\" text, \"Headers\" text) holding the same ~300-byte body: `outbox.{{levels:Name}}` with the body in `Content`; `outbox.{{Name}}` with a 5-member JSON object in `Headers` as `headers_json`; and `Content` = {{\"Headers\": the 5 members, \"Value\": the body}} mapped by `payload_pointer = \"/Value\"` and `headers_json_pointer = \"/Headers\"` (subject `outbox.{{levels:Name}}`). CPU per event is the relay's; its ratio to the plain row is beside the run's seconds."
    );
}
