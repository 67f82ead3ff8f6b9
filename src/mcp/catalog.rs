//! The public MCP tool surface (`spec/003_bab976795353d872.txt` "Public MCP Surface"):
//! the 17 tools in their canonical order, each with its JSON schema, and the digest of
//! the whole list. `tools/list` answers exactly this, for every client; the committed
//! copy (`docs/mcp-tools.json`) is compared with it by a test, so a change to the surface
//! is a reviewed change to that file.

use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

use crate::domain::ledger::canonical_json;

/// The canonical order. Memory and change tools, run tools, signal tools.
pub const PUBLIC_TOOL_ORDER: [&str; 17] = [
    "store",
    "recall",
    "browse",
    "stats",
    "forget",
    "feedback",
    "promote",
    "annotate",
    "revise",
    "export",
    "begin_run",
    "record_run_event",
    "get_run",
    "complete_run",
    "claim_signal",
    "extend_signal_lease",
    "ack_signal",
];

/// One tool: what `tools/list` says about it.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolSpec {
    pub name: &'static str,
    pub title: &'static str,
    pub description: &'static str,
    pub input_schema: Map<String, Value>,
    /// Changes nothing (MCP `readOnlyHint`).
    pub read_only: bool,
    /// A retry with the same arguments changes nothing more (MCP `idempotentHint`).
    pub idempotent: bool,
    /// May remove or overwrite what exists (MCP `destructiveHint`).
    pub destructive: bool,
}

fn workspace() -> Value {
    json!({
        "type": "string",
        "minLength": 1,
        "maxLength": 128,
        "description": "The workspace: a binding id (hb_ and 32 hex digits) the caller may use. Every call names it; the server keeps no current workspace."
    })
}

/// The compare-and-set preconditions of a governed-v2 event.
fn preconditions() -> Value {
    json!({
        "type": "object",
        "description": "Required for schema_version 2.",
        "properties": {
            "epoch": {"type": "integer", "minimum": 0},
            "generation": {"type": "integer", "minimum": 0},
            "run_last_seq": {"type": "integer", "minimum": 0},
            "status": {"type": "string", "maxLength": 32}
        },
        "required": ["epoch", "generation", "run_last_seq", "status"],
        "additionalProperties": false
    })
}

fn idempotency() -> Value {
    json!({
        "type": "string",
        "minLength": 1,
        "maxLength": 255,
        "description": "Caller-generated key of this mutation (only its digest is stored). The same key with the same arguments returns the original record; with other arguments it fails with idempotency_mismatch."
    })
}

fn scope() -> Value {
    json!({"type": "string", "enum": ["user", "agent", "organization"],
           "description": "Memory scope: user (this subject and agent), agent (shared learning of the agent), organization."})
}

fn memory_key() -> Value {
    json!({"type": "string", "minLength": 1, "maxLength": 256,
           "description": "The memory's key within the scope: /-separated segments."})
}

fn run_id() -> Value {
    json!({"type": "string", "pattern": "^run_[0-9a-f]{32}$",
           "description": "The run handle minted by begin_run."})
}

fn labels() -> Value {
    json!({
        "type": "object",
        "description": "Caller-declared provenance (agent, model, harness, thread, client, evaluator): recorded, never identity.",
        "properties": {
            "agent": {"type": "string", "maxLength": 256},
            "model": {"type": "string", "maxLength": 256},
            "harness": {"type": "string", "maxLength": 256},
            "thread": {"type": "string", "maxLength": 256},
            "client": {"type": "string", "maxLength": 256},
            "evaluator": {"type": "string", "maxLength": 256}
        },
        "additionalProperties": false
    })
}

fn object(properties: Value, required: &[&str]) -> Map<String, Value> {
    let mut schema = Map::new();
    schema.insert("type".into(), json!("object"));
    schema.insert("properties".into(), properties);
    schema.insert("required".into(), json!(required));
    schema.insert("additionalProperties".into(), json!(false));
    schema
}

