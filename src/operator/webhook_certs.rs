//! Webhook certificates the operator makes and rotates itself (chart value
//! `webhook.certificates.mode: operator`), for clusters without cert-manager.
//!
//! The leader keeps one Secret: a CA, a serving certificate it signs for the webhook
//! Service's names, and the CA bundle the API server must trust. It issues both on first
//! start, re-issues the serving certificate when a third of its lifetime is left (or the
//! names change), and rotates the CA in two steps so no admission call fails: a new CA
//! first joins the bundle (trusted, not yet signing), and only once the API server has had
//! time to load that bundle does it sign the serving certificate; the old CA stays in the
//! bundle until it expires. After every change the leader writes the bundle into the
//! `caBundle` of each webhook of our `ValidatingWebhookConfiguration`.
//!
//! Every replica (leader or not) reads the Secret and writes `tls.crt` / `tls.key` into
//! its webhook certificate directory when they change; the TLS server re-reads them
//! before the next handshake (`src/webhook/tls.rs`). Reading through the API, not a
//! mounted volume, means a new certificate is served seconds after it is issued rather
//! than after the kubelet's next volume sync, and a first start does not wait for a
//! volume that does not exist yet.
//!
//! What to do is decided by [`decide`], a pure function of the stored state, the wanted
//! host names and the clock; [`run`] and [`sync_files`] only read and write.

use std::{collections::BTreeMap, path::PathBuf, sync::Arc, time::Duration};

use base64::Engine;
use k8s_openapi::{
    ByteString,
    api::{admissionregistration::v1::ValidatingWebhookConfiguration, core::v1::Secret},
};
use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
};
use prometheus_client::metrics::gauge::Gauge;
use serde::{Deserialize, Serialize};

use crate::webhook::certs::{self, Pem};

/// The Secret's key holding [`Stored`] as JSON.
const STATE_KEY: &str = "state.json";
/// Field manager of our writes.
const MANAGER: &str = "harness-engine-webhook-certs";

/// How the operator manages the webhook's certificates.
#[derive(Clone, Debug)]
pub struct CertConfig {
    /// Namespace and name of the Secret (created when missing).
    pub namespace: String,
    pub secret: String,
    /// The `ValidatingWebhookConfiguration` whose webhooks get the CA bundle.
    pub webhook_configuration: String,
    /// Names the serving certificate is valid for (the webhook Service's DNS names).
    pub hosts: Vec<String>,
    pub cert_lifetime: Duration,
    pub ca_lifetime: Duration,
    /// Where this replica writes `tls.crt` and `tls.key` for its TLS server.
    pub cert_dir: PathBuf,
}

/// A CA kept in the Secret: its PEM pair and the name it signs as.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ca {
    pub name: String,
    pub pem: Pem,
}

/// Everything the Secret records (the `state.json` key; `tls.crt`, `tls.key` and
/// `ca.crt` are derived from it for anyone who mounts the Secret).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stored {
    /// The CA that signs the serving certificate.
    pub ca: Ca,
    /// A new CA in the bundle, not yet signing; since when (Unix seconds).
    pub next_ca: Option<(Ca, i64)>,
    /// The CA that signed before the last rotation, trusted until it expires.
    pub previous_ca: Option<(String, i64)>,
    pub serving: Pem,
    pub hosts: Vec<String>,
}

impl Stored {
    /// The CAs the API server must trust, in PEM, newest first.
    pub fn bundle(&self) -> String {
        let mut out = String::new();
        if let Some((next, _)) = &self.next_ca {
            out.push_str(&next.pem.cert);
        }
        out.push_str(&self.ca.pem.cert);
        if let Some((previous, _)) = &self.previous_ca {
            out.push_str(previous);
        }
        out
    }
}

/// What one pass does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Nothing to change.
    Keep,
    /// A new CA and serving certificate: nothing usable is stored.
    Fresh,
    /// A new serving certificate from the current CA (time, or the names changed).
    Reissue,
    /// A new CA joins the bundle; it signs nothing yet.
    AddNextCa,
    /// The staged CA signs a new serving certificate and becomes the CA; the old one
    /// stays trusted until it expires.
    PromoteNextCa,
    /// The previous CA expired: it leaves the bundle.
    DropPreviousCa,
}

