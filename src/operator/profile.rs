//! The SandboxProfile controller: resolves the warm pool and its template, checks them
//! against the profile (UID expectation, pinned and allowed image digests, declared
//! protocol version), and reports a Ready condition with a specific reason and the
//! number of active leases.

use std::{sync::Arc, time::Duration};

use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};
use kube::{Api, Resource, ResourceExt, api::ListParams, runtime::controller::Action};

use super::{Context, Error};
use crate::api::{
    HarnessBinding, Lifecycle, SandboxProfile, SandboxProfileStatus,
    conditions::{self, Desired, FALSE, TRUE},
    sandbox::{self, SandboxTemplate, SandboxWarmPool},
};

/// Entry point from the controller runtime.
pub async fn reconcile(profile: Arc<SandboxProfile>, ctx: Arc<Context>) -> Result<Action, Error> {
    if let Some(action) = ctx.not_leading() {
        return Ok(action);
    }
    let started = std::time::Instant::now();
    let result = apply(&profile, &ctx).await;
    ctx.metrics
        .observe_reconcile("sandboxprofile", &result, started.elapsed());
    result
}

/// Keeps the data plane's table of SandboxProfile ledger rules (`spec.ledger`: budgets
/// and tool defences) equal to the profiles this replica can see. Runs on every replica
/// (each serves the data plane), not only the leader. Profiles are keyed
/// `namespace/name`.
pub async fn feed_ledger_rules(
    client: kube::Client,
    namespace: Option<String>,
    table: crate::server::ledger_routes::LedgerBudgets,
) {
    use futures::StreamExt;
    use kube::runtime::{WatchStreamExt, watcher};
    let api: Api<SandboxProfile> = match &namespace {
        Some(ns) => Api::namespaced(client, ns),
        None => Api::all(client),
    };
    let key =
        |p: &SandboxProfile| format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any());
    let mut initial = std::collections::HashMap::new();
    let stream = watcher(api, watcher::Config::default()).default_backoff();
    let mut stream = std::pin::pin!(stream);
    while let Some(event) = stream.next().await {
        match event {
            Ok(watcher::Event::Init) => initial.clear(),
            Ok(watcher::Event::InitApply(p)) => {
                if let Some(rules) = p.spec.ledger.clone() {
                    initial.insert(key(&p), rules);
                }
            }
            Ok(watcher::Event::InitDone) => table.replace_profiles(std::mem::take(&mut initial)),
            Ok(watcher::Event::Apply(p)) => table.set_profile(&key(&p), p.spec.ledger.clone()),
            Ok(watcher::Event::Delete(p)) => table.set_profile(&key(&p), None),
            Err(e) => tracing::warn!("watching SandboxProfiles for ledger rules: {e}"),
        }
    }
}

/// Refusals decided by the profile's spec alone: not retried until it changes.
const SPEC_ONLY: [&str; 1] = ["WarmPoolNamespaceMismatch"];

/// Why a profile is not Ready, or `Ok` with a summary.
async fn check(
    profile: &SandboxProfile,
    ctx: &Context,
) -> Result<Result<(String, Option<String>), (&'static str, String)>, Error> {
    let ns = profile.namespace().unwrap_or_default();
    let spec = &profile.spec;
    if !spec.enabled {
        return Ok(Err((
            "Disabled",
            "the profile is disabled: no new leases".into(),
        )));
    }
    let pool_ns = spec.warm_pool_ref.namespace.clone().unwrap_or(ns.clone());
    if pool_ns != ns {
        return Ok(Err((
            "WarmPoolNamespaceMismatch",
            format!(
                "warm pool namespace {pool_ns} differs from the profile's namespace {ns}: claims can only use pools in their own namespace"
            ),
        )));
    }
    let pools: Api<SandboxWarmPool> = Api::namespaced(ctx.client.clone(), &ns);
    let pool_name = &spec.warm_pool_ref.name;
    let Some(pool) = pools.get_opt(pool_name).await? else {
        return Ok(Err((
            "WarmPoolNotFound",
            format!("SandboxWarmPool {ns}/{pool_name} does not exist"),
        )));
    };
    let pool_uid = pool.uid();
    if let Some(expected) = &spec.warm_pool_ref.uid
        && pool_uid.as_deref() != Some(expected.as_str())
    {
        return Ok(Err((
            "WarmPoolUIDMismatch",
            format!(
                "SandboxWarmPool {pool_name} has UID {}, the profile expects {expected}: it was deleted and recreated",
                pool_uid.clone().unwrap_or_default()
            ),
        )));
    }
    let templates: Api<SandboxTemplate> = Api::namespaced(ctx.client.clone(), &ns);
    let template_name = &pool.spec.sandbox_template_ref.name;
    let Some(template) = templates.get_opt(template_name).await? else {
        return Ok(Err((
            "TemplateNotFound",
            format!("SandboxTemplate {ns}/{template_name} of warm pool {pool_name} does not exist"),
        )));
    };
    if let Err(refusal) = check_template(spec, &template, template_name) {
        return Ok(Err(refusal));
    }
    Ok(Ok((
        format!(
            "warm pool {pool_name} (template {template_name}) matches the profile's images and protocol versions"
        ),
        pool_uid,
    )))
}