const OUTCOMES: [&str; 8] = [
    "resolved",
    "partially_resolved",
    "handed_to_human",
    "abandoned",
    "failed",
    "verified_success",
    "user_corrected",
    "regression",
];

/// Every tool, in [`PUBLIC_TOOL_ORDER`].
pub fn tools() -> Vec<ToolSpec> {
    let t = |name, title, description, input_schema, read_only, idempotent, destructive| ToolSpec {
        name,
        title,
        description,
        input_schema,
        read_only,
        idempotent,
        destructive,
    };
    vec![
        t(
            "store",
            "Store a memory",
            "Propose a long-term memory in a scope of the workspace's memory context. The governed write pipeline applies: the content is scanned, secrets are redacted, content that claims authority is refused, and the scope's policy may hold it for approval.",
            object(
                json!({
                    "workspace_key": workspace(),
                    "scope": scope(),
                    "key": memory_key(),
                    "content": {"type": "string", "minLength": 1, "description": "The memory text (bounded by the deployment, 16 KiB by default)."},
                    "kind": {"type": "string", "enum": ["semantic", "episodic_reference", "procedural"], "default": "semantic"},
                    "media_type": {"type": "string", "enum": ["text/plain", "text/markdown", "application/json"]},
                    "importance": {"type": "number", "minimum": 0, "maximum": 1},
                    "embedding": {"type": "array", "items": {"type": "number"}, "maxItems": 4096},
                    "run_id": run_id(),
                    "idempotency_key": idempotency()
                }),
                &[
                    "workspace_key",
                    "scope",
                    "key",
                    "content",
                    "idempotency_key",
                ],
            ),
            false,
            true,
            false,
        ),
        t(
            "recall",
            "Recall memories",
            "Search the workspace's memory: the namespace filter and authorization apply before ranking. Returns ranked results and a signed recall receipt (namespace, results, ranks, exact content versions, database epoch) that later run events cite.",
            object(
                json!({
                    "workspace_key": workspace(),
                    "query": {"type": "string", "maxLength": 4096},
                    "scopes": {"type": "array", "items": scope(), "uniqueItems": true},
                    "kinds": {"type": "array", "items": {"type": "string", "enum": ["semantic", "episodic_reference", "procedural"]}, "uniqueItems": true},
                    "limit": {"type": "integer", "minimum": 1, "maximum": 100},
                    "embedding": {"type": "array", "items": {"type": "number"}, "maxItems": 4096},
                    "budget_tokens": {"type": "integer", "minimum": 1}
                }),
                &["workspace_key"],
            ),
            true,
            true,
            false,
        ),
        t(
            "browse",
            "Browse memories",
            "List the memories of one scope by key, a page at a time, without ranking.",
            object(
                json!({
                    "workspace_key": workspace(),
                    "scope": scope(),
                    "after_key": {"type": "string", "maxLength": 256, "description": "Start after this key (the previous page's next_after_key)."},
                    "limit": {"type": "integer", "minimum": 1, "maximum": 200}
                }),
                &["workspace_key", "scope"],
            ),
            true,
            true,
            false,
        ),
        t(
            "stats",
            "Memory statistics",
            "Count the workspace's memories per scope and approval status, with the workspace's memory_utility_shadow: per memory, the runs that source-linked it with the current feedback and have an outcome (review evidence only; it never changes recall order, authority or policy).",
            object(json!({"workspace_key": workspace()}), &["workspace_key"]),
            true,
            true,
            false,
        ),
        t(
            "forget",
            "Forget a memory",
            "Delete one memory at the revision the caller last saw (compare-and-set); audited.",
            object(
                json!({
                    "workspace_key": workspace(),
                    "scope": scope(),
                    "key": memory_key(),
                    "expected_revision": {"type": "integer", "minimum": 1},
                    "idempotency_key": idempotency()
                }),
                &[
                    "workspace_key",
                    "scope",
                    "key",
                    "expected_revision",
                    "idempotency_key",
                ],
            ),
            false,
            true,
            true,
        ),
        t(
            "feedback",
            "Give feedback on a recalled memory",
            "Record whether a memory from a signed recall receipt helped. Feedback is review evidence only: it never changes recall order, authority or policy.",
            object(
                json!({
                    "workspace_key": workspace(),
                    "receipt": {"type": "string", "minLength": 1, "maxLength": 16384, "description": "The receipt recall returned."},
                    "memory_id": {"type": "string", "pattern": "^hm_[0-9a-f]{32}$"},
                    "rank": {"type": "integer", "minimum": 1},
                    "signal": {"type": "string", "enum": ["helpful", "misleading", "outdated"]},
                    "idempotency_key": idempotency()
                }),
                &[
                    "workspace_key",
                    "receipt",
                    "memory_id",
                    "rank",
                    "signal",
                    "idempotency_key",
                ],
            ),
            false,
            true,
            false,
        ),
        t(
            "promote",
            "Propose a promotion",
            "Propose copying a memory to a wider scope (user to agent or organization). Never automatic: the copy waits for an approver.",
            object(
                json!({
                    "workspace_key": workspace(),
                    "scope": scope(),
                    "key": memory_key(),
                    "to_scope": scope(),
                    "idempotency_key": idempotency()
                }),
                &[
                    "workspace_key",
                    "scope",
                    "key",
                    "to_scope",
                    "idempotency_key",
                ],
            ),
            false,
            true,
            false,
        ),
        t(
            "annotate",
            "Annotate a memory",
            "Attach a short note to a memory without changing its content version; audited.",
            object(
                json!({
                    "workspace_key": workspace(),
                    "scope": scope(),
                    "key": memory_key(),
                    "note": {"type": "string", "minLength": 1, "maxLength": 2048},
                    "idempotency_key": idempotency()
                }),
                &["workspace_key", "scope", "key", "note", "idempotency_key"],
            ),
            false,
            true,
            false,
        ),
        t(
            "revise",
            "Revise a memory",
            "Replace a memory's content at the revision the caller last saw (compare-and-set), through the same governed pipeline as store.",
            object(
                json!({
                    "workspace_key": workspace(),
                    "scope": scope(),
                    "key": memory_key(),
                    "content": {"type": "string", "minLength": 1},
                    "expected_revision": {"type": "integer", "minimum": 1},
                    "kind": {"type": "string", "enum": ["semantic", "episodic_reference", "procedural"], "default": "semantic"},
                    "importance": {"type": "number", "minimum": 0, "maximum": 1},
                    "idempotency_key": idempotency()
                }),
                &[
                    "workspace_key",
                    "scope",
                    "key",
                    "content",
                    "expected_revision",
                    "idempotency_key",
                ],
            ),
            false,
            true,
            true,
        ),
        t(
            "export",
            "Export memories",
            "Export the admitted memories of one scope with their provenance, a page at a time.",
            object(
                json!({
                    "workspace_key": workspace(),
                    "scope": scope(),
                    "after_key": {"type": "string", "maxLength": 256},
                    "limit": {"type": "integer", "minimum": 1, "maximum": 200}
                }),
                &["workspace_key", "scope"],
            ),
            true,
            true,
            false,
        ),
        t(
            "begin_run",
            "Begin a run",
            "Begin a run in the workspace. The server mints a high-entropy run_id and a root work_item_id and keeps no current run: every later call names the workspace and the run, so runs interleave on one connection and resume after a reconnect with these two alone.",
            object(
                json!({
                    "workspace_key": workspace(),
                    "idempotency_key": idempotency(),
                    "goal_digest": {"type": "string", "maxLength": 128, "description": "A digest of the goal (never the raw prompt)."},
                    "labels": labels()
                }),
                &["workspace_key", "idempotency_key"],
            ),
            false,
            true,
            false,
        ),
        t(
            "record_run_event",
            "Record a run event",
            "Append one event to a run: work items (work_item_created under an active parent, work_item_started, _blocked, _completed, _failed, _abandoned), artifact_created (a reference: sha256, mime_type, uri), memory attribution (memory_recalled with memory_attribution {receipt, selected: [{memory_id, rank}]} from a recall's signed receipt; memory_applied and memory_rejected with {source: {recalled_seq, memory_id, rank, feedback_seq?}} (feedback_seq: the current feedback on that exposure) or {manual: {memory_id, exact_content_version}}), effects and reviews (EffectAttempted, EffectOutcomeObserved, HumanReviewRequested), guardrails and context reports. Version-1 events or governed-v2 events, which carry epoch, generation, the run's last sequence and the expected status, and are refused without an append when any is stale. Payloads are bounded to 32 KiB; raw transcripts and hidden reasoning are refused.",
            object(
                json!({
                    "workspace_key": workspace(),
                    "run_id": run_id(),
                    "idempotency_key": idempotency(),
                    "type": {"type": "string", "enum": [
                        "work_item_created", "work_item_started", "work_item_blocked",
                        "work_item_completed", "work_item_failed", "work_item_abandoned",
                        "artifact_created", "memory_recalled", "memory_applied",
                        "memory_rejected", "ContextAssembled", "GuardrailEvaluated",
                        "EffectAttempted", "EffectOutcomeObserved", "HumanReviewRequested",
                        "verification_preflight_approved", "verification_evaluated"
                    ]},
                    "payload": {"type": "object", "description": "The type's fields (docs/ledger.md \"Vocabulary\")."},
                    "turn_id": {"type": "string", "minLength": 1, "maxLength": 256, "description": "Default: the payload's work_item_id, else the run's root work item."},
                    "schema_version": {"type": "integer", "enum": [1, 2], "default": 1},
                    "preconditions": preconditions(),
                    "labels": labels()
                }),
                &[
                    "workspace_key",
                    "run_id",
                    "idempotency_key",
                    "type",
                    "payload",
                ],
            ),
            false,
            true,
            false,
        ),
        t(
            "get_run",
            "Read a run",
            "Read a run in one snapshot: its events after since_sequence, its work tree, artifacts and outcome head, snapshot_epoch, snapshot_last_sequence, projection_health and degraded. Read-only; it keeps serving while mutating writes fail closed on a degraded projection.",
            object(
                json!({
                    "workspace_key": workspace(),
                    "run_id": run_id(),
                    "since_sequence": {"type": "integer", "minimum": 0, "default": 0},
                    "limit": {"type": "integer", "minimum": 1, "maximum": 1000}
                }),
                &["workspace_key", "run_id"],
            ),
            true,
            true,
            false,
        ),
        t(
            "complete_run",
            "Complete a run",
            "Record a run's outcome, or with correction: true a superseding correction of it (terminal_at is kept). Every work item must be terminal first. regression_of_run_id if and only if the outcome is regression. A version-1 verified_success reads as legacy_declared; a governed-v2 verified_success (schema_version 2 with preconditions) presents the verification_receipt a passing verification_evaluated returned, and is strong only while that evaluation, its preflight and the run's artifacts are current.",
            object(
                json!({
                    "workspace_key": workspace(),
                    "run_id": run_id(),
                    "idempotency_key": idempotency(),
                    "outcome": {"type": "string", "enum": OUTCOMES},
                    "regression_of_run_id": {"type": "string", "maxLength": 256},
                    "reason": {"type": "string", "maxLength": 4096},
                    "correction": {"type": "boolean", "default": false},
                    "schema_version": {"type": "integer", "enum": [1, 2], "default": 1},
                    "preconditions": preconditions(),
                    "verification_receipt": {"type": "string", "maxLength": 4096, "description": "The server-minted receipt of a passing verification_evaluated (governed-v2 verified_success only)."},
                    "labels": labels()
                }),
                &["workspace_key", "run_id", "idempotency_key", "outcome"],
            ),
            false,
            true,
            false,
        ),
        t(
            "claim_signal",
            "Claim a signal",
            "Claim a leased coordination signal of the workspace (a blackboard claim). At most one holder at a time; an expired lease may be taken over, with a higher fencing token.",
            object(
                json!({
                    "workspace_key": workspace(),
                    "signal_id": {"type": "string", "minLength": 1, "maxLength": 256},
                    "holder": {"type": "string", "minLength": 1, "maxLength": 256, "description": "Caller-declared holder label (provenance)."},
                    "lease_seconds": {"type": "integer", "minimum": 1, "maximum": 3600},
                    "idempotency_key": idempotency()
                }),
                &[
                    "workspace_key",
                    "signal_id",
                    "holder",
                    "lease_seconds",
                    "idempotency_key",
                ],
            ),
            false,
            true,
            false,
        ),
        t(
            "extend_signal_lease",
            "Extend a signal lease",
            "Extend the lease of a signal the caller holds, named by its fencing token; refused once another holder took it over.",
            object(
                json!({
                    "workspace_key": workspace(),
                    "signal_id": {"type": "string", "minLength": 1, "maxLength": 256},
                    "fencing_token": {"type": "integer", "minimum": 1},
                    "lease_seconds": {"type": "integer", "minimum": 1, "maximum": 3600},
                    "idempotency_key": idempotency()
                }),
                &[
                    "workspace_key",
                    "signal_id",
                    "fencing_token",
                    "lease_seconds",
                    "idempotency_key",
                ],
            ),
            false,
            true,
            false,
        ),
        t(
            "ack_signal",
            "Acknowledge a signal",
            "Acknowledge (release as done) a signal the caller holds, named by its fencing token.",
            object(
                json!({
                    "workspace_key": workspace(),
                    "signal_id": {"type": "string", "minLength": 1, "maxLength": 256},
                    "fencing_token": {"type": "integer", "minimum": 1},
                    "idempotency_key": idempotency()
                }),
                &[
                    "workspace_key",
                    "signal_id",
                    "fencing_token",
                    "idempotency_key",
                ],
            ),
            false,
            true,
            false,
        ),
    ]
}

