//! Property-based model test of the store traits: random operation sequences, each
//! operation checked against a reference model of what the trait documents
//! (`src/store/mod.rs`): the fence (`raise_fence`, `clear`), the thread-state commit
//! protocol (`write_native_state`, `commit_head`, `load_head`, `read_state`, uncertain
//! runs) and native objects (`put_object` in its three modes, `get_object`,
//! `delete_objects`). Scopes are sometimes stale or ahead (epoch or generation), and the
//! model says which refusal each call must get; a refused call must change nothing,
//! which the reads after it check.
//!
//! Seeds are fixed so a failure reproduces: the panic names the seed, the step and the
//! steps before it. `HARNESS_MODEL_SEEDS=N` runs N sequences instead of the default,
//! `HARNESS_MODEL_SEED=S` runs only seed S.

use std::collections::{BTreeMap, BTreeSet};

use harness_engine::{
    domain::state::{BindingRecord, CommitRequest, StateScope},
    store::{PutMode, Store, StoreError},
};

use super::{key, new_binding, scope_of};

/// splitmix64: small, seedable, and good enough to pick operations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> Option<&'a T> {
        let n = u64::try_from(items.len()).ok()?;
        items.get(usize::try_from(self.below(n)).ok()?)
    }
}

const STEPS: usize = 250;
const DEFAULT_SEEDS: u64 = 6;
const OBJECT_KEYS: [&str; 4] = ["k0", "k1", "k10", "j0"];
const RUNS: [&str; 3] = ["run-a", "run-b", "run-c"];

#[derive(Clone, Debug, Default)]
struct Head {
    revision: u64,
    state_id: String,
    run_id: String,
    lease_generation: u64,
}

/// What one binding holds, as the trait documents it.
#[derive(Debug, Default)]
struct Binding {
    epoch: u64,
    generation: u64,
    head: Option<Head>,
    /// Idempotency key -> (payload, state id) in the current epoch.
    writes: BTreeMap<String, (Vec<u8>, String)>,
    /// State id -> payload, every state written in the current epoch.
    states: BTreeMap<String, Vec<u8>>,
    /// States that became a head: a state is committed once (its pending entry is
    /// consumed), so only a retry of that very commit succeeds again.
    committed: BTreeSet<String>,
    /// State ids of earlier epochs: never readable or committable again.
    old_states: BTreeSet<String>,
    objects: BTreeMap<String, (u64, Vec<u8>)>,
    uncertain: BTreeSet<String>,
}

/// Which scope an operation presents, relative to the binding's fence.
#[derive(Clone, Copy, Debug)]
enum Presented {
    Current,
    OlderGeneration,
    NewerGeneration,
    OtherEpoch,
}

impl Binding {
    fn scope(
        &self,
        record: &BindingRecord,
        presented: Presented,
    ) -> (StateScope, Option<&'static str>) {
        let (epoch, generation) = (self.epoch, self.generation);
        match presented {
            Presented::Current => (scope_of(record, epoch, generation), None),
            Presented::OlderGeneration if generation > 1 => {
                (scope_of(record, epoch, generation - 1), Some("stale_lease"))
            }
            Presented::OlderGeneration | Presented::NewerGeneration => {
                (scope_of(record, epoch, generation + 1), Some("stale_lease"))
            }
            Presented::OtherEpoch if epoch > 0 => {
                (scope_of(record, epoch - 1, generation), Some("stale_epoch"))
            }
            Presented::OtherEpoch => (scope_of(record, epoch + 1, generation), Some("stale_epoch")),
        }
    }
}

fn presented(rng: &mut Rng) -> Presented {
    match rng.below(10) {
        0 => Presented::OlderGeneration,
        1 => Presented::NewerGeneration,
        2 => Presented::OtherEpoch,
        _ => Presented::Current,
    }
}

/// The outcome the model expects: a value or a refusal code.
fn expect_code<T: std::fmt::Debug>(got: &Result<T, StoreError>, want: &str) -> Result<(), String> {
    match got {
        Err(e) if e.code() == want => Ok(()),
        other => Err(format!("expected {want}, got {other:?}")),
    }
}

