//! Retention sweeps, run by the leader on a schedule (`operator --sweep-interval-seconds`,
//! the chart's `retention` values): thread state that outlived the deployment's state
//! retention and memory records whose retention policy expired them. Each store sweep
//! ends with its own audit record (`retention.sweep`, `memory.sweep`) holding the
//! counts; this loop adds the metrics and a log line per sweep.
//!
//! Only the leader sweeps, so two replicas never race on the same deletes; a sweep
//! interrupted by a crash or a lost lease is simply repeated by the next leader (a
//! sweep deletes what is expired at its own clock and nothing else: idempotent).

use std::{sync::Arc, time::Duration};

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

use crate::store::{RetentionPolicy, Store, SweepReport, memory::MemorySweepReport};

/// What the leader sweeps and how often.
#[derive(Clone, Debug, PartialEq)]
pub struct RetentionSchedule {
    /// Time between the end of one sweep and the start of the next.
    pub every: Duration,
    /// Thread-state retention (`id` names it in the audit record).
    pub state: RetentionPolicy,
}

impl RetentionSchedule {
    /// The schedule from the operator's flags; `None` when sweeping is off
    /// (`--sweep-interval-seconds 0`). Refuses a pending TTL of zero (a commit in flight
    /// would lose its pending write).
    pub fn from_flags(
        every_seconds: u64,
        pending_ttl_seconds: u64,
        conversation_ttl_seconds: Option<u64>,
    ) -> Result<Option<Self>, String> {
        if every_seconds == 0 {
            return Ok(None);
        }
        if pending_ttl_seconds == 0 {
            return Err("--pending-ttl-seconds must be at least 1".into());
        }
        if conversation_ttl_seconds == Some(0) {
            return Err(
                "--conversation-ttl-seconds must be at least 1 (omit it to keep thread state)"
                    .into(),
            );
        }
        let ms = |s: u64| i64::try_from(s.saturating_mul(1000)).unwrap_or(i64::MAX);
        Ok(Some(RetentionSchedule {
            every: Duration::from_secs(every_seconds),
            state: RetentionPolicy {
                id: "deployment".into(),
                pending_ttl_ms: ms(pending_ttl_seconds),
                conversation_ttl_ms: conversation_ttl_seconds.map(ms),
            },
        }))
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SweepLabels {
    kind: String,
    result: String,
}

/// `harness_engine_retention_*` on the admin port.
#[derive(Clone, Default)]
pub struct RetentionMetrics {
    sweeps: Family<SweepLabels, Counter>,
    deleted: Family<KindLabels, Counter>,
    last_success: Family<KindLabels, Gauge>,
}

impl RetentionMetrics {
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("retention");
        r.register(
            "sweeps",
            "Retention sweeps by kind (state, memory) and result (ok, error)",
            self.sweeps.clone(),
        );
        r.register(
            "deleted",
            "Rows deleted by retention sweeps: kind state (pending writes, bindings, \
             states, objects, stream entries) or memory (expired records)",
            self.deleted.clone(),
        );
        r.register(
            "last_success_timestamp_seconds",
            "Unix time of the last sweep that succeeded, by kind",
            self.last_success.clone(),
        );
    }

    fn sweep(&self, kind: &str, ok: bool) {
        self.sweeps
            .get_or_create(&SweepLabels {
                kind: kind.into(),
                result: if ok { "ok" } else { "error" }.into(),
            })
            .inc();
        if ok {
            self.last_success
                .get_or_create(&KindLabels { kind: kind.into() })
                .set(chrono_seconds());
        }
    }

    fn deleted(&self, kind: &str, n: u64) {
        self.deleted
            .get_or_create(&KindLabels { kind: kind.into() })
            .inc_by(n);
    }
}

fn chrono_seconds() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// Rows a state sweep deleted, all kinds together.
pub fn state_rows(report: &SweepReport) -> u64 {
    report.pending_states_deleted
        + report.bindings_deleted
        + report.states_deleted
        + report.objects_deleted
        + report.stream_entries_deleted
}

/// One sweep of state and of memory. A failure of one does not skip the other.
pub async fn sweep_once(
    store: &dyn Store,
    schedule: &RetentionSchedule,
    metrics: &RetentionMetrics,
    now_ms: i64,
) -> (
    crate::store::Result<SweepReport>,
    crate::store::Result<MemorySweepReport>,
) {
    let state = store.sweep(&schedule.state, now_ms).await;
    metrics.sweep("state", state.is_ok());
    match &state {
        Ok(r) => {
            metrics.deleted("state", state_rows(r));
            tracing::info!(
                policy = %r.policy_id,
                pending = r.pending_states_deleted,
                bindings = r.bindings_deleted,
                states = r.states_deleted,
                objects = r.objects_deleted,
                stream_entries = r.stream_entries_deleted,
                "retention sweep of thread state done"
            );
        }
        Err(error) => tracing::error!(%error, "retention sweep of thread state failed"),
    }
    let memory = store.sweep_memory(now_ms).await;
    metrics.sweep("memory", memory.is_ok());
    match &memory {
        Ok(r) => {
            metrics.deleted("memory", r.expired);
            tracing::info!(
                expired = r.expired,
                by_policy = ?r.by_policy,
                "retention sweep of memory done"
            );
        }
        Err(error) => tracing::error!(%error, "retention sweep of memory failed"),
    }
    (state, memory)
}

/// The leader's loop: a sweep at once, then one every `schedule.every`, until `stop`.
pub async fn run(
    store: Arc<dyn Store>,
    schedule: RetentionSchedule,
    metrics: RetentionMetrics,
    stop: impl std::future::Future<Output = ()>,
) {
    let mut stop = std::pin::pin!(stop);
    tracing::info!(
        every_seconds = schedule.every.as_secs(),
        pending_ttl_seconds = schedule.state.pending_ttl_ms / 1000,
        conversation_ttl_seconds = ?schedule.state.conversation_ttl_ms.map(|ms| ms / 1000),
        "retention sweeps scheduled on this leader"
    );
    loop {
        let now_ms = crate::store::now_ms();
        tokio::select! {
            _ = sweep_once(store.as_ref(), &schedule, &metrics, now_ms) => {}
            () = &mut stop => return,
        }
        tokio::select! {
            () = tokio::time::sleep(schedule.every) => {}
            () = &mut stop => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_turn_into_a_schedule_or_a_clear_refusal() {
        assert_eq!(RetentionSchedule::from_flags(0, 1, None), Ok(None));
        let s = RetentionSchedule::from_flags(3600, 86_400, Some(90 * 86_400))
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|| panic!("on"));
        assert_eq!(s.every, Duration::from_secs(3600));
        assert_eq!(s.state.pending_ttl_ms, 86_400_000);
        assert_eq!(s.state.conversation_ttl_ms, Some(7_776_000_000));
        assert!(
            RetentionSchedule::from_flags(60, 0, None)
                .unwrap_err()
                .contains("--pending-ttl-seconds")
        );
        assert!(
            RetentionSchedule::from_flags(60, 10, Some(0))
                .unwrap_err()
                .contains("--conversation-ttl-seconds")
        );
    }
}