/// What a profile requires of the template its warm pool stamps pods from: every
/// container pinned by a digest the profile allows, the profile's `runtimeClassName`
/// when it names one, and a declared worker protocol version it accepts. A refusal is (reason, message).
fn check_template(
    spec: &crate::api::SandboxProfileSpec,
    template: &SandboxTemplate,
    template_name: &str,
) -> Result<(), (&'static str, String)> {
    let pod = &template.spec.pod_template;
    for c in &pod.spec.containers {
        let image = c.image.clone().unwrap_or_default();
        let Some(digest) = sandbox::image_digest(&image) else {
            return Err((
                "ImageNotPinned",
                format!(
                    "container {} of SandboxTemplate {template_name} uses {image:?}: images must be pinned by sha256 digest",
                    c.name
                ),
            ));
        };
        if !spec
            .allowed_worker_image_digests
            .iter()
            .any(|d| d == digest)
        {
            return Err((
                "ImageNotAllowed",
                format!(
                    "container {} of SandboxTemplate {template_name} runs {digest}, which is not in allowedWorkerImageDigests",
                    c.name
                ),
            ));
        }
    }
    if let Some(want) = &spec.runtime_class_name
        && pod.spec.runtime_class_name.as_deref() != Some(want.as_str())
    {
        return Err((
            "RuntimeClassMismatch",
            format!(
                "SandboxTemplate {template_name} runs with runtimeClassName {:?}; the profile requires {want:?}",
                pod.spec.runtime_class_name.as_deref().unwrap_or("")
            ),
        ));
    }
    let declared = pod
        .metadata
        .as_ref()
        .and_then(|m| m.annotations.as_ref())
        .and_then(|a| a.get(sandbox::PROTOCOL_VERSION_ANNOTATION));
    let Some(declared) = declared else {
        return Err((
            "ProtocolVersionMissing",
            format!(
                "SandboxTemplate {template_name} does not declare annotation {} on its pod template",
                sandbox::PROTOCOL_VERSION_ANNOTATION
            ),
        ));
    };
    match declared.trim().parse::<i32>() {
        Ok(v) if spec.worker_protocol_versions.contains(&v) => Ok(()),
        _ => Err((
            "ProtocolVersionNotAllowed",
            format!(
                "SandboxTemplate {template_name} declares protocol version {declared:?}; the profile allows {:?}",
                spec.worker_protocol_versions
            ),
        )),
    }
}

