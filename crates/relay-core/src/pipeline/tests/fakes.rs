//! The fakes and fixtures the pipeline tests run on.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Mutex;

use bytes::Bytes;
use pgoutput::{Column, Insert, Relation, TupleData, TupleValue};

use super::super::*;
use crate::route::OutboxTableConfig;
use crate::stage::{
    AckCheck, ErrorClass, PositionAnchor, PubReceipt, PublishError, PublishErrorKind, SourceError,
    StoreError,
};

pub(super) const OUTBOX: u32 = 100;
pub(super) const OTHER: u32 = 200;

pub(super) fn relation(id: u32, name: &str, cols: &[&str]) -> SourceEvent {
    SourceEvent::Message(LogicalMessage::Relation(Relation {
        id,
        namespace: "public".into(),
        name: name.into(),
        replica_identity: b'd',
        columns: cols
            .iter()
            .map(|c| Column {
                flags: 0,
                name: (*c).into(),
                type_oid: 25,
                type_modifier: -1,
            })
            .collect(),
    }))
}

pub(super) fn row(values: &[&str]) -> TupleData {
    TupleData {
        values: values
            .iter()
            .map(|v| TupleValue::Text(Bytes::copy_from_slice(v.as_bytes())))
            .collect(),
    }
}

pub(super) fn outbox_insert(id: &str) -> SourceEvent {
    SourceEvent::Message(LogicalMessage::Insert(Insert {
        relation_id: OUTBOX,
        new: row(&[id, "Order", "1", "Created", "{}"]),
    }))
}

pub(super) fn begin(n: u64) -> SourceEvent {
    SourceEvent::Begin {
        xid: n as u32,
        final_lsn: Lsn(n * 1000 - 10),
        commit_time_micros: 0,
    }
}

pub(super) fn commit(n: u64) -> SourceEvent {
    SourceEvent::Commit {
        commit_lsn: Lsn(n * 1000 - 10),
        end_lsn: Lsn(n * 1000),
    }
}

/// Transaction `n` (end LSN n*1000) holding outbox events `ids`.
pub(super) fn tx(n: u64, ids: &[&str]) -> Vec<SourceEvent> {
    let mut v = vec![begin(n)];
    v.extend(ids.iter().map(|id| outbox_insert(id)));
    v.push(commit(n));
    v
}

pub(super) fn preamble() -> Vec<SourceEvent> {
    vec![
        relation(
            OUTBOX,
            "outbox",
            &["id", "aggregatetype", "aggregateid", "type", "payload"],
        ),
        relation(OTHER, "orders", &["id"]),
    ]
}

pub(super) struct ScriptedSource {
    pub(super) events: VecDeque<SourceEvent>,
    pub(super) confirmed: Arc<Mutex<Vec<Lsn>>>,
    /// Error to return once the script is exhausted instead of ending.
    pub(super) then_fail: bool,
    pub(super) keepalive_due: Option<Instant>,
}

