//! The run ledger on MongoDB (see [`crate::store::ledger`] for the contract).
//!
//! The head of a binding's ledger (epoch, last sequence, folded state, and the last
//! event itself, its "tail") lives in the binding's `harness_sessions` document, so an
//! append is one `findOneAndUpdate` whose filter holds the fence (epoch and lease
//! generation) and the expected last sequence: the fence check and the append are one
//! atomic single-document write. The events themselves are documents of
//! `harness_ledger` (`<binding>:<epoch>:e:<seq>`), copied from the tail by whoever next
//! touches the ledger ("materialized"): every append and every read first copies the
//! current tail (an insert that a duplicate key makes idempotent), so an event whose
//! appender died after its head write is never lost and never duplicated, and there is
//! no gap. Idempotency digests are documents too (`<binding>:<epoch>:k:<digest>`),
//! written with the event; a retry looks its digest up after materializing the tail,
//! and a racing append under the same key loses its compare-and-set and then finds it.

use futures::TryStreamExt;
use mongodb::bson::{Bson, Document, doc};

use super::{
    BACKEND, MongoContext, MongoStore, bindings::fence_filter, corrupt, int, is_duplicate_key,
    layout::dt, uint,
};
use crate::{
    domain::{
        ledger::{AppendRequest, LedgerEvent, LedgerState},
        state::StateScope,
    },
    store::{
        Result, StoreError,
        ledger::{Decision, LedgerAppend, LedgerSnapshot, decode, plan},
        now_ms,
    },
};

pub(super) const LEDGER: &str = "harness_ledger";

/// Compare-and-set rounds of one append before reporting a conflict (each lost round
/// means another append of the same binding won; without an expected sequence the
/// append simply goes after it).
const APPEND_ROUNDS: usize = 64;

fn prefix(scope: &StateScope, epoch: u64) -> String {
    format!("{}:{epoch}:", scope.binding_id.as_str())
}

fn event_doc_id(scope: &StateScope, epoch: u64, seq: u64) -> String {
    format!("{}e:{seq:020}", prefix(scope, epoch))
}

fn key_doc_id(scope: &StateScope, epoch: u64, digest: &str) -> String {
    format!("{}k:{digest}", prefix(scope, epoch))
}

fn snapshot_doc_id(scope: &StateScope, epoch: u64, seq: u64) -> String {
    format!("{}s:{seq:020}", prefix(scope, epoch))
}

/// The `ledger` field of a binding document.
struct Head {
    epoch: u64,
    last_seq: u64,
    state_json: String,
    tail: Option<(String, Option<String>)>,
}

fn u64_field(d: &Document, key: &str) -> Result<u64> {
    match d.get(key) {
        Some(Bson::Int64(v)) => uint("ledger field", *v),
        Some(Bson::Int32(v)) => uint("ledger field", i64::from(*v)),
        other => Err(corrupt("ledger head", format!("{key}: {other:?}"))),
    }
}

fn head_of(d: &Document) -> Result<Option<Head>> {
    let Some(Bson::Document(l)) = d.get("ledger") else {
        return Ok(None);
    };
    let state_json = l
        .get_str("state_json")
        .map_err(|e| corrupt("ledger head", e))?
        .to_owned();
    let tail = match l.get("tail_json") {
        Some(Bson::String(json)) => {
            Some((json.clone(), l.get_str("tail_key").ok().map(str::to_owned)))
        }
        _ => None,
    };
    Ok(Some(Head {
        epoch: u64_field(l, "epoch")?,
        last_seq: u64_field(l, "last_seq")?,
        state_json,
        tail,
    }))
}

fn event_of(json: &str) -> Result<LedgerEvent> {
    decode("ledger event", json).map_err(|e| corrupt("ledger event", e))
}

impl MongoStore {
    async fn ledger_head(&self, scope: &StateScope) -> Result<Option<Head>> {
        let found = self
            .sessions
            .find_one(doc! { "_id": scope.binding_id.as_str() })
            .projection(doc! { "ledger": 1 })
            .await
            .ctx("reading the ledger head")?;
        match found {
            Some(d) => head_of(&d),
            None => Ok(None),
        }
    }

    async fn insert_once(&self, document: Document, context: &'static str) -> Result<()> {
        match self.ledger.insert_one(document).await {
            Ok(_) => Ok(()),
            Err(e) if is_duplicate_key(&e) => Ok(()),
            Err(e) => Err(StoreError::backend(BACKEND, format!("{context}: {e}"))),
        }
    }