async fn apply(profile: &SandboxProfile, ctx: &Context) -> Result<Action, Error> {
    let ns = profile.namespace().unwrap_or_default();
    let verdict = check(profile, ctx).await?;
    let bindings: Api<HarnessBinding> = Api::namespaced(ctx.client.clone(), &ns);
    let active = bindings
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter(|b| b.spec.sandbox_profile_ref.name == profile.name_any())
        .filter(|b| {
            b.status.as_ref().is_some_and(|s| {
                s.lease.is_some()
                    && !matches!(
                        s.lifecycle,
                        Some(Lifecycle::Failed | Lifecycle::Releasing | Lifecycle::Hibernated)
                    )
            })
        })
        .count();
    let mut status: SandboxProfileStatus = profile.status.clone().unwrap_or_default();
    let now = Time(Timestamp::now());
    let (ok, reason, message, pool_uid) = match verdict {
        Ok((message, uid)) => (true, "Ready", message, uid),
        Err((reason, message)) => (false, reason, message, None),
    };
    let was =
        conditions::get(&status.conditions, "Ready").map(|c| (c.status.clone(), c.reason.clone()));
    conditions::set(
        &mut status.conditions,
        Desired {
            type_: "Ready",
            status: if ok { TRUE } else { FALSE },
            reason,
            message: message.clone(),
        },
        profile.metadata.generation,
        &now,
    );
    // kstatus: a refused profile needs a person to change it (or what it names).
    let stalled = !ok && reason != "Disabled";
    if stalled || conditions::get(&status.conditions, super::failure::STALLED).is_some() {
        conditions::set(
            &mut status.conditions,
            Desired {
                type_: super::failure::STALLED,
                status: if stalled { TRUE } else { FALSE },
                reason: if stalled { reason } else { "Accepted" },
                message: if stalled {
                    message.clone()
                } else {
                    "the profile is accepted or disabled on purpose".into()
                },
            },
            profile.metadata.generation,
            &now,
        );
    }
    status.observed_generation = profile.metadata.generation;
    if ok {
        status.warm_pool_uid = pool_uid;
    }
    status.active_leases = i32::try_from(active).unwrap_or(i32::MAX);
    if profile.status.as_ref() != Some(&status) {
        let mut object = profile.clone();
        object.status = Some(status);
        if super::replace_status(ctx, &object).await?.is_none() {
            return Ok(Action::requeue(Duration::from_millis(200)));
        }
        if was
            != Some((
                (if ok { TRUE } else { FALSE }).to_owned(),
                reason.to_owned(),
            ))
        {
            ctx.publish_verdict(&profile.object_ref(&()), ok, reason, message)
                .await;
        }
    }
    // A refusal that only the profile's own spec can cure waits for its next
    // generation; the others depend on the pool and template too (not watched), and the
    // lease counts drift as bindings come and go: look again now and then.
    if SPEC_ONLY.contains(&reason) {
        return Ok(Action::await_change());
    }
    Ok(Action::requeue(Duration::from_secs(30)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const DIGEST: &str = "sha256:d82f458899c9696cb26a7c02d5568f81c8c8223f8661bb2a7988b269c8b9051e";

    fn spec() -> crate::api::SandboxProfileSpec {
        serde_json::from_value(json!({
            "warmPoolRef": {"name": "pool"},
            "allowedHarnessIds": ["deepagents"],
            "allowedWorkerImageDigests": [DIGEST],
            "adapterVersion": "1.0.0",
            "workerProtocolVersions": [1],
            "egressPolicyClass": "data-plane-only",
            "timeouts": {"claimReadinessDeadline": "2m", "idleTTL": "30m", "maxLifetime": "12h"}
        }))
        .expect("spec")
    }

    fn template(image: &str, protocol: Option<&str>) -> SandboxTemplate {
        let annotations = protocol.map_or(
            json!({}),
            |v| json!({ sandbox::PROTOCOL_VERSION_ANNOTATION: v }),
        );
        serde_json::from_value(json!({
            "apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxTemplate",
            "metadata": {"name": "t"},
            "spec": {"podTemplate": {
                "metadata": {"annotations": annotations},
                "spec": {"containers": [{"name": "worker", "image": image}]}
            }}
        }))
        .expect("template")
    }

    #[test]
    fn a_template_is_accepted_only_pinned_allowed_and_on_a_known_protocol() {
        let pinned = format!("busybox@{DIGEST}");
        let other = format!("busybox@sha256:{}", "0".repeat(64));
        let cases: [(&str, Option<&str>, Option<&str>); 6] = [
            (&pinned, Some("1"), None),
            (&pinned, Some(" 1 "), None),
            ("busybox:latest", Some("1"), Some("ImageNotPinned")),
            (&other, Some("1"), Some("ImageNotAllowed")),
            (&pinned, None, Some("ProtocolVersionMissing")),
            (&pinned, Some("2"), Some("ProtocolVersionNotAllowed")),
        ];
        for (image, protocol, want) in cases {
            let got = check_template(&spec(), &template(image, protocol), "t");
            assert_eq!(
                got.as_ref().err().map(|(reason, _)| *reason),
                want,
                "{image} {protocol:?}: {got:?}"
            );
            if let Err((_, message)) = got {
                assert!(message.contains("SandboxTemplate t"), "{message}");
            }
        }
    }

    /// `runtimeClassName`: the template must run with exactly the class the profile names.
    #[test]
    fn a_profile_runtime_class_must_be_the_templates() {
        let pinned = format!("busybox@{DIGEST}");
        let with_class = |class: Option<&str>| {
            let mut t = template(&pinned, Some("1"));
            t.spec.pod_template.spec.runtime_class_name = class.map(Into::into);
            t
        };
        let mut gvisor = spec();
        gvisor.runtime_class_name = Some("gvisor".into());
        let cases = [
            (&spec(), None, None),
            (&spec(), Some("kata"), None),
            (&gvisor, Some("gvisor"), None),
            (&gvisor, None, Some("RuntimeClassMismatch")),
            (&gvisor, Some("runc"), Some("RuntimeClassMismatch")),
        ];
        for (profile, class, want) in cases {
            let got = check_template(profile, &with_class(class), "t");
            assert_eq!(
                got.as_ref().err().map(|(reason, _)| *reason),
                want,
                "{class:?}: {got:?}"
            );
        }
        let message = check_template(&gvisor, &with_class(Some("runc")), "t")
            .err()
            .map(|(_, m)| m)
            .unwrap_or_default();
        assert!(
            message.contains("runtimeClassName \"runc\"; the profile requires \"gvisor\""),
            "{message}"
        );
    }
}
