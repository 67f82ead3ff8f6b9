//! Leader election on a `coordination.k8s.io/v1` Lease, the way Kubernetes' own
//! controllers do it: the holder renews `renewTime` with a compare-and-set on
//! `resourceVersion`; anyone may take over a lease whose `renewTime` is older than
//! `leaseDurationSeconds`.
//!
//! A leader must stop acting before anyone else can start. Another replica may take the
//! lease once `leaseDurationSeconds` have passed since our last `renewTime`, so a leader
//! that has not renewed within the shorter *renew deadline* (measured on its monotonic
//! clock from the moment it sent the renewal that succeeded) stops leading: [`Leadership`]
//! turns false, the controllers stop acting at their next step, and the process exits
//! (its supervisor restarts it as a follower). Every election call is bounded by a
//! timeout, so a hung API server cannot hold a renewal past the deadline. A leader that
//! was paused (SIGSTOP, a frozen VM) finds on resuming that its deadline has passed and
//! acts no more; what it had in flight is fenced by the status compare-and-set and the
//! store's lease generation.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
    jiff::{SignedDuration, Timestamp},
};
use kube::{
    Api, Client,
    api::{PostParams, ResourceExt},
};

#[derive(Clone, Debug)]
pub struct LeaderConfig {
    /// `false` runs the controllers without election (a single replica, tests).
    pub enabled: bool,
    pub namespace: String,
    pub name: String,
    /// This replica's identity (pod name and a random suffix).
    pub identity: String,
    pub lease_duration: Duration,
    /// A leader that has not renewed for this long stops acting (shorter than
    /// `lease_duration`, so it stops before another replica may take over).
    pub renew_deadline: Duration,
    pub renew_every: Duration,
    pub retry_every: Duration,
    /// Bound on each election attempt (a read and a write of the Lease).
    pub call_timeout: Duration,
}

impl LeaderConfig {
    /// The timings for a lease of `lease_duration`: renew deadline two thirds of it (as
    /// Kubernetes' own controllers: 10 s of 15 s), a renewal every fifth (at least
    /// 200 ms), each attempt bounded by half the deadline (and by what is left of it).
    pub fn timings(lease_duration: Duration) -> (Duration, Duration, Duration, Duration) {
        let renew_deadline = lease_duration * 2 / 3;
        let renew_every = (lease_duration / 5).max(Duration::from_millis(200));
        let retry_every = (lease_duration / 5).max(Duration::from_millis(500));
        let call_timeout = renew_deadline / 2;
        (renew_deadline, renew_every, retry_every, call_timeout)
    }
}

/// Whether this replica may act as the leader now: it renewed the lease less than the
/// renew deadline ago. Cloned into the controllers, which check it before each step
/// that writes.
#[derive(Clone, Debug)]
pub struct Leadership {
    inner: Arc<Mutex<Option<Instant>>>,
    deadline: Option<Duration>,
}

impl Leadership {
    /// A replica without election (one replica, tests): always leading.
    pub fn unconditional() -> Self {
        Leadership {
            inner: Arc::new(Mutex::new(None)),
            deadline: None,
        }
    }

    fn elected(deadline: Duration) -> Self {
        Leadership {
            inner: Arc::new(Mutex::new(None)),
            deadline: Some(deadline),
        }
    }

    /// True while the last successful renewal was sent less than the deadline ago.
    pub fn is_current(&self) -> bool {
        let Some(deadline) = self.deadline else {
            return true;
        };
        let renewed = *self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        leading_at(renewed, deadline, Instant::now())
    }

    fn renewed(&self, sent: Instant) {
        let mut last = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *last = Some(last.map_or(sent, |l| l.max(sent)));
    }

    fn last_renewed(&self) -> Option<Instant> {
        *self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn lose(&self) {
        *self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
    }
}

/// The rule itself: leading at `now` only if a renewal sent at `renewed` is younger
/// than `deadline`.
fn leading_at(renewed: Option<Instant>, deadline: Duration, now: Instant) -> bool {
    renewed.is_some_and(|at| now.saturating_duration_since(at) < deadline)
}

pub struct Elector {
    api: Api<Lease>,
    config: LeaderConfig,
    leadership: Leadership,
}

fn now() -> MicroTime {
    MicroTime(Timestamp::now())
}

impl Elector {
    pub fn new(client: Client, config: LeaderConfig) -> Self {
        let leadership = if config.enabled {
            Leadership::elected(config.renew_deadline)
        } else {
            Leadership::unconditional()
        };
        Elector {
            api: Api::namespaced(client, &config.namespace),
            config,
            leadership,
        }
    }

    /// The handle the controllers check before acting.
    pub fn leadership(&self) -> Leadership {
        self.leadership.clone()
    }

    /// One attempt, bounded by `limit`; a renewal that succeeds counts from when it was
    /// sent.
    async fn attempt(&self, limit: Duration) -> Result<bool, String> {
        let sent = Instant::now();
        match tokio::time::timeout(limit, self.try_acquire_or_renew()).await {
            Ok(Ok(true)) => {
                self.leadership.renewed(sent);
                Ok(true)
            }
            Ok(Ok(false)) => Ok(false),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("no answer within {} ms", limit.as_millis())),
        }
    }

