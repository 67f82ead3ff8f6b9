//! Webhook certificates the operator manages itself (`--webhook-certs-secret`, the
//! chart's `webhook.certificates.mode: operator`), against the real API server of the
//! `e2e/` control plane: the operator process creates the Secret and writes the CA bundle
//! into a ValidatingWebhookConfiguration that starts without one; the API server then
//! calls the webhook over TLS and gets its refusal. With lifetimes shortened to seconds,
//! the serving certificate is re-issued and the CA rotated while admissions keep being
//! sent, and not one of them fails to reach the webhook.

mod common;

use std::{
    collections::BTreeSet,
    time::{Duration, Instant},
};

use common::operator::{Operator, OperatorOptions};
use harness_engine::{api::HarnessBinding, webhook};
use k8s_openapi::api::{
    admissionregistration::v1::ValidatingWebhookConfiguration, core::v1::Secret,
};
use kube::{Api, api::PostParams};
use serde_json::{Value, json};

const SECRET: &str = "harness-engine-webhook-tls";

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("{e}"))
}

/// One webhook for HarnessBindings in `namespace`, at our URL, with no `caBundle`.
fn configuration(name: &str, namespace: &str, port: u16) -> ValidatingWebhookConfiguration {
    serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [{
            "name": "harnessbindings.harness-engine.dev",
            "clientConfig": {"url": format!("https://127.0.0.1:{port}{}", webhook::PATH_HARNESS_BINDINGS)},
            "rules": [{"apiGroups": ["harness-engine.dev"], "apiVersions": ["v1alpha1"],
                "operations": ["CREATE", "UPDATE"], "resources": ["harnessbindings"], "scope": "Namespaced"}],
            "failurePolicy": "Fail",
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": 5,
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
        }],
    }))
    .unwrap_or_else(|e| panic!("{e}"))
}

/// A binding naming a profile that does not exist: only the webhook refuses it.
fn orphan(i: usize) -> HarnessBinding {
    serde_json::from_value(json!({
        "apiVersion": "harness-engine.dev/v1alpha1", "kind": "HarnessBinding",
        "metadata": {"name": format!("orphan-{i}")},
        "spec": {"agentId": "a", "conversationId": format!("c-{i}"),
                 "subjectRef": format!("hmac-sha256:{}", "ab".repeat(32)),
                 "harness": {"id": "deepagents"}, "sandboxProfileRef": {"name": "no-such-profile"}}
    }))
    .unwrap_or_else(|e| panic!("{e}"))
}

/// The managed state in the Secret (`state.json`), if there is one yet.
async fn stored(secrets: &Api<Secret>) -> Option<Value> {
    let secret = secrets.get_opt(SECRET).await.ok()??;
    serde_json::from_slice(&secret.data?.get("state.json")?.0).ok()
}

#[tokio::test]
async fn the_operator_issues_and_rotates_its_webhook_certificates_without_a_failed_admission() {
    let client = common::client().await;
    common::install_our_crds(&client).await;
    let ns = common::TestNamespace::new(&client, "webhook-certs").await;
    let port = free_port();
    let vwcs: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let name = format!("harness-engine-certs-{}", ns.name);
    vwcs.create(
        &PostParams::default(),
        &configuration(&name, &ns.name, port),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let _registration = common::WebhookRegistration { name: name.clone() };
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let cert_dir = dir.path().join("webhook-tls");
    let mut op = Operator::start(OperatorOptions {
        namespace: &ns.name,
        data_dir: &dir.path().join("data"),
        leader_lease_seconds: None,
        extra: [
            "--webhook-listen",
            &format!("127.0.0.1:{port}"),
            "--webhook-cert-dir",
            &cert_dir.display().to_string(),
            "--webhook-certs-secret",
            SECRET,
            "--webhook-configuration",
            &name,
            "--webhook-cert-hosts",
            "127.0.0.1",
            // Re-issued with 10 s left; the CA staged with 15 s left and signing 4 s later.
            "--webhook-cert-lifetime-seconds",
            "30",
            "--webhook-ca-lifetime-seconds",
            "45",
        ]
        .map(String::from)
        .to_vec(),
    });

    // 1. The Secret and the caBundle appear; the API server reaches the webhook.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns.name);
    let first = common::eventually(Duration::from_secs(60), "managed Secret", || {
        let secrets = secrets.clone();
        async move { stored(&secrets).await }
    })
    .await;
    let first_ca = first["ca"]["pem"]["cert"]
        .as_str()
        .unwrap_or("none")
        .to_owned();
    common::eventually(Duration::from_secs(30), "caBundle written", || {
        let vwcs = vwcs.clone();
        let name = name.clone();
        let first_ca = first_ca.clone();
        async move {
            let c = vwcs.get(&name).await.ok()?;
            let bundle = c.webhooks?.first()?.client_config.ca_bundle.clone()?;
            let text = String::from_utf8(bundle.0).ok()?;
            text.contains(&first_ca).then_some(())
        }
    })
    .await;
    let bindings: Api<HarnessBinding> = Api::namespaced(client.clone(), &ns.name);

    // 2. Admissions every 300 ms while the certificates turn over.
    let started = Instant::now();
    let (mut servings, mut cas) = (BTreeSet::new(), BTreeSet::new());
    let (mut refused_by_webhook, mut failed) = (0, Vec::new());
    let mut i = 0;
    while started.elapsed() < Duration::from_secs(90) {
        i += 1;
        match bindings.create(&PostParams::default(), &orphan(i)).await {
            Err(kube::Error::Api(s)) if s.message.contains("does not exist in namespace") => {
                refused_by_webhook += 1;
            }
            other => failed.push(format!(
                "{:.1}s: {other:?}",
                started.elapsed().as_secs_f64()
            )),
        }
        if let Some(s) = stored(&secrets).await {
            servings.insert(s["serving"]["cert"].as_str().unwrap_or_default().to_owned());
            cas.insert(s["ca"]["name"].as_str().unwrap_or_default().to_owned());
        }
        if servings.len() >= 3 && cas.len() >= 2 && started.elapsed() > Duration::from_secs(50) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let log = op.log_text();
    op.stop();
    assert!(
        failed.is_empty(),
        "{} of {} admissions did not get the webhook's answer: {failed:#?}\noperator log:\n{log}",
        failed.len(),
        i
    );
    assert!(
        servings.len() >= 3,
        "the serving certificate was issued {} time(s) in {:?}; log:\n{log}",
        servings.len(),
        started.elapsed()
    );
    assert!(
        cas.len() >= 2,
        "the CA was not rotated: {cas:?}; log:\n{log}"
    );
    assert!(refused_by_webhook >= 50, "{refused_by_webhook} admissions");
    assert!(
        log.contains("webhook certificates updated") && log.contains("caBundle updated"),
        "{log}"
    );
    println!(
        "{refused_by_webhook} admissions answered by the webhook over {:.0} s; {} serving certificates, {} CAs",
        started.elapsed().as_secs_f64(),
        servings.len(),
        cas.len()
    );
}