fn ok<T: std::fmt::Debug>(got: Result<T, StoreError>) -> Result<T, String> {
    got.map_err(|e| format!("expected success, got {e:?} ({})", e.code()))
}

/// Runs the sequences for every seed; panics with the seed and the steps on a mismatch.
pub async fn random_operation_sequences_match_the_model<S: Store + ?Sized>(store: &S) {
    let seeds: Vec<u64> = match std::env::var("HARNESS_MODEL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        Some(seed) => vec![seed],
        None => {
            let n = std::env::var("HARNESS_MODEL_SEEDS")
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(DEFAULT_SEEDS);
            (1..=n).collect()
        }
    };
    for seed in seeds {
        let mut trace: Vec<String> = Vec::new();
        if let Err(why) = sequence(store, seed, &mut trace).await {
            let start = trace.len().saturating_sub(40);
            panic!(
                "seed {seed}, step {}: {why}\nsteps before it (latest last):\n  {}",
                trace.len(),
                trace.get(start..).unwrap_or_default().join("\n  ")
            );
        }
    }
}

async fn sequence<S: Store + ?Sized>(
    store: &S,
    seed: u64,
    trace: &mut Vec<String>,
) -> Result<(), String> {
    let mut rng = Rng(seed);
    let mut records = Vec::new();
    let mut models = Vec::new();
    for b in 0..2 {
        let (record, _) = new_binding(store, &format!("model-{seed}-{b}")).await;
        models.push(Binding {
            generation: record.lease_generation,
            ..Binding::default()
        });
        records.push(record);
    }
    for step in 0..STEPS {
        let which = usize::try_from(rng.below(2)).unwrap_or(0);
        let (Some(record), Some(model)) = (records.get(which), models.get_mut(which)) else {
            return Err("no binding".into());
        };
        let op = rng.below(100);
        let before = trace.len();
        let result = match op {
            0..=19 => write(store, &mut rng, record, model, step, trace).await,
            20..=39 => commit(store, &mut rng, record, model, trace).await,
            40..=47 => read(store, &mut rng, record, model, trace).await,
            48..=67 => put(store, &mut rng, record, model, trace).await,
            68..=75 => get(store, &mut rng, record, model, trace).await,
            76..=79 => delete(store, &mut rng, record, model, trace).await,
            80..=87 => fence(store, &mut rng, record, model, trace).await,
            88..=91 => clear(store, &mut rng, record, model, trace).await,
            _ => uncertain(store, &mut rng, record, model, trace).await,
        };
        for line in trace.get_mut(before..).unwrap_or_default() {
            line.insert_str(0, &format!("[{which}] "));
        }
        result.map_err(|e| format!("binding {which}: {e}"))?;
    }
    Ok(())
}

async fn write<S: Store + ?Sized>(
    store: &S,
    rng: &mut Rng,
    record: &BindingRecord,
    m: &mut Binding,
    step: usize,
    trace: &mut Vec<String>,
) -> Result<(), String> {
    let p = presented(rng);
    let (scope, refusal) = m.scope(record, p);
    // Few keys, so retries (same payload) and reuse (another payload) both happen.
    let k = format!("w{}", rng.below(6));
    let payload = format!("{k}-p{}", rng.below(2)).into_bytes();
    trace.push(format!(
        "write {k} {:?} as {p:?} (step {step})",
        String::from_utf8_lossy(&payload)
    ));
    let got = store
        .write_native_state(&scope, &payload, &key(&scope, &k))
        .await;
    if let Some(code) = refusal {
        return expect_code(&got, code);
    }
    match m.writes.get(&k) {
        Some((stored, _)) if *stored != payload => expect_code(&got, "idempotency_mismatch"),
        Some((_, state_id)) => {
            let got = ok(got)?;
            (got.state_id == *state_id)
                .then_some(())
                .ok_or_else(|| format!("a retry returned {} instead of {state_id}", got.state_id))
        }
        None => {
            let got = ok(got)?;
            // Ids are deterministic per key, so an earlier epoch's id can come back for
            // the same key and payload; two keys of one epoch never share one.
            if m.states.contains_key(&got.state_id) {
                return Err(format!("a new write reused state id {}", got.state_id));
            }
            m.old_states.remove(&got.state_id);
            m.states.insert(got.state_id.clone(), payload.clone());
            m.writes.insert(k, (payload, got.state_id));
            Ok(())
        }
    }
}

