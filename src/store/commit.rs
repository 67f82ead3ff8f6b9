//! The commit rules both backends decide with (`spec/000_fa938a4e6ac75730.txt`, the
//! durable head): what revision a commit makes, whether it is a retry of the commit that
//! made the current head, a revision conflict or refused because its run is uncertain,
//! and the interrupt it leaves as stored. Pure: a backend reads the head (or learns why
//! its compare-and-set missed) and acts on the plan, so both refuse the same requests
//! with the same codes in the same order.

use crate::domain::state::{CommitRequest, PendingInterrupt, Rejection};

/// The current head as a backend read it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeadView<'a> {
    pub revision: u64,
    pub state_id: Option<&'a str>,
    pub run_id: Option<&'a str>,
}

/// What a commit does against the head it was decided on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CommitPlan {
    /// The head is the one this same commit made (a retry after a lost reply): return it.
    Retry,
    /// Move the head from the expected revision to `next`.
    Commit { next: u64 },
}

/// The revision a commit on `expected` makes.
pub fn next_revision(expected: u64) -> Result<u64, Rejection> {
    expected
        .checked_add(1)
        .ok_or_else(|| Rejection::Invalid(format!("expected revision {expected} is out of range")))
}

/// Decides a commit: an uncertain run is refused first (nothing commits under it until
/// reconciled), then a retry of the commit that made the head is recognised, then the
/// expected revision must be the head's.
pub fn plan_commit(
    head: HeadView<'_>,
    request: &CommitRequest,
    run_uncertain: bool,
) -> Result<CommitPlan, Rejection> {
    if run_uncertain {
        return Err(Rejection::RunUncertain {
            run_id: request.run_id.clone(),
        });
    }
    let next = next_revision(request.expected_revision)?;
    if head.revision == next
        && head.state_id == Some(request.state_id.as_str())
        && head.run_id == Some(request.run_id.as_str())
    {
        return Ok(CommitPlan::Retry);
    }
    if head.revision != request.expected_revision {
        return Err(Rejection::RevisionConflict {
            expected: request.expected_revision,
            actual: head.revision,
        });
    }
    Ok(CommitPlan::Commit { next })
}

/// The interrupt as stored by a commit that makes revision `next` at `now_ms`: stamped
/// (a resume must present this revision) and bounded to `max_bytes` of JSON. Returns it
/// with its JSON.
pub fn stamp_interrupt(
    request: &CommitRequest,
    next: u64,
    now_ms: i64,
    max_bytes: usize,
) -> Result<Option<(PendingInterrupt, String)>, Rejection> {
    let Some(mut interrupt) = request.interrupt.clone() else {
        return Ok(None);
    };
    interrupt.revision = next;
    interrupt.created_at_ms = now_ms;
    let json = serde_json::to_string(&interrupt)
        .map_err(|e| Rejection::Invalid(format!("pending interrupt: {e}")))?;
    if json.len() > max_bytes {
        return Err(Rejection::TooLarge {
            what: "pending interrupt",
            size: u64::try_from(json.len()).unwrap_or(u64::MAX),
            limit: u64::try_from(max_bytes).unwrap_or(u64::MAX),
        });
    }
    Ok(Some((interrupt, json)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(expected: u64) -> CommitRequest {
        CommitRequest {
            state_id: "ps_2".into(),
            expected_revision: expected,
            run_id: "run-2".into(),
            terminal: None,
            interrupt: None,
        }
    }

    fn head(revision: u64, state: &'static str, run: &'static str) -> HeadView<'static> {
        HeadView {
            revision,
            state_id: Some(state),
            run_id: Some(run),
        }
    }

    #[test]
    fn the_plan_of_every_commit() {
        let code = |r: Result<CommitPlan, Rejection>| r.map_err(|e| e.code());
        // (head, expected revision, uncertain) -> plan
        let cases = [
            (
                head(1, "ps_1", "run-1"),
                1,
                false,
                Ok(CommitPlan::Commit { next: 2 }),
            ),
            (head(2, "ps_2", "run-2"), 1, false, Ok(CommitPlan::Retry)),
            (head(2, "ps_x", "run-2"), 1, false, Err("revision_conflict")),
            (head(2, "ps_2", "run-x"), 1, false, Err("revision_conflict")),
            (head(3, "ps_3", "run-3"), 1, false, Err("revision_conflict")),
            (head(1, "ps_1", "run-1"), 1, true, Err("run_uncertain")),
            (head(2, "ps_2", "run-2"), 1, true, Err("run_uncertain")),
            (head(0, "", ""), u64::MAX, false, Err("invalid")),
        ];
        for (h, expected, uncertain, want) in cases {
            assert_eq!(
                code(plan_commit(h, &request(expected), uncertain)),
                want,
                "{h:?} expected {expected} uncertain {uncertain}"
            );
        }
        let empty = HeadView {
            revision: 0,
            state_id: None,
            run_id: None,
        };
        assert_eq!(
            plan_commit(empty, &request(0), false).map_err(|e| e.code()),
            Ok(CommitPlan::Commit { next: 1 })
        );
    }

    #[test]
    fn an_interrupt_is_stamped_and_bounded() {
        let mut r = request(4);
        assert_eq!(stamp_interrupt(&r, 5, 9, 10_000).ok(), Some(None));
        r.interrupt = Some(PendingInterrupt {
            interrupt_id: "int-1".into(),
            kind: "tool_approval".into(),
            run_id: "run-2".into(),
            namespace: Vec::new(),
            agent_id: "a".into(),
            allowed_decisions: vec!["approve".into()],
            revision: 0,
            created_at_ms: 0,
            body: serde_json::json!({"tool": "send_email"}),
        });
        let (stamped, json) = stamp_interrupt(&r, 5, 9, 10_000)
            .ok()
            .flatten()
            .unwrap_or_else(|| panic!("stamped"));
        assert_eq!((stamped.revision, stamped.created_at_ms), (5, 9));
        assert!(json.contains("\"revision\":5"), "{json}");
        assert_eq!(
            stamp_interrupt(&r, 5, 9, 20).err().map(|e| e.code()),
            Some("too_large")
        );
    }
}