    fn spec(&self, transitions: i32, acquired: Option<MicroTime>) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.config.identity.clone()),
            lease_duration_seconds: Some(
                i32::try_from(self.config.lease_duration.as_secs().max(1)).unwrap_or(i32::MAX),
            ),
            acquire_time: acquired.or_else(|| Some(now())),
            renew_time: Some(now()),
            lease_transitions: Some(transitions),
            ..Default::default()
        }
    }

    /// One attempt to acquire or renew. `Ok(true)` while we hold the lease.
    pub async fn try_acquire_or_renew(&self) -> kube::Result<bool> {
        let name = &self.config.name;
        let Some(lease) = self.api.get_opt(name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    ..Default::default()
                },
                spec: Some(self.spec(0, None)),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                Err(e) => Err(e),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().unwrap_or_default();
        let ours = holder == self.config.identity;
        let expired = {
            let duration =
                SignedDuration::from_secs(i64::from(spec.lease_duration_seconds.unwrap_or(15)));
            spec.renew_time.as_ref().is_none_or(|t| {
                t.0.checked_add(duration)
                    .is_ok_and(|end| end < Timestamp::now())
            })
        };
        if !ours && !holder.is_empty() && !expired {
            return Ok(false);
        }
        let transitions = spec.lease_transitions.unwrap_or(0) + i32::from(!ours);
        let mut next = lease.clone();
        next.spec = Some(self.spec(
            transitions,
            if ours {
                spec.acquire_time.clone()
            } else {
                None
            },
        ));
        match self
            .api
            .replace(&lease.name_any(), &PostParams::default(), &next)
            .await
        {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Waits until this replica leads.
    pub async fn acquire(&self) {
        loop {
            match self.attempt(self.config.call_timeout).await {
                Ok(true) => return,
                Ok(false) => {}
                Err(e) => tracing::warn!(lease = %self.config.name, "leader election: {e}"),
            }
            tokio::time::sleep(self.config.retry_every).await;
        }
    }

    /// Renews until this replica can no longer lead: another holder took the lease, or
    /// no renewal succeeded within the renew deadline. Then [`Leadership`] is false and
    /// it returns (the caller must stop leading).
    pub async fn hold(&self) {
        let deadline = self.config.renew_deadline;
        loop {
            tokio::time::sleep(self.config.renew_every).await;
            loop {
                let left = self
                    .leadership
                    .last_renewed()
                    .map_or(Duration::ZERO, |at| deadline.saturating_sub(at.elapsed()));
                if left.is_zero() {
                    tracing::warn!(
                        lease = %self.config.name,
                        deadline_ms = deadline.as_millis(),
                        "could not renew the leader lease within the renew deadline: stopping"
                    );
                    self.leadership.lose();
                    return;
                }
                match self.attempt(left.min(self.config.call_timeout)).await {
                    Ok(true) => break,
                    Ok(false) => {
                        tracing::warn!(lease = %self.config.name, "another replica took the leader lease");
                        self.leadership.lose();
                        return;
                    }
                    Err(e) => {
                        tracing::warn!(lease = %self.config.name, "renewing the leader lease: {e}");
                        tokio::time::sleep(self.config.retry_every.min(left)).await;
                    }
                }
            }
        }
    }

    /// Gives the lease up on a clean shutdown so the next leader need not wait.
    pub async fn release(&self) {
        if let Ok(Some(lease)) = self.api.get_opt(&self.config.name).await
            && lease
                .spec
                .as_ref()
                .and_then(|s| s.holder_identity.as_deref())
                == Some(self.config.identity.as_str())
        {
            let mut next = lease.clone();
            if let Some(spec) = next.spec.as_mut() {
                spec.holder_identity = None;
                spec.lease_duration_seconds = Some(1);
            }
            let _ = self
                .api
                .replace(&lease.name_any(), &PostParams::default(), &next)
                .await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leader_stops_at_the_renew_deadline_before_the_lease_can_pass() {
        let lease = Duration::from_secs(15);
        let (deadline, renew_every, _, call_timeout) = LeaderConfig::timings(lease);
        assert_eq!(deadline, Duration::from_secs(10));
        assert!(
            renew_every + call_timeout < deadline,
            "a failed renewal leaves time to retry"
        );
        let t0 = Instant::now();
        assert!(
            !leading_at(None, deadline, t0),
            "never renewed: not leading"
        );
        assert!(leading_at(Some(t0), deadline, t0 + Duration::from_secs(9)));
        // Resumed after a pause longer than the deadline: no longer leading, though no
        // renewal has failed yet, and well before another replica may take the lease.
        assert!(!leading_at(Some(t0), deadline, t0 + deadline));
        assert!(deadline < lease);
        let short = LeaderConfig::timings(Duration::from_secs(2));
        assert!(
            short.0 < Duration::from_secs(2) && short.1 + short.3 < short.0,
            "{short:?}"
        );
    }

    #[test]
    fn leadership_follows_renewals_and_loss() {
        let l = Leadership::elected(Duration::from_secs(10));
        assert!(!l.is_current());
        let sent = Instant::now();
        l.renewed(sent);
        assert!(l.is_current());
        // An older renewal finishing late never moves the clock back.
        l.renewed(sent.checked_sub(Duration::from_secs(60)).unwrap_or(sent));
        assert!(l.is_current());
        l.lose();
        assert!(!l.is_current());
        assert!(Leadership::unconditional().is_current());
    }
}