impl ChangeSource for ScriptedSource {
    async fn next(&mut self) -> Result<Option<SourceEvent>, SourceError> {
        if let Some(SourceEvent::KeepAlive { .. }) = self.events.front() {
            // Servers send keepalives on a timer; let time pass first. The deadline survives a
            // cancelled call, and the event is popped only after it.
            let due = *self
                .keepalive_due
                .get_or_insert_with(|| Instant::now() + Duration::from_millis(100));
            tokio::time::sleep_until(due).await;
            self.keepalive_due = None;
        }
        match self.events.pop_front() {
            Some(e) => Ok(Some(e)),
            None if self.then_fail => Err(SourceError::new(ErrorClass::Transient, "lost")),
            None => Ok(None),
        }
    }
    fn confirm(&mut self, lsn: Lsn) {
        self.confirmed.lock().unwrap().push(lsn);
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Fault {
    /// Stored, but the ack is lost: the publisher reports an unknown outcome.
    FailAfterWrite,
    /// Lost before the broker stored it: the publisher reports an unknown outcome.
    FailBeforeWrite,
    /// Refused for good.
    Reject,
    /// Refused for lack of room: nothing stored.
    Full,
    /// Not stored, and answered "stored at sequence 999999" by someone who is not JetStream
    /// (a forged PubAck).
    Forged,
}

#[derive(Default)]
pub(super) struct BrokerState {
    /// Stored messages in stream order, deduplicated by event id.
    pub(super) stream: Vec<OutboundMessage>,
    pub(super) ids: HashSet<String>,
    pub(super) faults: HashMap<String, VecDeque<Fault>>,
    /// Ack delay per event id (default 1 ms).
    pub(super) delays: HashMap<String, Duration>,
    pub(super) outstanding: usize,
    pub(super) max_outstanding: usize,
    pub(super) sends: usize,
    /// Sends refused because `after` was not the stream's last message.
    pub(super) out_of_turn: usize,
    /// Stores each message when its ack is due, not when it is sent, and checks no `after`: a
    /// broker whose stream order follows ack timing (as batches of a publish mode that makes
    /// no condition, or copies from an earlier session), for tests of a stream out of order.
    pub(super) stores_on_ack: bool,
    /// What the publisher heard, in call order: `begin`, `send <id>` and `end`.
    pub(super) calls: Vec<String>,
}

impl BrokerState {
    /// Stores `msg` as JetStream would: a duplicate is answered with its first copy's sequence
    /// before any condition is checked; then `after` must be the last message stored.
    fn store(
        &mut self,
        msg: &OutboundMessage,
        after: Option<&str>,
    ) -> Result<PubReceipt, PublishError> {
        if let Some(i) = self.stream.iter().position(|m| m.event_id == msg.event_id) {
            return Ok(PubReceipt {
                stream_seq: i as u64 + 1,
                duplicate: true,
            });
        }
        if let Some(after) = after
            && self.stream.last().map(|m| m.event_id.as_str()) != Some(after)
        {
            self.out_of_turn += 1;
            return Err(PublishError::new(
                PublishErrorKind::OutOfTurn,
                format!("wrong last msg id: expected {after}"),
            ));
        }
        self.ids.insert(msg.event_id.clone());
        self.stream.push(msg.clone());
        Ok(PubReceipt {
            stream_seq: self.stream.len() as u64,
            duplicate: false,
        })
    }
}

#[derive(Clone, Default)]
pub(super) struct FakeBroker(pub(super) Arc<Mutex<BrokerState>>);

impl FakeBroker {
    /// A broker that stores in ack order and ignores `after` (see
    /// [`BrokerState::stores_on_ack`]).
    pub(super) fn storing_on_ack() -> Self {
        let broker = Self::default();
        broker.0.lock().unwrap().stores_on_ack = true;
        broker
    }

    /// A broker that acknowledges event `id` only after `delay`.
    pub(super) fn with_delay(id: &str, delay: Duration) -> Self {
        let broker = Self::default();
        broker.0.lock().unwrap().delays.insert(id.into(), delay);
        broker
    }
}

impl Publisher for FakeBroker {
    type Ack = futures::future::BoxFuture<'static, Result<PubReceipt, PublishError>>;

    /// As JetStream's state would say: the stream's last sequence is its length.
    fn check_acks(&self, highest_seq: u64) -> impl Future<Output = AckCheck> + Send + 'static {
        let last = self.0.lock().unwrap().stream.len() as u64;
        std::future::ready(if highest_seq <= last {
            AckCheck::Held
        } else {
            AckCheck::NotHeld(format!("last sequence {last}"))
        })
    }

    /// Stores (or loses) the message when it is sent, in send order like a server reading one
    /// connection, and answers after the event's delay. `after` is checked like
    /// `Nats-Expected-Last-Msg-Id`, after the duplicate check as in nats-server.
    async fn send(
        &self,
        msg: &Arc<OutboundMessage>,
        after: Option<&str>,
    ) -> Result<Self::Ack, PublishError> {
        let state = self.0.clone();
        let msg = OutboundMessage::clone(msg);
        let (delay, outcome) = {
            let mut s = state.lock().unwrap();
            s.calls.push(format!("send {}", msg.event_id));
            s.sends += 1;
            s.outstanding += 1;
            s.max_outstanding = s.max_outstanding.max(s.outstanding);
            let fault = s.faults.get_mut(&msg.event_id).and_then(|q| q.pop_front());
            let delay = s.delays.get(&msg.event_id).copied();
            let after = if s.stores_on_ack { None } else { after };
            let outcome = match fault {
                Some(Fault::Reject) => {
                    Err(PublishError::new(PublishErrorKind::Rejected, "too big"))
                }
                Some(Fault::FailBeforeWrite) => {
                    Err(PublishError::new(PublishErrorKind::Unknown, "timed out"))
                }
                Some(Fault::Full) => Err(PublishError::new(
                    PublishErrorKind::StreamFull,
                    "maximum messages exceeded",
                )),
                Some(Fault::Forged) => Ok((
                    PubReceipt {
                        stream_seq: 999_999,
                        duplicate: false,
                    },
                    None,
                )),
                _ if s.stores_on_ack => Ok((
                    PubReceipt {
                        stream_seq: 0,
                        duplicate: false,
                    },
                    fault,
                )),
                _ => s.store(&msg, after).map(|receipt| (receipt, fault)),
            };
            (delay.unwrap_or(Duration::from_millis(1)), outcome)
        };
        Ok(Box::pin(async move {
            tokio::time::sleep(delay).await;
            let mut s = state.lock().unwrap();
            s.outstanding -= 1;
            let outcome = match outcome {
                Ok((_, fault)) if s.stores_on_ack && fault != Some(Fault::FailBeforeWrite) => {
                    (s.store(&msg, None)?, fault)
                }
                outcome => outcome?,
            };
            match outcome {
                (_, Some(Fault::FailAfterWrite)) => Err(PublishError::new(
                    PublishErrorKind::Unknown,
                    "ack timed out",
                )),
                (receipt, _) => Ok(receipt),
            }
        }))
    }

    fn stream_name(&self) -> Option<Arc<str>> {
        Some("OUTBOX".into())
    }

    fn begin_transaction(&self, _commit_lsn: Lsn) {
        self.0.lock().unwrap().calls.push("begin".into());
    }

    fn end_transaction(&self) {
        self.0.lock().unwrap().calls.push("end".into());
    }

    fn hold(&self) {}

    async fn resend(
        &self,
        msg: &Arc<OutboundMessage>,
        after: Option<&str>,
    ) -> Result<Self::Ack, PublishError> {
        self.send(msg, after).await
    }
}

/// A list the test and the store share.
pub(super) type Shared<T> = Arc<Mutex<Vec<T>>>;

/// Checks the delivery rule on every save: every event of every transaction ending at or
/// before the saved LSN is in the broker.
pub(super) struct CheckingStore {
    pub(super) broker: FakeBroker,
    /// (where a restart starts skipping the transaction: the start of its commit record,
    /// `commit_lsn`; its event ids). PostgreSQL skips a transaction whose commit record starts
    /// before the position it resumes from, so a save past that needs every event acked.
    pub(super) txs: Vec<(Lsn, Vec<String>)>,
    pub(super) saved: Arc<Mutex<Vec<Lsn>>>,
    /// The anchor passed with each save, by checkpoint, and the stream then (commit LSN and
    /// event id of each message, in stream order).
    pub(super) anchors: Shared<(Lsn, Option<PositionAnchor>)>,
    pub(super) streams: Shared<Vec<(Lsn, String)>>,
}

impl CheckpointStore for CheckingStore {
    async fn load(&mut self) -> Result<Option<Lsn>, StoreError> {
        Ok(self.saved.lock().unwrap().last().copied())
    }
    async fn save_with_anchor(
        &mut self,
        lsn: Lsn,
        anchor: Option<PositionAnchor>,
    ) -> Result<(), StoreError> {
        self.anchors.lock().unwrap().push((lsn, anchor));
        let stream = {
            let broker = self.broker.0.lock().unwrap();
            let stream = broker.stream.iter();
            stream.map(|m| (m.commit_lsn, m.event_id.clone())).collect()
        };
        self.streams.lock().unwrap().push(stream);
        self.save(lsn).await
    }
    async fn save(&mut self, lsn: Lsn) -> Result<(), StoreError> {
        let broker = self.broker.0.lock().unwrap();
        for (skipped_from, ids) in &self.txs {
            if *skipped_from < lsn {
                for id in ids {
                    // A dead letter (the raw row) stands in for the event it parks.
                    let parked = || {
                        broker.stream.iter().any(|m| {
                            m.header(HEADER_DLQ_REASON).is_some()
                                && serde_json::from_slice::<serde_json::Value>(&m.payload)
                                    .is_ok_and(|row| row["id"] == id.as_str())
                        })
                    };
                    assert!(
                        broker.ids.contains(id) || parked(),
                        "saved {lsn} before event {id} was acked"
                    );
                }
            }
        }
        self.saved.lock().unwrap().push(lsn);
        Ok(())
    }
}

pub(super) struct Harness {
    pub(super) broker: FakeBroker,
    pub(super) saved: Arc<Mutex<Vec<Lsn>>>,
    pub(super) anchors: Shared<(Lsn, Option<PositionAnchor>)>,
    pub(super) streams: Shared<Vec<(Lsn, String)>>,
    pub(super) confirmed: Arc<Mutex<Vec<Lsn>>>,
    pub(super) stats: Arc<PipelineStats>,
}

pub(super) async fn run_script(
    events: Vec<SourceEvent>,
    broker: FakeBroker,
    config: PipelineConfig,
    then_fail: bool,
) -> (Result<RunOutcome, PipelineError>, Harness) {
    run_script_skipping(events, broker, config, then_fail, HashSet::new()).await
}

/// As [`run_script`], with event ids the stream already holds.
pub(super) async fn run_script_skipping(
    events: Vec<SourceEvent>,
    broker: FakeBroker,
    config: PipelineConfig,
    then_fail: bool,
    already_published: HashSet<String>,
) -> (Result<RunOutcome, PipelineError>, Harness) {
    let at = already_published.into_iter().map(|id| (id, 0)).collect();
    run_script_skipping_at(events, broker, config, then_fail, at).await
}

/// As [`run_script_skipping`], with the sequence each is found at (0: not known).
pub(super) async fn run_script_skipping_at(
    events: Vec<SourceEvent>,
    broker: FakeBroker,
    config: PipelineConfig,
    then_fail: bool,
    already_published: HashMap<String, u64>,
) -> (Result<RunOutcome, PipelineError>, Harness) {
    run_script_with(events, broker, config, then_fail, already_published, None).await
}

/// As [`run_script_skipping_at`], confirming to the source what `trail` gives (`[relay]
/// replay_retention`).
pub(super) async fn run_script_with(
    events: Vec<SourceEvent>,
    broker: FakeBroker,
    config: PipelineConfig,
    then_fail: bool,
    already_published: HashMap<String, u64>,
    trail: Option<crate::trail::SlotTrail>,
) -> (Result<RunOutcome, PipelineError>, Harness) {
    // Work out each transaction's events for the checking store.
    let mut txs = Vec::new();
    let mut current = Vec::new();
    for e in &events {
        match e {
            SourceEvent::Begin { .. } => current.clear(),
            SourceEvent::Message(LogicalMessage::Insert(i)) if i.relation_id == OUTBOX => {
                if let Some(TupleValue::Text(id)) = i.new.values.first()
                    && !id.is_empty()
                {
                    current.push(String::from_utf8_lossy(id).into_owned());
                }
            }
            SourceEvent::Commit { commit_lsn, .. } => txs.push((*commit_lsn, current.clone())),
            _ => {}
        }
    }
    let saved = Arc::new(Mutex::new(Vec::new()));
    let anchors = Arc::new(Mutex::new(Vec::new()));
    let streams = Arc::new(Mutex::new(Vec::new()));
    let confirmed = Arc::new(Mutex::new(Vec::new()));
    let stats = Arc::new(PipelineStats::default());
    let source = ScriptedSource {
        events: events.into(),
        confirmed: confirmed.clone(),
        then_fail,
        keepalive_due: None,
    };
    let store = CheckingStore {
        broker: broker.clone(),
        txs,
        saved: saved.clone(),
        anchors: anchors.clone(),
        streams: streams.clone(),
    };
    let router = Router::new(&[OutboxTableConfig::with_defaults("public.outbox")]).unwrap();
    let mut pipeline = Pipeline::new(
        source,
        broker.clone(),
        store,
        router,
        Lsn(1),
        config,
        stats.clone(),
    );
    // By premise the stream already holds them.
    broker
        .0
        .lock()
        .unwrap()
        .ids
        .extend(already_published.keys().cloned());
    pipeline.skip_published(already_published);
    if let Some(trail) = trail {
        pipeline.trail_slot(trail);
    }
    let result = pipeline.run(std::future::pending()).await;
    (
        result,
        Harness {
            broker,
            saved,
            anchors,
            streams,
            confirmed,
            stats,
        },
    )
}

pub(super) fn stream_ids(h: &Harness) -> Vec<String> {
    h.broker
        .0
        .lock()
        .unwrap()
        .stream
        .iter()
        .map(|m| m.event_id.clone())
        .collect()
}