async fn commit<S: Store + ?Sized>(
    store: &S,
    rng: &mut Rng,
    record: &BindingRecord,
    m: &mut Binding,
    trace: &mut Vec<String>,
) -> Result<(), String> {
    let p = presented(rng);
    let (scope, refusal) = m.scope(record, p);
    let current: Vec<String> = m.states.keys().cloned().collect();
    let old: Vec<String> = m.old_states.iter().cloned().collect();
    let state_id = if rng.below(8) == 0 && !old.is_empty() {
        rng.pick(&old).cloned()
    } else {
        rng.pick(&current).cloned()
    };
    let Some(state_id) = state_id else {
        return Ok(());
    };
    let revision = m.head.as_ref().map_or(0, |h| h.revision);
    let expected = match rng.below(6) {
        0 => revision + 1,
        1 => revision.saturating_sub(1),
        _ => revision,
    };
    let run = rng.pick(&RUNS).copied().unwrap_or("run-a");
    trace.push(format!(
        "commit {state_id} at {expected} by {run} as {p:?} (head {revision})"
    ));
    let request = CommitRequest {
        state_id: state_id.clone(),
        expected_revision: expected,
        run_id: run.into(),
        terminal: None,
        interrupt: None,
    };
    let got = store.commit_head(&scope, &request).await;
    if let Some(code) = refusal {
        return expect_code(&got, code);
    }
    if !m.states.contains_key(&state_id) {
        return expect_code(&got, "not_found");
    }
    if m.uncertain.contains(run) {
        return expect_code(&got, "run_uncertain");
    }
    let retry = m
        .head
        .as_ref()
        .is_some_and(|h| h.revision == expected + 1 && h.state_id == state_id && h.run_id == run);
    if retry {
        let got = ok(got)?;
        return (got.revision == revision)
            .then_some(())
            .ok_or_else(|| format!("a retried commit returned revision {}", got.revision));
    }
    if expected != revision {
        return expect_code(&got, "revision_conflict");
    }
    if m.committed.contains(&state_id) {
        return expect_code(&got, "not_found");
    }
    let got = ok(got)?;
    let want = Head {
        revision: revision + 1,
        state_id,
        run_id: run.into(),
        lease_generation: m.generation,
    };
    if (
        got.revision,
        &got.state_id,
        &got.run_id,
        got.lease_generation,
    ) != (
        want.revision,
        &want.state_id,
        &want.run_id,
        want.lease_generation,
    ) {
        return Err(format!("committed head {got:?}, model {want:?}"));
    }
    m.committed.insert(want.state_id.clone());
    m.head = Some(want);
    Ok(())
}

async fn read<S: Store + ?Sized>(
    store: &S,
    rng: &mut Rng,
    record: &BindingRecord,
    m: &mut Binding,
    trace: &mut Vec<String>,
) -> Result<(), String> {
    let p = presented(rng);
    let (scope, refusal) = m.scope(record, p);
    trace.push(format!("load_head as {p:?}"));
    let got = store.load_head(&scope).await;
    if let Some(code) = refusal {
        return expect_code(&got, code);
    }
    let got = ok(got)?;
    let seen = got.as_ref().map(|h| {
        (
            h.revision,
            h.state_id.clone(),
            h.run_id.clone(),
            h.lease_generation,
        )
    });
    let want = m.head.as_ref().map(|h| {
        (
            h.revision,
            h.state_id.clone(),
            h.run_id.clone(),
            h.lease_generation,
        )
    });
    if seen != want {
        return Err(format!("load_head gave {seen:?}, model {want:?}"));
    }
    if let Some(head) = &got {
        let runs: BTreeSet<String> = head
            .uncertain_runs
            .iter()
            .map(|r| r.run_id.clone())
            .collect();
        if runs != m.uncertain {
            return Err(format!(
                "head lists uncertain runs {runs:?}, model {:?}",
                m.uncertain
            ));
        }
    }
    // Every state of the epoch reads back its payload; no state of an earlier one does.
    let states: Vec<(String, Option<Vec<u8>>)> = m
        .states
        .iter()
        .map(|(id, body)| (id.clone(), Some(body.clone())))
        .chain(
            m.old_states
                .iter()
                .filter(|id| !m.states.contains_key(*id))
                .map(|id| (id.clone(), None)),
        )
        .collect();
    if let Some((id, want)) = rng.pick(&states) {
        trace.push(format!("read_state {id}"));
        let got = ok(store.read_state(&scope, id).await)?;
        if got != *want {
            return Err(format!("read_state {id} gave {got:?}, model {want:?}"));
        }
    }
    Ok(())
}