    /// Copies the head's last event (and its idempotency digest) into `harness_ledger`.
    async fn materialize(&self, scope: &StateScope, head: &Head) -> Result<()> {
        let Some((json, key)) = &head.tail else {
            return Ok(());
        };
        let event = event_of(json)?;
        self.insert_once(
            doc! {
                "_id": event_doc_id(scope, head.epoch, event.seq),
                "binding_id": scope.binding_id.as_str(),
                "epoch": int("epoch", head.epoch)?,
                "kind": "event",
                "seq": int("sequence", event.seq)?,
                "run_id": &event.run_id,
                "event_json": json,
            },
            "storing a ledger event",
        )
        .await?;
        if let Some(key) = key {
            self.insert_once(
                doc! {
                    "_id": key_doc_id(scope, head.epoch, key),
                    "binding_id": scope.binding_id.as_str(),
                    "epoch": int("epoch", head.epoch)?,
                    "kind": "key",
                    "event_json": json,
                },
                "storing a ledger idempotency key",
            )
            .await?;
        }
        Ok(())
    }

    /// The admitted head of the scope's epoch, materialized (`None`: no head document
    /// for any epoch yet).
    async fn admitted_head(&self, scope: &StateScope) -> Result<Option<Head>> {
        self.admit(scope).await?;
        let head = self.ledger_head(scope).await?;
        if let Some(head) = &head {
            self.materialize(scope, head).await?;
        }
        Ok(head)
    }

    pub(super) async fn append_event_impl(
        &self,
        scope: &StateScope,
        request: &AppendRequest,
    ) -> Result<LedgerAppend> {
        self.rate_check(&scope.binding_id)?;
        let _serial = self.exclusive(&scope.binding_id).await;
        for _ in 0..APPEND_ROUNDS {
            let head = self.admitted_head(scope).await?;
            let original = match &request.idempotency {
                None => None,
                Some(digest) => self
                    .ledger
                    .find_one(doc! { "_id": key_doc_id(scope, scope.epoch, digest) })
                    .await
                    .ctx("looking up the ledger idempotency key")?
                    .map(|d| {
                        d.get_str("event_json")
                            .map_err(|e| corrupt("ledger key", e))
                            .and_then(event_of)
                    })
                    .transpose()?,
            };
            let mut filter = fence_filter(scope)?;
            let state = match &head {
                None => {
                    filter.insert("ledger", doc! { "$exists": false });
                    LedgerState::default()
                }
                Some(h) => {
                    filter.insert("ledger.epoch", int("epoch", h.epoch)?);
                    filter.insert("ledger.last_seq", int("sequence", h.last_seq)?);
                    if h.epoch == scope.epoch {
                        decode("ledger head", &h.state_json)
                            .map_err(|e| corrupt("ledger head", e))?
                    } else {
                        LedgerState::default()
                    }
                }
            };
            let now = now_ms();
            let planned = match plan(
                &state,
                original,
                request,
                scope.binding_id.as_str(),
                scope.epoch,
                now,
            )? {
                Decision::Replay(event) => {
                    return Ok(LedgerAppend {
                        event: *event,
                        replayed: true,
                        signals: Default::default(),
                    });
                }
                Decision::Append(planned) => planned,
            };
            let tail_json =
                serde_json::to_string(&planned.event).map_err(|e| corrupt("ledger event", e))?;
            let state_json =
                serde_json::to_string(&planned.state).map_err(|e| corrupt("ledger head", e))?;
            let mut ledger = doc! {
                "epoch": int("epoch", scope.epoch)?,
                "last_seq": int("sequence", planned.event.seq)?,
                "state_json": state_json,
                "tail_json": &tail_json,
            };
            if let Some(key) = &request.idempotency {
                ledger.insert("tail_key", key.as_str());
            }
            let update = doc! { "$set": { "ledger": ledger, "last_activity_at": dt(now) } };
            let written = self
                .update_if(
                    &self.sessions,
                    filter,
                    update,
                    Self::matched_only(),
                    "appending to the ledger",
                )
                .await?;
            if written.is_some() {
                // Committed. Copying it out now is an optimization: the next reader or
                // appender does it otherwise.
                let head = Head {
                    epoch: scope.epoch,
                    last_seq: planned.event.seq,
                    state_json: String::new(),
                    tail: Some((tail_json, request.idempotency.clone())),
                };
                if let Err(e) = self.materialize(scope, &head).await {
                    eprintln!("harness-engine: materializing a ledger event later: {e}");
                }
                return Ok(LedgerAppend {
                    event: planned.event,
                    replayed: false,
                    signals: planned.signals,
                });
            }
            // The fence or the ledger moved: the next round re-reads both.
        }
        Err(crate::domain::state::Rejection::Conflict {
            what: "the ledger kept moving under this append; retry".into(),
        }
        .into())
    }