/// Lifetimes the decision compares with.
#[derive(Clone, Copy, Debug)]
pub struct Lifetimes {
    pub cert: Duration,
    pub ca: Duration,
}

impl Lifetimes {
    /// How long a new CA sits in the bundle before it signs: time for every API server
    /// to load the new bundle (a minute, or a tenth of the CA's life if that is shorter).
    pub fn propagation(&self) -> i64 {
        secs(self.ca / 10).min(60)
    }
}

fn secs(d: Duration) -> i64 {
    i64::try_from(d.as_secs()).unwrap_or(i64::MAX)
}

/// The pure decision of one pass: `stored` is what the Secret holds (None: missing or
/// unreadable), `now` Unix seconds.
pub fn decide(stored: Option<&Stored>, hosts: &[String], now: i64, life: Lifetimes) -> Step {
    let Some(s) = stored else {
        return Step::Fresh;
    };
    if s.ca.pem.not_after <= now || s.serving.not_after <= now {
        return Step::Fresh;
    }
    if s.previous_ca.as_ref().is_some_and(|(_, end)| *end <= now) {
        return Step::DropPreviousCa;
    }
    if let Some((_, since)) = &s.next_ca {
        if now - since >= life.propagation() {
            return Step::PromoteNextCa;
        }
    } else if s.ca.pem.not_after - now < secs(life.ca) / 3 {
        return Step::AddNextCa;
    }
    if s.serving.not_after - now < secs(life.cert) / 3 || s.hosts != hosts {
        return Step::Reissue;
    }
    Step::Keep
}

/// Applies `step` to `stored` (issuing what it needs); `None` for [`Step::Keep`].
pub fn apply(
    step: Step,
    stored: Option<&Stored>,
    hosts: &[String],
    now: i64,
    life: Lifetimes,
) -> Result<Option<Stored>, certs::CertError> {
    let new_ca = || -> Result<Ca, certs::CertError> {
        let name = format!("harness-engine webhook CA {now}");
        Ok(Ca {
            pem: certs::new_ca(&name, life.ca)?,
            name,
        })
    };
    let serving = |ca: &Ca| certs::issue_serving(&ca.name, &ca.pem.key, hosts, life.cert);
    let Some(s) = stored.filter(|_| step != Step::Fresh) else {
        if step == Step::Keep {
            return Ok(None);
        }
        let ca = new_ca()?;
        return Ok(Some(Stored {
            serving: serving(&ca)?,
            ca,
            next_ca: None,
            previous_ca: None,
            hosts: hosts.to_vec(),
        }));
    };
    let mut next = s.clone();
    match step {
        Step::Keep | Step::Fresh => return Ok(None),
        Step::Reissue => {
            next.serving = serving(&s.ca)?;
            next.hosts = hosts.to_vec();
        }
        Step::AddNextCa => next.next_ca = Some((new_ca()?, now)),
        Step::PromoteNextCa => {
            let Some((staged, _)) = &s.next_ca else {
                return Ok(None);
            };
            next.serving = serving(staged)?;
            next.hosts = hosts.to_vec();
            next.previous_ca = Some((s.ca.pem.cert.clone(), s.ca.pem.not_after));
            next.ca = staged.clone();
            next.next_ca = None;
        }
        Step::DropPreviousCa => next.previous_ca = None,
    }
    Ok(Some(next))
}

/// Certificate metrics on the admin port.
#[derive(Clone, Default)]
pub struct CertMetrics {
    /// Seconds until the serving certificate expires.
    pub serving_expiry: Gauge<i64, std::sync::atomic::AtomicI64>,
    /// Seconds until the signing CA expires.
    pub ca_expiry: Gauge<i64, std::sync::atomic::AtomicI64>,
}

fn read(secret: &Secret) -> Option<Stored> {
    let bytes = secret.data.as_ref()?.get(STATE_KEY)?;
    serde_json::from_slice(&bytes.0).ok()
}