async fn put<S: Store + ?Sized>(
    store: &S,
    rng: &mut Rng,
    record: &BindingRecord,
    m: &mut Binding,
    trace: &mut Vec<String>,
) -> Result<(), String> {
    let p = presented(rng);
    let (scope, refusal) = m.scope(record, p);
    let k = rng.pick(&OBJECT_KEYS).copied().unwrap_or("k0");
    let body = format!("{k}-v{}", rng.below(3)).into_bytes();
    let current = m.objects.get(k).cloned();
    let version = current.as_ref().map_or(0, |(v, _)| *v);
    let mode = match rng.below(3) {
        0 => PutMode::Create,
        1 => PutMode::Replace {
            expected_version: match rng.below(4) {
                0 => version + 1,
                1 => version.saturating_sub(1),
                _ => version,
            },
        },
        _ => PutMode::Upsert,
    };
    trace.push(format!(
        "put {k} {:?} {mode:?} as {p:?} (version {version})",
        String::from_utf8_lossy(&body)
    ));
    let got = store.put_object(&scope, k, &body, mode).await;
    if let Some(code) = refusal {
        return expect_code(&got, code);
    }
    // A retry of a put that happened returns the object as it is: an identical create,
    // a replacement already at the next version with this body, an upsert of the body
    // already stored.
    let retry = match (mode, &current) {
        (PutMode::Create | PutMode::Upsert, Some((_, b))) => *b == body,
        (PutMode::Replace { expected_version }, Some((v, b))) => {
            expected_version != version && *v == expected_version + 1 && *b == body
        }
        _ => false,
    };
    if retry {
        let got = ok(got)?;
        return (got.version == version)
            .then_some(())
            .ok_or_else(|| format!("a retried {mode:?} returned version {}", got.version));
    }
    let next = match (mode, &current) {
        (PutMode::Create, Some(_)) => return expect_code(&got, "conflict"),
        (PutMode::Replace { expected_version }, _) if expected_version != version => {
            return expect_code(&got, "conflict");
        }
        _ => version + 1,
    };
    let got = ok(got)?;
    if got.version != next {
        return Err(format!(
            "put returned version {}, model {next}",
            got.version
        ));
    }
    m.objects.insert(k.to_owned(), (next, body));
    Ok(())
}

async fn get<S: Store + ?Sized>(
    store: &S,
    rng: &mut Rng,
    record: &BindingRecord,
    m: &mut Binding,
    trace: &mut Vec<String>,
) -> Result<(), String> {
    let p = presented(rng);
    let (scope, refusal) = m.scope(record, p);
    let k = rng.pick(&OBJECT_KEYS).copied().unwrap_or("k0");
    trace.push(format!("get {k} as {p:?}"));
    let got = store.get_object(&scope, k).await;
    if let Some(code) = refusal {
        return expect_code(&got, code);
    }
    let got = ok(got)?.map(|o| (o.meta.version, o.body.unwrap_or_default()));
    let want = m.objects.get(k).cloned();
    (got == want)
        .then_some(())
        .ok_or_else(|| format!("get {k} gave {got:?}, model {want:?}"))
}

