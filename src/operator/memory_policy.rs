//! The MemoryPolicy controller: validates a policy against the deployment's memory
//! rules, reports Ready, and lists the agents it selects (from the bindings in its
//! namespace).

use std::{collections::BTreeSet, sync::Arc, time::Duration};

use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};
use kube::{Api, Resource, ResourceExt, api::ListParams, runtime::controller::Action};

use super::{Context, Error};
use crate::api::{
    HarnessBinding, MemoryPolicy, MemoryPolicyStatus,
    conditions::{self, Desired, FALSE, TRUE},
    memory_policy::{MemoryScope, WritePolicy},
};

/// Entry point from the controller runtime.
pub async fn reconcile(policy: Arc<MemoryPolicy>, ctx: Arc<Context>) -> Result<Action, Error> {
    if let Some(action) = ctx.not_leading() {
        return Ok(action);
    }
    let started = std::time::Instant::now();
    let result = apply(&policy, &ctx).await;
    ctx.metrics
        .observe_reconcile("memorypolicy", &result, started.elapsed());
    result
}

/// The rules a policy must meet whatever the deployment allows.
pub fn validate(policy: &MemoryPolicy) -> Result<String, (&'static str, String)> {
    let spec = &policy.spec;
    if spec.write_scope == MemoryScope::Organization {
        return Err((
            "OrganizationWriteNotAllowed",
            "writeScope organization is never agent-configurable".into(),
        ));
    }
    let selector = &spec.agent_selector;
    let all = selector.all_agents.unwrap_or(false);
    let ids = selector.agent_ids.clone().unwrap_or_default();
    if all != ids.is_empty() {
        return Err((
            "InvalidSelector",
            "agentSelector must set exactly one of allAgents: true or a non-empty agentIds".into(),
        ));
    }
    if spec.write_policy != WritePolicy::Disabled && !spec.read_scopes.contains(&spec.write_scope) {
        return Err((
            "WriteScopeNotReadable",
            format!(
                "writeScope {:?} is not among readScopes: agents would write memory they cannot read",
                spec.write_scope
            ),
        ));
    }
    if !spec.enabled {
        return Ok("disabled: the selected agents get no cross-thread memory".into());
    }
    Ok(format!(
        "write scope {:?} with policy {:?}; reads {:?}",
        spec.write_scope, spec.write_policy, spec.read_scopes
    ))
}

/// [`validate`], then what the deployment memory configuration allows: a retention
/// policy id the deployment does not define (it may have been removed after the policy
/// was admitted) is `UnknownRetentionPolicy`; anything else it forbids is
/// `NotAllowedByDeployment`. The data plane meanwhile refuses the writes such a policy
/// would allow.
pub fn validate_with(
    policy: &MemoryPolicy,
    deployment: &crate::domain::memory::policy::DeploymentMemoryConfig,
) -> Result<String, (&'static str, String)> {
    let summary = validate(policy)?;
    let violations = crate::webhook::memory::validate(&policy.spec, deployment);
    let Some(first) = violations.first() else {
        return Ok(summary);
    };
    let reason = if first.field == "spec.retentionPolicy" {
        "UnknownRetentionPolicy"
    } else {
        "NotAllowedByDeployment"
    };
    let message = violations
        .iter()
        .map(|v| format!("{}: {}", v.field, v.message))
        .collect::<Vec<_>>()
        .join("; ");
    Err((reason, message))
}

async fn apply(policy: &MemoryPolicy, ctx: &Context) -> Result<Action, Error> {
    let ns = policy.namespace().unwrap_or_default();
    let verdict = validate_with(policy, &ctx.memory.snapshot().deployment);
    let bindings: Api<HarnessBinding> = Api::namespaced(ctx.client.clone(), &ns);
    let selector = &policy.spec.agent_selector;
    let wanted: Option<BTreeSet<String>> = selector
        .agent_ids
        .as_ref()
        .map(|ids| ids.iter().cloned().collect());
    let selected: BTreeSet<String> = bindings
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .map(|b| b.spec.agent_id)
        .filter(|a| wanted.as_ref().is_none_or(|w| w.contains(a)))
        .collect();
    let mut selected: Vec<String> = selected.into_iter().collect();
    if let Some(w) = &wanted {
        // Agents named but without a binding yet are still selected.
        for a in w {
            if !selected.contains(a) {
                selected.push(a.clone());
            }
        }
        selected.sort();
    }
    let mut status: MemoryPolicyStatus = policy.status.clone().unwrap_or_default();
    let (ok, reason, message) = match verdict {
        Ok(m) => (true, "Valid", m),
        Err((r, m)) => (false, r, m),
    };
    let was = conditions::get(&status.conditions, "Ready").map(|c| c.reason.clone());
    let now = Time(Timestamp::now());
    conditions::set(
        &mut status.conditions,
        Desired {
            type_: "Ready",
            status: if ok { TRUE } else { FALSE },
            reason,
            message: message.clone(),
        },
        policy.metadata.generation,
        &now,
    );
    // kstatus: a refused policy needs a person to change it; Ready=False alone reads as
    // still in progress to kstatus-based tools (docs/install.md, "GitOps").
    if !ok || conditions::get(&status.conditions, super::failure::STALLED).is_some() {
        conditions::set(
            &mut status.conditions,
            Desired {
                type_: super::failure::STALLED,
                status: if ok { FALSE } else { TRUE },
                reason: if ok { "Accepted" } else { reason },
                message: if ok {
                    "the policy is valid".into()
                } else {
                    message.clone()
                },
            },
            policy.metadata.generation,
            &now,
        );
    }
    status.observed_generation = policy.metadata.generation;
    status.selected_agents = selected;
    if policy.status.as_ref() != Some(&status) {
        let mut object = policy.clone();
        object.status = Some(status);
        if super::replace_status(ctx, &object).await?.is_none() {
            return Ok(Action::requeue(Duration::from_millis(200)));
        }
        if was.as_deref() != Some(reason) {
            ctx.publish_verdict(&policy.object_ref(&()), ok, reason, message)
                .await;
        }
    }
    Ok(Action::requeue(Duration::from_secs(60)))
}