fn secret_of(cfg: &CertConfig, stored: &Stored) -> Result<Secret, serde_json::Error> {
    let data = BTreeMap::from([
        (
            STATE_KEY.to_owned(),
            ByteString(serde_json::to_vec(stored)?),
        ),
        (
            "tls.crt".to_owned(),
            ByteString(stored.serving.cert.clone().into_bytes()),
        ),
        (
            "tls.key".to_owned(),
            ByteString(stored.serving.key.clone().into_bytes()),
        ),
        (
            "ca.crt".to_owned(),
            ByteString(stored.bundle().into_bytes()),
        ),
    ]);
    let mut secret = Secret {
        data: Some(data),
        type_: Some("Opaque".into()),
        ..Secret::default()
    };
    secret.metadata.name = Some(cfg.secret.clone());
    secret.metadata.namespace = Some(cfg.namespace.clone());
    secret.metadata.labels = Some(BTreeMap::from([(
        "app.kubernetes.io/managed-by".to_owned(),
        "harness-engine-operator".to_owned(),
    )]));
    Ok(secret)
}

/// One pass of the leader: decide, issue, write the Secret (create, or replace at the
/// resourceVersion read), then make every webhook's `caBundle` the stored bundle.
pub async fn reconcile_once(
    client: &Client,
    cfg: &CertConfig,
    metrics: &CertMetrics,
    now: i64,
) -> anyhow::Result<Step> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &cfg.namespace);
    let existing = secrets.get_opt(&cfg.secret).await?;
    let stored = existing.as_ref().and_then(read);
    let life = Lifetimes {
        cert: cfg.cert_lifetime,
        ca: cfg.ca_lifetime,
    };
    let step = decide(stored.as_ref(), &cfg.hosts, now, life);
    let current = match apply(step, stored.as_ref(), &cfg.hosts, now, life)? {
        None => stored,
        Some(next) => {
            let mut secret = secret_of(cfg, &next)?;
            match &existing {
                Some(old) => {
                    secret.metadata.resource_version = old.metadata.resource_version.clone();
                    secrets
                        .replace(&cfg.secret, &PostParams::default(), &secret)
                        .await?;
                }
                None => {
                    secrets.create(&PostParams::default(), &secret).await?;
                }
            }
            tracing::info!(
                secret = %format!("{}/{}", cfg.namespace, cfg.secret),
                ?step,
                serving_not_after = next.serving.not_after,
                ca_not_after = next.ca.pem.not_after,
                "webhook certificates updated"
            );
            Some(next)
        }
    };
    if let Some(s) = &current {
        metrics.serving_expiry.set(s.serving.not_after - now);
        metrics.ca_expiry.set(s.ca.pem.not_after - now);
        // This replica serves the pair before the API server is told to trust it: a
        // caBundle written first would send admissions to a server still waiting for its
        // files (up to one `sync_files` period), and each would time out.
        if !pair_on_disk(&cfg.cert_dir, &s.serving) {
            write_pair(&cfg.cert_dir, &s.serving)?;
        }
        patch_ca_bundle(client, &cfg.webhook_configuration, &s.bundle()).await?;
    }
    Ok(step)
}

/// Sets `caBundle` of every webhook of the configuration to `bundle` (PEM), when it
/// differs.
async fn patch_ca_bundle(client: &Client, name: &str, bundle: &str) -> anyhow::Result<()> {
    let api: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let config = api.get(name).await?;
    let encoded = ByteString(bundle.as_bytes().to_vec());
    let hooks = config.webhooks.unwrap_or_default();
    if hooks
        .iter()
        .all(|h| h.client_config.ca_bundle.as_ref() == Some(&encoded))
    {
        return Ok(());
    }
    let b64 = base64::engine::general_purpose::STANDARD.encode(bundle);
    let webhooks: Vec<_> = hooks
        .iter()
        .map(|h| serde_json::json!({"name": h.name, "clientConfig": {"caBundle": b64}}))
        .collect();
    // A strategic merge patch keys the webhooks list by name.
    api.patch(
        name,
        &PatchParams::apply(MANAGER),
        &Patch::Strategic(serde_json::json!({ "webhooks": webhooks })),
    )
    .await?;
    tracing::info!(webhook_configuration = name, "caBundle updated");
    Ok(())
}