/// The list as `tools/list` renders it (name, title, description, input schema and
/// annotations), and the SHA-256 of its canonical JSON.
pub fn document() -> Value {
    let tools: Vec<Value> = tools()
        .into_iter()
        .map(|t| {
            json!({
                "name": t.name,
                "title": t.title,
                "description": t.description,
                "inputSchema": Value::Object(t.input_schema),
                "annotations": {
                    "title": t.title,
                    "readOnlyHint": t.read_only,
                    "destructiveHint": t.destructive,
                    "idempotentHint": t.idempotent,
                    "openWorldHint": false
                }
            })
        })
        .collect();
    let digest = hex::encode(Sha256::digest(canonical_json(&json!(tools)).as_bytes()));
    json!({
        "order": PUBLIC_TOOL_ORDER,
        "schema_digest": format!("sha256:{digest}"),
        "tools": tools,
    })
}

/// `docs/mcp-tools.json` as committed: pretty, with a final newline.
pub fn to_json() -> String {
    let mut out = serde_json::to_string_pretty(&document()).unwrap_or_default();
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_surface_is_the_seventeen_tools_in_canonical_order() {
        let names: Vec<&str> = tools().iter().map(|t| t.name).collect();
        assert_eq!(names, PUBLIC_TOOL_ORDER);
        for t in tools() {
            assert!(
                t.input_schema["required"]
                    .as_array()
                    .is_some_and(|r| r.contains(&json!("workspace_key"))),
                "{} names its workspace",
                t.name
            );
            let mutates = !t.read_only;
            let keyed = t.input_schema["required"]
                .as_array()
                .is_some_and(|r| r.contains(&json!("idempotency_key")));
            assert_eq!(
                mutates, keyed,
                "{}: mutating tools need idempotency keys",
                t.name
            );
        }
    }

    #[test]
    fn the_committed_tool_list_matches_the_server() {
        let committed = include_str!("../../docs/mcp-tools.json");
        assert!(
            committed == to_json(),
            "docs/mcp-tools.json drifted from the tools the server lists: run `make mcp-tools` and review the diff"
        );
    }

    #[test]
    fn the_list_is_deterministic() {
        assert_eq!(to_json(), to_json());
        assert_eq!(document()["schema_digest"], document()["schema_digest"]);
    }
}