/// Keeps the data plane's policy snapshot equal to the valid `MemoryPolicy` objects it
/// can see. Runs on every replica (each serves the data plane), not only the leader.
/// Policies are keyed `namespace/name`.
pub async fn feed(
    client: kube::Client,
    namespace: Option<String>,
    shared: crate::domain::memory::policy::SharedMemoryPolicies,
) {
    use futures::StreamExt;
    use kube::runtime::{WatchStreamExt, watcher};
    let api: Api<MemoryPolicy> = match &namespace {
        Some(ns) => Api::namespaced(client, ns),
        None => Api::all(client),
    };
    let mut initial: Vec<MemoryPolicy> = Vec::new();
    let stream = watcher(api, watcher::Config::default()).default_backoff();
    let mut stream = std::pin::pin!(stream);
    while let Some(event) = stream.next().await {
        match event {
            Ok(watcher::Event::Init) => initial.clear(),
            Ok(watcher::Event::InitApply(p)) => initial.push(p),
            Ok(watcher::Event::InitDone) => {
                let mut set = (*shared.snapshot()).clone();
                set.policies.clear();
                for p in initial.drain(..) {
                    if validate(&p).is_ok() {
                        set.policies.insert(policy_key(&p), p.spec);
                    }
                }
                shared.replace(set);
            }
            Ok(watcher::Event::Apply(p)) => {
                if validate(&p).is_ok() {
                    shared.upsert(&policy_key(&p), p.spec);
                } else {
                    shared.remove(&policy_key(&p));
                }
            }
            Ok(watcher::Event::Delete(p)) => shared.remove(&policy_key(&p)),
            Err(e) => tracing::warn!("watching MemoryPolicies: {e}"),
        }
    }
}

fn policy_key(p: &MemoryPolicy) -> String {
    format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any())
}

/// Keeps the data plane's binding id -> (namespace, `memoryPolicyRef`) map equal to the
/// HarnessBindings it can see, so a memory call is governed by the policies of its
/// binding's own namespace (or the one policy the binding names), and the binding id ->
/// `SandboxProfile` map the run ledger takes its budgets and tool defences from. Runs on
/// every replica. A binding without the binding-id label yet (created as YAML, before
/// its first reconcile) is added once the controller labels it.
pub async fn feed_bindings(
    client: kube::Client,
    namespace: Option<String>,
    scopes: crate::domain::memory::policy::BindingScopes,
    ledger: crate::server::ledger_routes::LedgerBudgets,
) {
    use futures::StreamExt;
    use kube::runtime::{WatchStreamExt, watcher};
    let api: Api<HarnessBinding> = match &namespace {
        Some(ns) => Api::namespaced(client, ns),
        None => Api::all(client),
    };
    let mut initial = std::collections::BTreeMap::new();
    let mut initial_profiles = std::collections::HashMap::new();
    let stream = watcher(api, watcher::Config::default()).default_backoff();
    let mut stream = std::pin::pin!(stream);
    while let Some(event) = stream.next().await {
        match event {
            Ok(watcher::Event::Init) => {
                initial.clear();
                initial_profiles.clear();
            }
            Ok(watcher::Event::InitApply(b)) => {
                if let Some((id, scope)) = binding_scope(&b) {
                    initial_profiles.insert(id.clone(), binding_profile(&b, &scope));
                    initial.insert(id, scope);
                }
            }
            Ok(watcher::Event::InitDone) => {
                scopes.replace(std::mem::take(&mut initial));
                ledger.replace_bindings(std::mem::take(&mut initial_profiles));
            }
            Ok(watcher::Event::Apply(b)) => {
                if let Some((id, scope)) = binding_scope(&b) {
                    ledger.set_binding_profile(&id, Some(binding_profile(&b, &scope)));
                    scopes.set(&id, scope);
                }
            }
            Ok(watcher::Event::Delete(b)) => {
                if let Some((id, _)) = binding_scope(&b) {
                    ledger.set_binding_profile(&id, None);
                    scopes.remove(&id);
                }
            }
            Err(e) => tracing::warn!("watching HarnessBindings for memory policy scopes: {e}"),
        }
    }
}

/// `namespace/name` of the binding's SandboxProfile (the key the ledger's profile table
/// uses).
fn binding_profile(
    b: &HarnessBinding,
    scope: &crate::domain::memory::policy::PolicyScope,
) -> String {
    format!("{}/{}", scope.namespace, b.spec.sandbox_profile_ref.name)
}

/// A binding's id (its label) and where its memory policy comes from.
pub fn binding_scope(
    b: &HarnessBinding,
) -> Option<(String, crate::domain::memory::policy::PolicyScope)> {
    let id = b.labels().get(crate::api::BINDING_ID_LABEL)?.clone();
    Some((
        id,
        crate::domain::memory::policy::PolicyScope {
            namespace: b.namespace()?,
            policy_ref: b.spec.memory_policy_ref.as_ref().map(|r| r.name.clone()),
        },
    ))
}
