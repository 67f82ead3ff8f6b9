//! The data-plane API against a real `harness-engine serve` process: first start, the
//! turn protocol over HTTP, fencing, isolation between principals, native objects and
//! streams, interrupts, the error shape, deadlines, and the admin port.

mod api_support;

use std::{
    io::{Read, Write},
    time::Duration,
};

use api_support::{Api, send, serve, serve_with_principals, spawn_with};
use base64::Engine;
use reqwest::Method;
use serde_json::json;

const ALICE_TOKEN: &str = "alice-backend-token-0123456789";
const BOB_TOKEN: &str = "bob-backend-token-0123456789";

#[tokio::test]
async fn first_start_creates_its_files_and_prints_a_working_token_once() {
    let home = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let envs = [("XDG_DATA_HOME", home.path())];
    // No data-dir, token or key flags: everything comes from the defaults.
    let (mut child, banner) = spawn_with(&[], &envs);
    let data_dir = home.path().join("harness-engine");
    let token = banner
        .token
        .clone()
        .unwrap_or_else(|| panic!("first start prints a token: {:?}", banner.lines));
    for file in ["identity.key", "tokens.yaml", "state.db"] {
        assert!(
            data_dir.join(file).exists(),
            "{file} created in {}",
            data_dir.display()
        );
        assert!(
            banner
                .lines
                .iter()
                .any(|l| l.contains(&data_dir.display().to_string())),
            "paths are printed: {:?}",
            banner.lines
        );
    }
    let tokens_text = std::fs::read_to_string(data_dir.join("tokens.yaml")).unwrap_or_default();
    assert!(
        !tokens_text.contains(&token),
        "the token file holds only a digest"
    );

    let api = Api::new(&banner.api, &token);
    let (binding, _, _) = api.bound("agent-1", "conv-first-start").await;
    let _ = child.kill();
    let _ = child.wait();

    let (mut child, again) = spawn_with(&[], &envs);
    assert_eq!(
        again.token, None,
        "a restart prints no new token: {:?}",
        again.lines
    );
    let api = Api::new(&again.api, &token);
    let r = api.bind("agent-1", "conv-first-start", None).await;
    assert_eq!(
        r.status, 200,
        "the same token and key still work after a restart, and the binding is still there"
    );
    assert_eq!(r.json()["binding_id"].as_str(), Some(binding.as_str()));
    let _ = child.kill();
    let _ = child.wait();
}