/// The leader's loop: a pass now and then every `every` (sooner while a staged CA waits
/// to sign, or after a failure), until `stop` resolves. Failures are logged and retried.
pub async fn run(
    client: Client,
    cfg: Arc<CertConfig>,
    metrics: CertMetrics,
    stop: impl std::future::Future<Output = ()>,
) {
    let every = (cfg.cert_lifetime / 20).clamp(Duration::from_secs(1), Duration::from_secs(600));
    let mut stop = std::pin::pin!(stop);
    loop {
        let wait = match reconcile_once(&client, &cfg, &metrics, unix_now()).await {
            Ok(Step::Keep) => every,
            Ok(_) => Duration::from_secs(1).max(every / 10),
            Err(error) => {
                tracing::warn!(
                    secret = %format!("{}/{}", cfg.namespace, cfg.secret),
                    error = %format!("{error:#}"),
                    "webhook certificates: pass failed; retrying"
                );
                Duration::from_secs(5).min(every)
            }
        };
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = &mut stop => return,
        }
    }
}

/// Every replica: keeps `tls.crt` and `tls.key` in `cfg.cert_dir` equal to the Secret's,
/// checking every `every`, until `stop` resolves.
pub async fn sync_files(
    client: Client,
    cfg: Arc<CertConfig>,
    every: Duration,
    stop: impl std::future::Future<Output = ()>,
) {
    let secrets: Api<Secret> = Api::namespaced(client, &cfg.namespace);
    let mut stop = std::pin::pin!(stop);
    loop {
        match secrets.get_opt(&cfg.secret).await {
            Ok(Some(secret)) => {
                if let Some(stored) = read(&secret)
                    && !pair_on_disk(&cfg.cert_dir, &stored.serving)
                    && let Err(error) = write_pair(&cfg.cert_dir, &stored.serving)
                {
                    tracing::warn!(
                        dir = %cfg.cert_dir.display(),
                        %error,
                        "webhook certificates: cannot write the serving pair"
                    );
                }
            }
            Ok(None) => {}
            Err(error) => tracing::warn!(
                secret = %format!("{}/{}", cfg.namespace, cfg.secret),
                %error,
                "webhook certificates: cannot read the Secret"
            ),
        }
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            () = &mut stop => return,
        }
    }
}

/// Whether `dir` already holds exactly this pair.
fn pair_on_disk(dir: &std::path::Path, pem: &Pem) -> bool {
    let same = |file: &str, want: &str| {
        std::fs::read(dir.join(file)).is_ok_and(|have| have == want.as_bytes())
    };
    same("tls.key", &pem.key) && same("tls.crt", &pem.cert)
}