async fn delete<S: Store + ?Sized>(
    store: &S,
    rng: &mut Rng,
    record: &BindingRecord,
    m: &mut Binding,
    trace: &mut Vec<String>,
) -> Result<(), String> {
    let p = presented(rng);
    let (scope, refusal) = m.scope(record, p);
    let prefix = rng.pick(&["k1", "k", "j", "x"]).copied().unwrap_or("x");
    trace.push(format!("delete_objects {prefix:?} as {p:?}"));
    let got = store.delete_objects(&scope, prefix).await;
    if let Some(code) = refusal {
        return expect_code(&got, code);
    }
    let doomed: Vec<String> = m
        .objects
        .keys()
        .filter(|k| k.starts_with(prefix))
        .cloned()
        .collect();
    let got = ok(got)?;
    if got != u64::try_from(doomed.len()).unwrap_or(u64::MAX) {
        return Err(format!(
            "delete_objects {prefix:?} deleted {got}, model {}",
            doomed.len()
        ));
    }
    for k in doomed {
        m.objects.remove(&k);
    }
    Ok(())
}

async fn fence<S: Store + ?Sized>(
    store: &S,
    rng: &mut Rng,
    record: &BindingRecord,
    m: &mut Binding,
    trace: &mut Vec<String>,
) -> Result<(), String> {
    let epoch = match rng.below(8) {
        0 => m.epoch.saturating_sub(1),
        1 => m.epoch + 1,
        _ => m.epoch,
    };
    let generation = match rng.below(4) {
        0 => m.generation.saturating_sub(1),
        1 => m.generation,
        _ => m.generation + 1,
    };
    trace.push(format!(
        "raise_fence ({epoch}, {generation}) from ({}, {})",
        m.epoch, m.generation
    ));
    let got = store
        .raise_fence(&record.binding_id, epoch, generation)
        .await;
    // The fence moves within the epoch; moving the epoch is clear's job.
    if epoch < m.epoch {
        return expect_code(&got, "stale_epoch");
    }
    if epoch > m.epoch {
        return expect_code(&got, "invalid");
    }
    if generation < m.generation {
        return expect_code(&got, "stale_lease");
    }
    let got = ok(got)?;
    if (got.epoch, got.lease_generation) != (m.epoch, generation) {
        return Err(format!("raise_fence returned {got:?}"));
    }
    m.generation = generation;
    Ok(())
}

async fn clear<S: Store + ?Sized>(
    store: &S,
    rng: &mut Rng,
    record: &BindingRecord,
    m: &mut Binding,
    trace: &mut Vec<String>,
) -> Result<(), String> {
    // Re-running the current epoch finishes a clear and changes nothing.
    let again = rng.below(4) == 0;
    let to = if again { m.epoch } else { m.epoch + 1 };
    trace.push(format!("clear to {to} from {}", m.epoch));
    let got = ok(store.clear(&record.binding_id, to).await)?;
    if got.epoch != to {
        return Err(format!("clear returned epoch {}", got.epoch));
    }
    if !again {
        m.epoch = to;
        m.head = None;
        m.writes.clear();
        let states = std::mem::take(&mut m.states);
        m.old_states.extend(states.into_keys());
        m.committed.clear();
        m.objects.clear();
        m.uncertain.clear();
    }
    Ok(())
}

async fn uncertain<S: Store + ?Sized>(
    store: &S,
    rng: &mut Rng,
    record: &BindingRecord,
    m: &mut Binding,
    trace: &mut Vec<String>,
) -> Result<(), String> {
    let p = presented(rng);
    let (scope, refusal) = m.scope(record, p);
    let run = rng.pick(&RUNS).copied().unwrap_or("run-a");
    if rng.below(2) == 0 {
        trace.push(format!("mark_uncertain {run} as {p:?}"));
        let got = store.mark_uncertain(&scope, run, "model_test").await;
        if let Some(code) = refusal {
            return expect_code(&got, code);
        }
        ok(got)?;
        m.uncertain.insert(run.to_owned());
    } else {
        trace.push(format!("reconcile_run {run} as {p:?}"));
        let got = store.reconcile_run(&scope, run).await;
        if let Some(code) = refusal {
            return expect_code(&got, code);
        }
        if !m.uncertain.remove(run) {
            return expect_code(&got, "not_found");
        }
        ok(got)?;
    }
    let runs: BTreeSet<String> = ok(store
        .uncertain_runs(&scope_of(record, m.epoch, m.generation))
        .await)?
    .into_iter()
    .map(|r| r.run_id)
    .collect();
    (runs == m.uncertain)
        .then_some(())
        .ok_or_else(|| format!("uncertain_runs gave {runs:?}, model {:?}", m.uncertain))
}
