//! Crash tests: a child process commits turns in a loop and is killed with SIGKILL at
//! chosen points (right after a pending write, and at arbitrary moments, which lands
//! inside commits); the parent then reopens the store and checks that no acknowledged
//! commit was lost, the head is an exact committed state, and an acknowledged pending
//! entry is intact and not selected as head.
//!
//! The child is this same test binary, re-executed with `HARNESS_CRASH_CHILD` set, so the
//! crash runs the real backend code path with nothing mocked.

use std::{
    io::{BufRead, BufReader},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use harness_engine::{
    domain::state::BindingRecord,
    store::{Store, now_ms},
};

use super::{commit, key, keyring, scope_of};

/// Environment variable that turns a test process into the crash child; its value is the mode.
pub const CHILD_ENV: &str = "HARNESS_CRASH_CHILD";
const PAUSE_AFTER: u64 = 3;

fn record() -> BindingRecord {
    let kr = keyring();
    BindingRecord {
        binding_id: kr.binding_id("user:crash", "agent-1", "crash"),
        environment: kr.environment().to_owned(),
        owner: kr.subject_ref("user:crash"),
        agent_id: "agent-1".into(),
        conversation_id: "crash".into(),
        harness: "strands".into(),
        epoch: 0,
        lease_generation: 1,
        created_at_ms: now_ms(),
    }
}

/// A 4 KiB body that names its turn, so the parent can check the head's content exactly.
pub fn body(turn: u64) -> Vec<u8> {
    let mut b = format!("turn-{turn:08}:").into_bytes();
    b.resize(4096, b'.');
    b
}

/// The child's loop. Never returns: the parent kills it.
pub async fn child<S: Store + ?Sized>(store: &S, mode: &str) -> ! {
    let record = record();
    store.ensure_binding(&record).await.expect("ensure binding");
    let scope = scope_of(&record, 0, 1);
    let start = store
        .load_head(&scope)
        .await
        .expect("load")
        .map_or(0, |h| h.revision);
    let mut turn = start + 1;
    loop {
        let run = format!("run-{turn}");
        let pending = store
            .write_native_state(&scope, &body(turn), &key(&scope, &run))
            .await
            .expect("write");
        println!("PENDING {turn} {}", pending.state_id);
        if mode == "pause-after-pending" && turn == start + PAUSE_AFTER {
            loop {
                tokio::time::sleep(Duration::from_secs(3600)).await;
            }
        }
        store
            .commit_head(&scope, &commit(&pending.state_id, turn - 1, &run))
            .await
            .expect("commit");
        println!("ACK {turn}");
        turn += 1;
    }
}

/// What the parent saw the child acknowledge before the kill.
#[derive(Debug, Default)]
pub struct Observed {
    pub last_ack: u64,
    pub last_pending: Option<(u64, String)>,
}

impl Observed {
    /// Notes one line of the child's output; `false` when it is not one of ours.
    pub fn note(&mut self, line: &str) -> bool {
        let mut parts = line.split_whitespace();
        match (
            parts.next(),
            parts.next().and_then(|n| n.parse::<u64>().ok()),
        ) {
            (Some("ACK"), Some(n)) => self.last_ack = n,
            (Some("PENDING"), Some(n)) => {
                self.last_pending = parts.next().map(|id| (n, id.to_owned()))
            }
            _ => return false,
        }
        true
    }
}

/// What a crash child's output lines tell the parent.
pub trait Notes: Default {
    /// Notes one line; `false` when it is not one of ours.
    fn note_line(&mut self, line: &str) -> bool;
}

impl Notes for Observed {
    fn note_line(&mut self, line: &str) -> bool {
        self.note(line)
    }
}

impl Notes for super::ledger_crash::Acked {
    fn note_line(&mut self, line: &str) -> bool {
        self.note(line)
    }
}

/// Runs the child until `stop` says so, then SIGKILLs it.
pub fn run_child_until<O: Notes>(mut cmd: Command, stop: impl Fn(&O) -> bool) -> O {
    cmd.stdout(Stdio::piped()).stderr(Stdio::null());
    let mut child: Child = cmd.spawn().expect("spawn crash child");
    let stdout = child.stdout.take().expect("child stdout");
    let mut observed = O::default();
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut lines = BufReader::new(stdout).lines();
    for line in lines.by_ref() {
        let Ok(line) = line else { break };
        if !observed.note_line(&line) {
            continue;
        }
        if stop(&observed) || Instant::now() > deadline {
            break;
        }
    }
    let _ = child.kill(); // SIGKILL on Unix: no destructor, no flush, no graceful close.
    let _ = child.wait();
    // The child kept running between our decision and the kill: what it acknowledged
    // in that window is still in the pipe, and counts.
    for line in lines.map_while(Result::ok) {
        observed.note_line(&line);
    }
    observed
}

/// Checks the store after a kill.
pub async fn verify<S: Store + ?Sized>(store: &S, observed: &Observed, paused: bool) -> u64 {
    let record = record();
    let scope = scope_of(&record, 0, 1);
    let head = store.load_head(&scope).await.expect("load after crash");
    let revision = head.as_ref().map_or(0, |h| h.revision);
    assert!(
        revision >= observed.last_ack,
        "acknowledged commit lost: head {revision}, last ack {} ({observed:?})",
        observed.last_ack
    );
    if let Some(head) = &head {
        let stored = store
            .read_state(&scope, &head.state_id)
            .await
            .expect("read head body");
        assert_eq!(
            stored,
            Some(body(head.revision)),
            "the head is exactly the committed state of revision {}",
            head.revision
        );
        assert_eq!(head.run_id, format!("run-{}", head.revision));
    }
    if let Some((n, state_id)) = &observed.last_pending {
        if *n > revision {
            let pending = store
                .read_state(&scope, state_id)
                .await
                .expect("read pending");
            assert_eq!(
                pending,
                Some(body(*n)),
                "an acknowledged pending entry survives the crash intact"
            );
            assert_ne!(
                head.as_ref().map(|h| h.state_id.as_str()),
                Some(state_id.as_str()),
                "a pending entry is never the head"
            );
        }
        assert!(
            revision <= *n,
            "the head never runs ahead of what was written"
        );
    }
    if paused {
        let (n, _) = observed
            .last_pending
            .as_ref()
            .expect("paused after a pending write");
        assert_eq!(
            revision + 1,
            *n,
            "killed between pending write and commit: the previous head stands"
        );
    }
    // The next turn commits on top of whatever survived (no manual repair needed).
    let run = format!("run-{}", revision + 1);
    let p = store
        .write_native_state(&scope, &body(revision + 1), &key(&scope, &run))
        .await
        .expect("write after crash");
    let next = store
        .commit_head(&scope, &commit(&p.state_id, revision, &run))
        .await
        .expect("commit after crash");
    next.revision
}