fn write_pair(dir: &std::path::Path, pem: &Pem) -> Result<(), certs::CertError> {
    std::fs::create_dir_all(dir).map_err(|source| certs::CertError::Write {
        path: dir.display().to_string(),
        source,
    })?;
    // Key first: the server reloads when the certificate file changes, and a pair that
    // does not match is ignored until both are written.
    certs::write_atomically(&dir.join("tls.key"), pem.key.as_bytes(), true)?;
    certs::write_atomically(&dir.join("tls.crt"), pem.cert.as_bytes(), false)
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: i64 = 86_400;

    fn life() -> Lifetimes {
        Lifetimes {
            cert: Duration::from_secs(90 * 86_400),
            ca: Duration::from_secs(3650 * 86_400),
        }
    }

    fn pem(not_after: i64) -> Pem {
        Pem {
            cert: format!("cert {not_after}\n"),
            key: "key".into(),
            not_after,
        }
    }

    fn ca(not_after: i64) -> Ca {
        Ca {
            name: format!("ca {not_after}"),
            pem: pem(not_after),
        }
    }

    fn stored(ca_end: i64, cert_end: i64) -> Stored {
        Stored {
            ca: ca(ca_end),
            next_ca: None,
            previous_ca: None,
            serving: pem(cert_end),
            hosts: vec!["svc.ns.svc".into()],
        }
    }

    #[test]
    fn each_state_of_the_secret_leads_to_one_step() {
        let hosts = vec!["svc.ns.svc".to_owned()];
        let now = 1_000 * DAY;
        let fresh = stored(now + 3000 * DAY, now + 80 * DAY);
        let mut staged = fresh.clone();
        staged.next_ca = Some((ca(now + 3650 * DAY), now - 30));
        let mut staged_long_ago = staged.clone();
        staged_long_ago.next_ca = Some((ca(now + 3650 * DAY), now - 61));
        let mut rotated = fresh.clone();
        rotated.previous_ca = Some(("old".into(), now - 1));
        let mut moved = fresh.clone();
        moved.hosts = vec!["other.ns.svc".into()];
        let cases: Vec<(&str, Option<Stored>, Step)> = vec![
            ("nothing stored", None, Step::Fresh),
            ("all fresh", Some(fresh.clone()), Step::Keep),
            (
                "serving cert has a third left",
                Some(stored(now + 3000 * DAY, now + 29 * DAY)),
                Step::Reissue,
            ),
            (
                "serving cert expired",
                Some(stored(now + 3000 * DAY, now)),
                Step::Fresh,
            ),
            ("CA expired", Some(stored(now, now + 80 * DAY)), Step::Fresh),
            (
                "CA has a third left",
                Some(stored(now + 1000 * DAY, now + 80 * DAY)),
                Step::AddNextCa,
            ),
            ("new CA staged 30 s ago", Some(staged), Step::Keep),
            (
                "new CA staged past propagation",
                Some(staged_long_ago),
                Step::PromoteNextCa,
            ),
            ("previous CA expired", Some(rotated), Step::DropPreviousCa),
            ("host names changed", Some(moved), Step::Reissue),
        ];
        for (what, s, want) in cases {
            assert_eq!(decide(s.as_ref(), &hosts, now, life()), want, "{what}");
        }
    }

    #[test]
    fn a_ca_rotation_keeps_every_signer_trusted_until_it_expires() {
        let hosts = vec!["127.0.0.1".to_owned(), "svc.ns.svc".to_owned()];
        let life = Lifetimes {
            cert: Duration::from_secs(3600),
            ca: Duration::from_secs(7200),
        };
        let now = unix_now();
        let first = apply(Step::Fresh, None, &hosts, now, life)
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|| panic!("fresh issues"));
        assert!(
            first
                .serving
                .cert
                .starts_with("-----BEGIN CERTIFICATE-----")
        );
        assert_eq!(first.bundle(), first.ca.pem.cert);
        let staged = apply(Step::AddNextCa, Some(&first), &hosts, now, life)
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|| panic!("staged"));
        // The new CA is trusted before it signs; the serving pair is unchanged.
        assert_eq!(staged.serving, first.serving);
        assert!(staged.bundle().contains(&first.ca.pem.cert));
        let next_cert = staged.next_ca.as_ref().map(|(c, _)| c.pem.cert.clone());
        assert!(
            staged
                .bundle()
                .contains(next_cert.as_deref().unwrap_or("none"))
        );
        let promoted = apply(Step::PromoteNextCa, Some(&staged), &hosts, now, life)
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|| panic!("promoted"));
        assert_ne!(promoted.serving, first.serving);
        assert_eq!(Some(promoted.ca.pem.cert.clone()), next_cert);
        assert!(
            promoted.bundle().contains(&first.ca.pem.cert),
            "the old CA stays trusted"
        );
        let dropped = apply(Step::DropPreviousCa, Some(&promoted), &hosts, now, life)
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|| panic!("dropped"));
        assert!(!dropped.bundle().contains(&first.ca.pem.cert));
        assert_eq!(
            apply(Step::Keep, Some(&dropped), &hosts, now, life).ok(),
            Some(None)
        );
    }
}
