//! Leader election on a `coordination.k8s.io/v1` Lease, the way Kubernetes' own
//! controllers do it: the holder renews `renewTime` with a compare-and-set on
//! `resourceVersion`; anyone may take over a lease whose `renewTime` is older than
//! `leaseDurationSeconds`. A leader that cannot renew within the lease duration stops
//! leading (the process exits, and its supervisor restarts it as a follower).

use std::time::Duration;

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
    pub renew_every: Duration,
    pub retry_every: Duration,
}

pub struct Elector {
    api: Api<Lease>,
    config: LeaderConfig,
}

fn now() -> MicroTime {
    MicroTime(Timestamp::now())
}

impl Elector {
    pub fn new(client: Client, config: LeaderConfig) -> Self {
        Elector {
            api: Api::namespaced(client, &config.namespace),
            config,
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
            match self.try_acquire_or_renew().await {
                Ok(true) => return,
                Ok(false) => {}
                Err(e) => tracing::warn!("leader election: {e}"),
            }
            tokio::time::sleep(self.config.retry_every).await;
        }
    }

    /// Renews until a renewal has failed for a whole lease duration; then returns (the
    /// caller must stop leading).
    pub async fn hold(&self) {
        let mut last_ok = std::time::Instant::now();
        loop {
            tokio::time::sleep(self.config.renew_every).await;
            match self.try_acquire_or_renew().await {
                Ok(true) => last_ok = std::time::Instant::now(),
                Ok(false) => {
                    tracing::warn!("another replica took the leader lease");
                    return;
                }
                Err(e) => {
                    tracing::warn!("renewing the leader lease: {e}");
                    if last_ok.elapsed() >= self.config.lease_duration {
                        return;
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