#[tokio::test]
async fn a_turn_over_http_follows_the_commit_protocol() {
    let server = serve(&[]);
    let api = Api::new(&server.api, &server.token);

    let created = api.bind("agent-1", "conv-turn", None).await;
    assert_eq!(created.status, 201);
    let again = api.bind("agent-1", "conv-turn", None).await;
    assert_eq!(again.status, 200, "bind is create-or-get");
    assert_eq!(created.json()["binding_id"], again.json()["binding_id"]);
    let binding = created.json()["binding_id"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let fence = (
        created.json()["epoch"].as_u64().unwrap_or(9),
        created.json()["lease_generation"].as_u64().unwrap_or(9),
    );
    assert_eq!(fence, (0, 1));

    let head = api.head(&binding, fence).await;
    assert_eq!(
        (head.status, head.json()["head"].clone()),
        (200, serde_json::Value::Null),
        "no head before the first commit"
    );

    let body = b"\x00\x01checkpoint-one\xff".to_vec();
    let pending = api.write_pending(&binding, fence, "turn-1", &body).await;
    assert_eq!(pending.status, 201);
    let state_id = pending.json()["state_id"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert_eq!(pending.json()["size"].as_u64(), Some(body.len() as u64));
    assert_eq!(
        pending.json()["codec"].as_str(),
        Some("strands-session-v1"),
        "codec defaults from the harness"
    );

    let retry = api.write_pending(&binding, fence, "turn-1", &body).await;
    assert_eq!(
        (retry.status, retry.json()["state_id"].as_str()),
        (201, Some(state_id.as_str())),
        "same key, same body: same reference"
    );
    let mismatch = api
        .write_pending(&binding, fence, "turn-1", b"another body")
        .await;
    assert_eq!(
        (mismatch.status, mismatch.code().as_str()),
        (409, "idempotency_mismatch")
    );

    assert_eq!(
        api.revision(&binding, fence).await,
        0,
        "a pending write is never the head"
    );
    let commit = api.commit(&binding, fence, &state_id, 0, "run-1").await;
    assert_eq!(
        commit.status,
        200,
        "{}",
        String::from_utf8_lossy(&commit.body)
    );
    assert_eq!(commit.json()["revision"].as_u64(), Some(1));
    assert_eq!(
        commit.json()["terminal"]["outcome"].as_str(),
        Some("completed")
    );
    let retried = api.commit(&binding, fence, &state_id, 0, "run-1").await;
    assert_eq!(
        (retried.status, retried.json()["revision"].as_u64()),
        (200, Some(1)),
        "a retried commit returns the head it made"
    );

    let read = send(api.worker(
        Method::GET,
        &format!("/v1/bindings/{binding}/state/bodies/{state_id}"),
        0,
        1,
    ))
    .await;
    assert_eq!(read.status, 200);
    assert_eq!(
        read.header("content-type").as_deref(),
        Some("application/octet-stream")
    );
    assert_eq!(read.body, body, "the opaque body comes back byte for byte");

    // A second turn racing from revision 0 loses the compare-and-set.
    let p2 = api.write_pending(&binding, fence, "turn-2", b"two").await;
    let s2 = p2.json()["state_id"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let stale = api.commit(&binding, fence, &s2, 0, "run-2").await;
    assert_eq!(
        (stale.status, stale.code().as_str()),
        (409, "revision_conflict")
    );
    assert_eq!(stale.json()["details"]["actual"].as_u64(), Some(1));
    assert_eq!(api.revision(&binding, fence).await, 1);

    // The output of run-2 reached the user but its commit is in doubt: mark it.
    let marked = send(
        api.worker(
            Method::POST,
            &format!("/v1/bindings/{binding}/state/uncertain"),
            0,
            1,
        )
        .header("Idempotency-Key", "uncertain-run-2")
        .json(&json!({"run_id": "run-2", "reason": "commit_timeout"})),
    )
    .await;
    assert_eq!(
        marked.status,
        200,
        "{}",
        String::from_utf8_lossy(&marked.body)
    );
    assert_eq!(
        marked.json()["uncertain_runs"][0]["run_id"].as_str(),
        Some("run-2")
    );
    let fenced = api.commit(&binding, fence, &s2, 1, "run-2").await;
    assert_eq!(
        (fenced.status, fenced.code().as_str()),
        (409, "run_uncertain"),
        "nothing commits under an uncertain run"
    );
    assert_eq!(
        api.revision(&binding, fence).await,
        1,
        "the previous head stays"
    );
    assert_eq!(
        api.turn(&binding, fence, b"three", 1, "run-3").await,
        2,
        "other runs go on"
    );

    // Someone reconciled run-2 (checked what the user saw): a control-plane call clears it.
    let reconcile = || {
        api.req(
            Method::POST,
            &format!("/v1/bindings/{binding}/state/uncertain/reconcile"),
        )
        .header("Idempotency-Key", "reconcile-run-2")
        .json(&json!({"run_id": "run-2"}))
    };
    let cleared = send(reconcile()).await;
    assert_eq!(
        cleared.status,
        200,
        "{}",
        String::from_utf8_lossy(&cleared.body)
    );
    assert_eq!(cleared.json()["uncertain_runs"], json!([]));
    let again = send(reconcile()).await;
    assert_eq!(
        (again.status, again.code().as_str()),
        (404, "not_found"),
        "a run that is not uncertain cannot be cleared"
    );
}

#[tokio::test]
async fn stale_fences_are_refused_and_change_nothing() {
    let server = serve(&[]);
    let api = Api::new(&server.api, &server.token);
    let (binding, epoch, generation) = api.bound("agent-1", "conv-fence").await;
    let fence = (epoch, generation);
    assert_eq!(api.turn(&binding, fence, b"one", 0, "run-1").await, 1);

    let old_lease = api
        .write_pending(&binding, (epoch, generation - 1), "late", b"late write")
        .await;
    assert_eq!(
        (old_lease.status, old_lease.code().as_str()),
        (409, "stale_lease")
    );
    assert_eq!(
        old_lease.json()["details"]["current"].as_u64(),
        Some(generation)
    );
    let ahead = api.head(&binding, (epoch, generation + 1)).await;
    assert_eq!(
        (ahead.status, ahead.code().as_str()),
        (409, "stale_lease"),
        "a generation ahead of the fence is refused too"
    );
    let other_epoch = api
        .commit(&binding, (epoch + 1, generation), "ps_x", 1, "run-x")
        .await;
    assert_eq!(
        (other_epoch.status, other_epoch.code().as_str()),
        (409, "stale_epoch")
    );

    let missing = send(api.req(Method::GET, &format!("/v1/bindings/{binding}/state/head"))).await;
    assert_eq!(
        (missing.status, missing.code().as_str()),
        (422, "invalid"),
        "worker calls must carry the fence"
    );
    let garbage = send(
        api.req(Method::GET, &format!("/v1/bindings/{binding}/state/head"))
            .header("Harness-Epoch", "-1")
            .header("Harness-Lease-Generation", "1"),
    )
    .await;
    assert_eq!((garbage.status, garbage.code().as_str()), (422, "invalid"));

    let head = api.head(&binding, fence).await.json();
    assert_eq!(
        head["head"]["revision"].as_u64(),
        Some(1),
        "refused calls changed nothing"
    );
    assert_eq!(head["head"]["run_id"].as_str(), Some("run-1"));
}

#[tokio::test]
async fn principals_reach_only_their_subjects_bindings() {
    let server = serve_with_principals(
        &[
            ("alice-backend", ALICE_TOKEN, &["user:alice"]),
            ("bob-backend", BOB_TOKEN, &["user:bob", "user:carol"]),
        ],
        &[],
    );
    let alice = Api::new(&server.api, ALICE_TOKEN);
    let bob = Api::new(&server.api, BOB_TOKEN);
    let (binding, e, g) = alice.bound("agent-1", "conv-private").await;
    assert_eq!(
        alice
            .turn(&binding, (e, g), b"alice's state", 0, "run-1")
            .await,
        1
    );

    // Bob's calls on Alice's binding look exactly like calls on a binding that does not exist.
    let absent = "hb_00000000000000000000000000000001";
    for id in [binding.as_str(), absent] {
        let r = send(bob.req(Method::GET, &format!("/v1/bindings/{id}"))).await;
        assert_eq!((r.status, r.code().as_str()), (404, "not_found"), "{id}");
    }
    let not_yours = send(bob.req(Method::GET, &format!("/v1/bindings/{binding}")))
        .await
        .json();
    let not_there = send(bob.req(Method::GET, &format!("/v1/bindings/{absent}")))
        .await
        .json();
    assert_eq!(
        not_yours, not_there,
        "identical answers: existence does not leak"
    );

    let write = bob
        .write_pending(&binding, (e, g), "bob-write", b"bob was here")
        .await;
    assert_eq!((write.status, write.code().as_str()), (404, "not_found"));
    let commit = bob
        .commit(&binding, (e, g), "ps_anything", 1, "run-bob")
        .await;
    assert_eq!(commit.status, 404);

    // Naming a subject one may not act for is refused outright.
    let impersonate = bob
        .bind("agent-1", "conv-private", Some("user:alice"))
        .await;
    assert_eq!(
        (impersonate.status, impersonate.code().as_str()),
        (403, "forbidden_scope")
    );
    let read_as_alice = send(
        bob.req(Method::GET, &format!("/v1/bindings/{binding}"))
            .header("Harness-Subject", "user:alice"),
    )
    .await;
    assert_eq!(
        (read_as_alice.status, read_as_alice.code().as_str()),
        (403, "forbidden_scope")
    );
    let ambiguous = bob.bind("agent-1", "conv-bob", None).await;
    assert_eq!(
        (ambiguous.status, ambiguous.code().as_str()),
        (422, "invalid"),
        "several subjects: the caller must name one"
    );
    let named = bob.bind("agent-1", "conv-bob", Some("user:carol")).await;
    assert_eq!(named.status, 201);
    assert_ne!(named.json()["binding_id"].as_str(), Some(binding.as_str()));

    // Unknown and missing credentials.
    let forged = Api::new(&server.api, "alice-backend-token-0123456788");
    let r = forged
        .write_pending(&binding, (e, g), "forged", b"forged")
        .await;
    assert_eq!((r.status, r.code().as_str()), (401, "unauthenticated"));
    assert_eq!(r.header("www-authenticate").as_deref(), Some("Bearer"));
    let anonymous =
        send(api_support::client().get(format!("{}/v1/bindings/{binding}", server.api))).await;
    assert_eq!(
        (anonymous.status, anonymous.code().as_str()),
        (401, "unauthenticated")
    );
    let basic = send(
        api_support::client()
            .get(format!("{}/v1/bindings/{binding}", server.api))
            .basic_auth("alice", Some(ALICE_TOKEN)),
    )
    .await;
    assert_eq!(basic.status, 401, "only the Bearer scheme");

    let head = alice.head(&binding, (e, g)).await.json();
    assert_eq!(
        head["head"]["revision"].as_u64(),
        Some(1),
        "nothing anyone else sent changed Alice's head"
    );
    let body = send(alice.worker(
        Method::GET,
        &format!(
            "/v1/bindings/{binding}/state/bodies/{}",
            head["head"]["state_id"].as_str().unwrap_or("")
        ),
        e,
        g,
    ))
    .await;
    assert_eq!(body.body, b"alice's state");
}

#[tokio::test]
async fn native_objects_and_streams_round_trip() {
    let server = serve(&[]);
    let api = Api::new(&server.api, &server.token);
    let (binding, e, g) = api.bound("agent-1", "conv-native").await;
    let item = |key: &str| format!("/v1/bindings/{binding}/objects/item?key={}", urlencode(key));
    let put = |key: &str, body: &[u8], idem: &str| {
        api.worker(Method::PUT, &item(key), e, g)
            .header("Idempotency-Key", idem.to_owned())
            .header("Content-Type", "application/octet-stream")
            .body(body.to_vec())
    };

    let created =
        send(put("checkpoints/thread-1/0001", b"v1", "p1").header("If-None-Match", "*")).await;
    assert_eq!(
        created.status,
        200,
        "{}",
        String::from_utf8_lossy(&created.body)
    );
    assert_eq!(created.json()["version"].as_u64(), Some(1));
    let retry =
        send(put("checkpoints/thread-1/0001", b"v1", "p1b").header("If-None-Match", "*")).await;
    assert_eq!(
        retry.status, 200,
        "an identical create is an idempotent retry"
    );
    let clash =
        send(put("checkpoints/thread-1/0001", b"other", "p2").header("If-None-Match", "*")).await;
    assert_eq!((clash.status, clash.code().as_str()), (409, "conflict"));
    let replaced =
        send(put("checkpoints/thread-1/0001", b"v2", "p3").header("If-Match", "\"1\"")).await;
    assert_eq!(replaced.json()["version"].as_u64(), Some(2));
    let lost_update =
        send(put("checkpoints/thread-1/0001", b"v3", "p4").header("If-Match", "\"1\"")).await;
    assert_eq!(
        lost_update.status, 409,
        "a replace of an old version is refused"
    );
    assert_eq!(
        send(put("checkpoints/thread-1/0002", b"second", "p5"))
            .await
            .status,
        200,
        "no precondition: upsert"
    );

    let got = send(api.worker(Method::GET, &item("checkpoints/thread-1/0001"), e, g)).await;
    assert_eq!(
        (
            got.status,
            got.body.as_slice(),
            got.header("etag").as_deref()
        ),
        (200, b"v2".as_slice(), Some("\"2\""))
    );
    let missing = send(api.worker(Method::GET, &item("checkpoints/none"), e, g)).await;
    assert_eq!(
        (missing.status, missing.code().as_str()),
        (404, "not_found")
    );

    let list = send(api.worker(
        Method::GET,
        &format!(
            "/v1/bindings/{binding}/objects?prefix=checkpoints/thread-1/&with_bodies=true&limit=1"
        ),
        e,
        g,
    ))
    .await;
    assert_eq!(list.status, 200);
    let page = list.json();
    assert_eq!(
        page["objects"][0]["key"].as_str(),
        Some("checkpoints/thread-1/0002"),
        "keys descend"
    );
    assert_eq!(
        page["objects"][0]["body"].as_str(),
        Some(
            base64::engine::general_purpose::STANDARD
                .encode(b"second")
                .as_str()
        )
    );
    let before = page["next_before"].as_str().unwrap_or_default().to_owned();
    let next = send(api.worker(
        Method::GET,
        &format!(
            "/v1/bindings/{binding}/objects?prefix=checkpoints/thread-1/&before={}",
            urlencode(&before)
        ),
        e,
        g,
    ))
    .await
    .json();
    assert_eq!(
        next["objects"][0]["key"].as_str(),
        Some("checkpoints/thread-1/0001")
    );
    assert!(
        next["objects"][0].get("body").is_none(),
        "bodies only when asked"
    );

    let deleted = send(
        api.worker(
            Method::DELETE,
            &format!("/v1/bindings/{binding}/objects?prefix=checkpoints/"),
            e,
            g,
        )
        .header("Idempotency-Key", "d1"),
    )
    .await;
    assert_eq!(deleted.json()["deleted"].as_u64(), Some(2));

    let entries = |ids: &[&str]| json!({"entries": ids.iter().map(|id| json!({"id": id, "body": base64::engine::general_purpose::STANDARD.encode(format!("body of {id}"))})).collect::<Vec<_>>()});
    let append = |stream: &str, ids: &[&str], idem: &str| {
        api.worker(
            Method::POST,
            &format!(
                "/v1/bindings/{binding}/streams/entries?stream={}",
                urlencode(stream)
            ),
            e,
            g,
        )
        .header("Idempotency-Key", idem.to_owned())
        .json(&entries(ids))
    };
    let first = send(append("session/main", &["u1", "u2"], "a1")).await;
    assert_eq!(
        first.status,
        200,
        "{}",
        String::from_utf8_lossy(&first.body)
    );
    assert_eq!(
        (
            first.json()["appended"].as_u64(),
            first.json()["last_seq"].as_u64()
        ),
        (Some(2), Some(2))
    );
    let dup = send(append("session/main", &["u2", "u3"], "a2"))
        .await
        .json();
    assert_eq!(
        (dup["appended"].as_u64(), dup["duplicates"].as_u64()),
        (Some(1), Some(1)),
        "entries are de-duplicated by id"
    );
    assert_eq!(
        send(append("session/main/sub", &["s1"], "a3")).await.status,
        200
    );

    let loaded = send(api.worker(
        Method::GET,
        &format!("/v1/bindings/{binding}/streams/entries?stream=session/main&after=1"),
        e,
        g,
    ))
    .await
    .json();
    let ids: Vec<&str> = loaded["entries"]
        .as_array()
        .map(|a| a.iter().filter_map(|x| x["id"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(ids, ["u2", "u3"]);
    assert_eq!(
        loaded["entries"][0]["body"].as_str(),
        Some(
            base64::engine::general_purpose::STANDARD
                .encode("body of u2")
                .as_str()
        )
    );
    let streams = send(api.worker(
        Method::GET,
        &format!("/v1/bindings/{binding}/streams?prefix=session/"),
        e,
        g,
    ))
    .await
    .json();
    assert_eq!(streams["streams"].as_array().map(Vec::len), Some(2));
    let bad_b64 = send(
        api.worker(
            Method::POST,
            &format!("/v1/bindings/{binding}/streams/entries?stream=s"),
            e,
            g,
        )
        .header("Idempotency-Key", "a4")
        .json(&json!({"entries": [{"id": "x", "body": "not base64!"}]})),
    )
    .await;
    assert_eq!((bad_b64.status, bad_b64.code().as_str()), (422, "invalid"));

    let dropped = send(
        api.worker(
            Method::DELETE,
            &format!("/v1/bindings/{binding}/streams?stream=session/main"),
            e,
            g,
        )
        .header("Idempotency-Key", "d2"),
    )
    .await;
    assert_eq!(
        dropped.json()["deleted"].as_u64(),
        Some(4),
        "the stream and its sub-streams"
    );
}

#[tokio::test]
async fn an_interrupt_is_committed_with_the_head_and_resumed_once() {
    let server = serve(&[]);
    let api = Api::new(&server.api, &server.token);
    let (binding, e, g) = api.bound("agent-1", "conv-interrupt").await;
    let pending = api
        .write_pending(&binding, (e, g), "w1", b"waiting for approval")
        .await;
    let state_id = pending.json()["state_id"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let commit = send(api.worker(Method::POST, &format!("/v1/bindings/{binding}/state/commit"), e, g).header("Idempotency-Key", "c1").json(&json!({
        "state_id": state_id, "expected_revision": 0, "run_id": "run-1",
        "terminal": {"outcome": "interrupted"},
        "interrupt": {"interrupt_id": "int-1", "type": "tool_approval", "allowed_decisions": ["approve", "reject"], "body": {"tool": "send_email"}}
    })))
    .await;
    assert_eq!(
        commit.status,
        200,
        "{}",
        String::from_utf8_lossy(&commit.body)
    );

    let got = send(api.req(Method::GET, &format!("/v1/bindings/{binding}/interrupt")))
        .await
        .json();
    assert_eq!(got["interrupt"]["interrupt_id"].as_str(), Some("int-1"));
    assert_eq!(got["interrupt"]["type"].as_str(), Some("tool_approval"));
    let revision = got["interrupt"]["revision"].as_u64().unwrap_or(0);
    assert_eq!(revision, 1, "stamped with the commit's revision");

    let resume = |key: &str, decision: &str| {
        api.req(Method::POST, &format!("/v1/bindings/{binding}/interrupt/resume"))
            .header("Idempotency-Key", key.to_owned())
            .json(&json!({"interrupt_id": "int-1", "revision": revision, "decision": decision, "response": {"note": "ok"}}))
    };
    let bad_decision = send(resume("r0", "maybe")).await;
    assert!(
        bad_decision.status == 409 || bad_decision.status == 422,
        "a decision outside allowed_decisions: {}",
        bad_decision.status
    );
    let first = send(resume("r1", "approve")).await;
    assert_eq!(
        first.status,
        200,
        "{}",
        String::from_utf8_lossy(&first.body)
    );
    let again = send(resume("r1", "approve")).await;
    assert_eq!(
        (again.status, again.json()["resumed_at_ms"].clone()),
        (200, first.json()["resumed_at_ms"].clone()),
        "a retry returns the first outcome"
    );
    let second = send(resume("r2", "approve")).await;
    assert_eq!(
        second.status, 409,
        "a consumed interrupt cannot be resumed again"
    );
    let after = send(api.req(Method::GET, &format!("/v1/bindings/{binding}/interrupt")))
        .await
        .json();
    assert_eq!(after["interrupt"], serde_json::Value::Null);
}

#[tokio::test]
async fn every_refusal_is_the_json_error_shape() {
    let server = serve(&[]);
    let api = Api::new(&server.api, &server.token);
    let (binding, e, g) = api.bound("agent-1", "conv-errors").await;

    let no_route = send(api.req(Method::GET, "/v2/nothing")).await;
    assert_eq!(
        (no_route.status, no_route.code().as_str()),
        (404, "not_found")
    );
    let wrong_method = send(api.req(Method::PATCH, "/v1/bindings")).await;
    assert_eq!(
        (wrong_method.status, wrong_method.code().as_str()),
        (405, "method_not_allowed")
    );
    let wrong_type = send(
        api.req(Method::POST, "/v1/bindings")
            .header("Idempotency-Key", "k")
            .header("Content-Type", "text/plain")
            .body("{}"),
    )
    .await;
    assert_eq!(
        (wrong_type.status, wrong_type.code().as_str()),
        (415, "unsupported_media_type")
    );
    let bad_json = send(
        api.req(Method::POST, "/v1/bindings")
            .header("Idempotency-Key", "k")
            .header("Content-Type", "application/json")
            .body("{\"agent_id\":"),
    )
    .await;
    assert_eq!(
        (bad_json.status, bad_json.code().as_str()),
        (422, "invalid")
    );
    let unknown_field = send(api.req(Method::POST, "/v1/bindings").header("Idempotency-Key", "k").json(&json!({"agent_id": "a", "conversation_id": "c", "harness": "strands", "owner": "me"}))).await;
    assert_eq!(
        unknown_field.status, 422,
        "unknown fields are refused, not ignored"
    );
    let bad_harness = send(
        api.req(Method::POST, "/v1/bindings")
            .header("Idempotency-Key", "k")
            .json(&json!({"agent_id": "a", "conversation_id": "c", "harness": "bash"})),
    )
    .await;
    assert_eq!(bad_harness.status, 422);
    let bad_ids = api.bind("-agent", "conv", None).await;
    assert_eq!((bad_ids.status, bad_ids.code().as_str()), (422, "invalid"));
    let no_key = send(
        api.req(Method::POST, "/v1/bindings")
            .json(&json!({"agent_id": "a", "conversation_id": "c", "harness": "strands"})),
    )
    .await;
    assert_eq!(
        (no_key.status, no_key.code().as_str()),
        (422, "invalid"),
        "Idempotency-Key is required"
    );
    let long_key = send(
        api.req(Method::POST, "/v1/bindings")
            .header("Idempotency-Key", "k".repeat(256))
            .json(&json!({"agent_id": "a", "conversation_id": "c", "harness": "strands"})),
    )
    .await;
    assert_eq!(long_key.status, 422);
    let bad_id = send(api.req(Method::GET, "/v1/bindings/not-an-id")).await;
    assert_eq!((bad_id.status, bad_id.code().as_str()), (404, "not_found"));
    let bad_query = send(api.worker(
        Method::GET,
        &format!("/v1/bindings/{binding}/streams/entries?stream=s&after=minus-one"),
        e,
        g,
    ))
    .await;
    assert_eq!(
        (bad_query.status, bad_query.code().as_str()),
        (422, "invalid")
    );
    let missing_query = send(api.worker(
        Method::GET,
        &format!("/v1/bindings/{binding}/objects/item"),
        e,
        g,
    ))
    .await;
    assert_eq!(missing_query.status, 422);
    let bad_if_match = send(
        api.worker(
            Method::PUT,
            &format!("/v1/bindings/{binding}/objects/item?key=k"),
            e,
            g,
        )
        .header("Idempotency-Key", "k")
        .header("If-Match", "v1")
        .header("Content-Type", "application/octet-stream")
        .body("x"),
    )
    .await;
    assert_eq!(bad_if_match.status, 422);

    // Bodies are bounded: the default state limit is 4 MiB (plus a little slack for framing).
    let huge = vec![b'x'; (4 << 20) + (64 << 10) + 1];
    let too_large = api.write_pending(&binding, (e, g), "huge", &huge).await;
    assert_eq!(
        (too_large.status, too_large.code().as_str()),
        (413, "too_large")
    );
    let just_over_state = vec![b'x'; (4 << 20) + 1];
    let over = api
        .write_pending(&binding, (e, g), "over", &just_over_state)
        .await;
    assert_eq!(
        (over.status, over.code().as_str()),
        (413, "too_large"),
        "the store's exact limit"
    );
    let long_object_key = send(api.worker(
        Method::GET,
        &format!(
            "/v1/bindings/{binding}/objects/item?key={}",
            "k".repeat(600)
        ),
        e,
        g,
    ))
    .await;
    assert_eq!(
        (long_object_key.status, long_object_key.code().as_str()),
        (413, "too_large")
    );

    // traceparent is accepted when valid and ignored when not; it never decides anything.
    for tp in [
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "garbage",
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
    ] {
        let r = send(
            api.req(Method::GET, &format!("/v1/bindings/{binding}"))
                .header("traceparent", tp),
        )
        .await;
        assert_eq!(r.status, 200, "traceparent {tp:?}");
    }
    let no_auth_with_trace = send(
        api_support::client()
            .get(format!("{}/v1/bindings/{binding}", server.api))
            .header(
                "traceparent",
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            ),
    )
    .await;
    assert_eq!(
        no_auth_with_trace.status, 401,
        "trace context is not authority"
    );
    assert_eq!(
        api.revision(&binding, (e, g)).await,
        0,
        "no refused write left anything behind"
    );
}

#[tokio::test]
async fn a_request_past_its_deadline_gets_504_timeout() {
    let server = serve(&["--request-timeout-ms", "300"]);
    let host = server.api.trim_start_matches("http://").to_owned();
    let token = server.token.clone();
    let reply = tokio::task::spawn_blocking(move || {
        // A client that announces a body and sends only half of it: the handler waits for
        // the rest until the deadline cuts it off.
        let mut stream = std::net::TcpStream::connect(&host).unwrap_or_else(|e| panic!("{e}"));
        let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
        let head = format!(
            "POST /v1/bindings HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\nIdempotency-Key: slow\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"agent_id\":"
        );
        stream.write_all(head.as_bytes()).unwrap_or_else(|e| panic!("{e}"));
        let mut buf = vec![0u8; 4096];
        let n = stream.read(&mut buf).unwrap_or(0);
        String::from_utf8_lossy(&buf[..n]).into_owned()
    })
    .await
    .unwrap_or_default();
    assert!(reply.starts_with("HTTP/1.1 504"), "{reply}");
    assert!(reply.contains("\"code\":\"timeout\""), "{reply}");
}

#[tokio::test]
async fn the_admin_port_serves_probes_and_metrics() {
    let server = serve(&[]);
    let api = Api::new(&server.api, &server.token);
    let http = api_support::client();
    let live = send(http.get(format!("{}/live", server.admin))).await;
    assert_eq!(live.status, 200);
    let ready = send(http.get(format!("{}/ready", server.admin))).await;
    assert_eq!(ready.status, 200);
    assert_eq!(
        send(http.get(format!("{}/v1/bindings", server.admin)))
            .await
            .status,
        404,
        "the admin port serves no API"
    );
    assert_eq!(
        send(http.get(format!("{}/metrics", server.api)))
            .await
            .status,
        404,
        "the API port serves no metrics"
    );

    let (binding, e, g) = api.bound("agent-1", "conv-metrics").await;
    let stale = api.head(&binding, (e, g + 7)).await;
    assert_eq!(stale.status, 409);
    let metrics = send(http.get(format!("{}/metrics", server.admin))).await;
    assert_eq!(metrics.status, 200);
    let text = String::from_utf8_lossy(&metrics.body).into_owned();
    assert!(text.contains("harness_engine_http_requests_total{route=\"/v1/bindings\",method=\"POST\",status_class=\"2xx\"} 1"), "{text}");
    assert!(
        text.contains(
            "route=\"/v1/bindings/{binding_id}/state/head\",method=\"GET\",status_class=\"4xx\""
        ),
        "routes are templates, never ids: {text}"
    );
    assert!(!text.contains(&binding), "no binding id in metrics");
    assert!(
        text.contains("harness_engine_http_request_duration_seconds_bucket"),
        "{text}"
    );
    assert!(
        text.contains("harness_engine_store_errors_total{code=\"stale_lease\"} 1"),
        "{text}"
    );
}

#[tokio::test]
async fn the_served_document_is_the_committed_one() {
    let server = serve(&[]);
    let served = send(api_support::client().get(format!("{}/openapi.json", server.api))).await;
    assert_eq!(served.status, 200);
    let committed = std::fs::read(api_support_repo("docs/openapi.json")).unwrap_or_default();
    assert_eq!(
        String::from_utf8_lossy(&served.body),
        String::from_utf8_lossy(&committed),
        "run `make openapi` and commit docs/openapi.json"
    );
}

fn api_support_repo(rel: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[tokio::test]
async fn an_inline_commit_writes_and_commits_in_one_call() {
    let server = serve(&[]);
    let api = Api::new(&server.api, &server.token);
    let (binding, epoch, generation) = api.bound("agent-1", "conv-inline").await;
    let fence = (epoch, generation);
    let inline = |key: &'static str, body: &'static [u8], expected: u64, run: &str| {
        api.worker(
            Method::POST,
            &format!(
                "/v1/bindings/{binding}/state/commit-inline?expected_revision={expected}&run_id={run}"
            ),
            fence.0,
            fence.1,
        )
        .header("Idempotency-Key", key)
        .header("Content-Type", "application/octet-stream")
        .body(body)
    };

    let first = send(inline("inline-1", b"one", 0, "run-1")).await;
    assert_eq!(
        first.status,
        200,
        "{}",
        String::from_utf8_lossy(&first.body)
    );
    assert_eq!(first.json()["revision"].as_u64(), Some(1));
    let state_id = first.json()["state_id"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let stored = send(api.worker(
        Method::GET,
        &format!("/v1/bindings/{binding}/state/bodies/{state_id}"),
        fence.0,
        fence.1,
    ))
    .await;
    assert_eq!(
        stored.body,
        b"one".to_vec(),
        "the head's body is the one sent"
    );

    let retry = send(inline("inline-1", b"one", 0, "run-1")).await;
    assert_eq!(
        (retry.status, retry.json()["revision"].as_u64()),
        (200, Some(1)),
        "a retry of a commit that landed returns the head it made"
    );

    let stale = send(inline("inline-2", b"two", 0, "run-2")).await;
    assert_eq!(
        (stale.status, stale.code().as_str()),
        (409, "revision_conflict")
    );
    assert_eq!(stale.json()["details"]["actual"].as_u64(), Some(1));
    // The refused commit stored nothing: its key is free for another body.
    let reused = send(inline("inline-2", b"three", 1, "run-3")).await;
    assert_eq!(
        (reused.status, reused.json()["revision"].as_u64()),
        (200, Some(2)),
        "{}",
        String::from_utf8_lossy(&reused.body)
    );

    let fenced = send(
        api.worker(
            Method::POST,
            &format!("/v1/bindings/{binding}/state/commit-inline?expected_revision=2&run_id=run-4"),
            fence.0,
            fence.1 - 1,
        )
        .header("Idempotency-Key", "inline-4")
        .header("Content-Type", "application/octet-stream")
        .body(&b"four"[..]),
    )
    .await;
    assert_eq!(
        (fenced.status, fenced.code().as_str()),
        (409, "stale_lease")
    );
    assert_eq!(api.revision(&binding, fence).await, 2);

    let indexed = send(
        api.worker(
            Method::POST,
            &format!(
                "/v1/bindings/{binding}/state/commit-inline?expected_revision=2&run_id=run-5&index_key=cp%2Ffive"
            ),
            fence.0,
            fence.1,
        )
        .header("Idempotency-Key", "inline-5")
        .header("Content-Type", "application/octet-stream")
        .body(&b"five"[..]),
    )
    .await;
    assert_eq!(indexed.json()["revision"].as_u64(), Some(3));
    let object = send(api.worker(
        Method::GET,
        &format!("/v1/bindings/{binding}/objects/item?key=cp%2Ffive"),
        fence.0,
        fence.1,
    ))
    .await;
    assert_eq!(
        (object.status, object.body.clone()),
        (200, b"five".to_vec()),
        "index_key stores the committed body as that object"
    );
}