    /// Rebuilds the head from every event of the epoch with this server's reducer and
    /// writes it with a compare-and-set on the head's sequence and fence (an append that
    /// lands meanwhile makes it start over); the tail and the events are not touched.
    pub(super) async fn repair_ledger_impl(&self, scope: &StateScope) -> Result<LedgerState> {
        let _serial = self.exclusive(&scope.binding_id).await;
        for _ in 0..APPEND_ROUNDS {
            let Some(head) = self.admitted_head(scope).await? else {
                return Ok(LedgerState::default());
            };
            if head.epoch != scope.epoch {
                return Ok(LedgerState::default());
            }
            let mut state = LedgerState::default();
            loop {
                let page = self
                    .ledger_events_impl(scope, None, state.last_seq, 0)
                    .await?;
                let Some(last) = page.last().map(|e| e.seq) else {
                    break;
                };
                for event in page.iter().filter(|e| e.seq <= head.last_seq) {
                    state.apply(event);
                }
                if last >= head.last_seq {
                    break;
                }
            }
            if state.last_seq != head.last_seq {
                return Err(corrupt(
                    "ledger head",
                    format!(
                        "the events fold to sequence {} but the head is at {}",
                        state.last_seq, head.last_seq
                    ),
                ));
            }
            let state_json =
                serde_json::to_string(&state).map_err(|e| corrupt("ledger head", e))?;
            let mut filter = fence_filter(scope)?;
            filter.insert("ledger.epoch", int("epoch", head.epoch)?);
            filter.insert("ledger.last_seq", int("sequence", head.last_seq)?);
            let written = self
                .update_if(
                    &self.sessions,
                    filter,
                    doc! { "$set": { "ledger.state_json": state_json } },
                    Self::matched_only(),
                    "repairing the ledger head",
                )
                .await?;
            if written.is_some() {
                return Ok(state);
            }
        }
        Err(crate::domain::state::Rejection::Conflict {
            what: "the ledger kept moving under this repair; retry".into(),
        }
        .into())
    }

    pub(super) async fn ledger_events_impl(
        &self,
        scope: &StateScope,
        run_id: Option<&str>,
        after_seq: u64,
        limit: usize,
    ) -> Result<Vec<LedgerEvent>> {
        self.admitted_head(scope).await?;
        let mut filter = doc! {
            "binding_id": scope.binding_id.as_str(),
            "epoch": int("epoch", scope.epoch)?,
            "kind": "event",
            "seq": { "$gt": int("sequence", after_seq)? },
        };
        if let Some(run) = run_id {
            filter.insert("run_id", run);
        }
        let docs: Vec<Document> = self
            .ledger
            .find(filter)
            .sort(doc! { "seq": 1 })
            .limit(self.page(limit))
            .await
            .ctx("reading ledger events")?
            .try_collect()
            .await
            .ctx("reading ledger events")?;
        docs.iter()
            .map(|d| {
                d.get_str("event_json")
                    .map_err(|e| corrupt("ledger event", e))
                    .and_then(event_of)
            })
            .collect()
    }

    pub(super) async fn ledger_state_impl(&self, scope: &StateScope) -> Result<LedgerState> {
        match self.admitted_head(scope).await? {
            Some(h) if h.epoch == scope.epoch => {
                decode("ledger head", &h.state_json).map_err(|e| corrupt("ledger head", e))
            }
            _ => Ok(LedgerState::default()),
        }
    }

    pub(super) async fn snapshot_ledger_impl(&self, scope: &StateScope) -> Result<LedgerSnapshot> {
        let state = self.ledger_state_impl(scope).await?;
        let now = now_ms();
        let json = serde_json::to_string(&state).map_err(|e| corrupt("ledger head", e))?;
        self.insert_once(
            doc! {
                "_id": snapshot_doc_id(scope, scope.epoch, state.last_seq),
                "binding_id": scope.binding_id.as_str(),
                "epoch": int("epoch", scope.epoch)?,
                "kind": "snapshot",
                "seq": int("sequence", state.last_seq)?,
                "taken_at_ms": now,
                "state_json": json,
            },
            "storing a ledger snapshot",
        )
        .await?;
        self.ledger_snapshot_impl(scope)
            .await?
            .ok_or_else(|| corrupt("ledger snapshot", "missing after its write"))
    }

    pub(super) async fn ledger_snapshot_impl(
        &self,
        scope: &StateScope,
    ) -> Result<Option<LedgerSnapshot>> {
        self.admit(scope).await?;
        let found = self
            .ledger
            .find(doc! {
                "binding_id": scope.binding_id.as_str(),
                "epoch": int("epoch", scope.epoch)?,
                "kind": "snapshot",
            })
            .sort(doc! { "seq": -1 })
            .limit(1)
            .await
            .ctx("reading the ledger snapshot")?
            .try_next()
            .await
            .ctx("reading the ledger snapshot")?;
        found
            .map(|d| {
                let json = d
                    .get_str("state_json")
                    .map_err(|e| corrupt("ledger snapshot", e))?;
                Ok(LedgerSnapshot {
                    seq: u64_field(&d, "seq")?,
                    taken_at_ms: d.get_i64("taken_at_ms").unwrap_or(0),
                    state: decode("ledger snapshot", json)
                        .map_err(|e| corrupt("ledger snapshot", e))?,
                })
            })
            .transpose()
    }
}
