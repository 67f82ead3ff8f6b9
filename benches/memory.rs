//! `make bench-memory`: long-term memory on the embedded SQLite store.
//!
//! - search latency (p50, p99) in one namespace holding 100,000 memories, with 1,000,000
//!   in the table (900 other namespaces of 1,000 each). A search is the API's path:
//!   namespace-filtered FTS5 candidates, then ranking (BM25, recency, importance) and the
//!   top 10; also the budgeted mode (greedy by value per token within 400 tokens);
//! - search with an embedding (384 dimensions) in the same namespace: p50/p99, and
//!   recall@10 against exact cosine over all 100,000 (synthetic corpus with known
//!   neighbours: 2,000 topic directions plus noise; a query is a memory's embedding plus
//!   noise), next to what the 256 most recent records (the candidates before the vector
//!   index) would have offered;
//! - put throughput through the full write pipeline (authorize, validate, scan, redact,
//!   approval) and the store's compare-and-set with its audit record, 64 writers at once,
//!   every put durable (fsynced) before it is acknowledged; and in the same run, the
//!   baseline: the same bytes per put (text and embedding) written durably by as many
//!   writers through the same single writer and group commit into a table with no
//!   index, full-text index, audit record or pipeline (`store::sqlite::baseline`).
//!
//! - opt-in (`HARNESS_BENCH_MEMORY_MONGO=1`): search by embedding and puts through the
//!   MongoDB store on a FerretDB v1 of the bench's own, one namespace of 1,000 memories
//!   (`HARNESS_BENCH_MEMORY_MONGO_RECORDS`): what the protocol allows on this machine.
//!
//! Seeding goes straight to the store (`load_memories`, batches of 5,000 per transaction),
//! not over HTTP. Memory text is synthetic: 12 words per memory drawn from a 5,000-word
//! vocabulary with Zipf frequencies; queries are two or three words drawn uniformly from
//! ranks 50 to 5,000 (content words: a caller's query words, not stop words).
//!
//! `cargo bench --bench memory` runs the full measurement; run without `--bench` (as
//! `cargo test --all-targets` does) it is a small smoke run. Prints a table and writes the
//! same figures as flat JSON to `target/bench/memory.json`.

use std::{
    collections::HashSet,
    path::Path,
    sync::Arc,
    time::{Duration, Instant},
};

use harness_engine::{
    domain::{
        ids::{Keyring, content_digest},
        limits::Limits,
        memory::{
            ApprovalStatus, MemoryContext, MemoryKind, MemoryRecord, MemoryScope, Namespace,
            pipeline::{Proposal, WriteContext, prepare},
            policy::{MemoryPolicySet, Writer},
            rank::{self, Weights},
        },
    },
    store::{
        MemoryStore,
        memory::{CandidateQuery, MemoryPut},
        mongo::MongoStore,
        now_ms,
        sqlite::{SqliteStore, baseline::Baseline},
    },
};

#[path = "support/ferret.rs"]
mod ferret;

const VOCABULARY: usize = 5_000;
const WORDS_PER_MEMORY: usize = 12;
const LOAD_BATCH: usize = 5_000;
/// Memories per `load_memories` call on FerretDB (its inserts are slow; progress per batch).
const MONGO_LOAD_BATCH: usize = 250;
/// Searches by embedding on FerretDB, which reads every document of the namespace for
/// each one (v1 serves only an exact `_id` filter from an index).
const MONGO_SEARCHES: usize = 20;
/// Embedding length (that of the small sentence-embedding models, e.g. MiniLM's 384).
const DIMS: usize = 384;
/// Topics of the synthetic corpus: every embedding is its topic's direction plus noise.
const TOPICS: usize = 2_000;
/// Vector candidates per search, as the API asks for a top 10 (`limit * 4`, at least 64).
const VECTOR_LIMIT: usize = 64;

struct Settings {
    in_namespace: usize,
    total: usize,
    searches: usize,
    put_duration: Duration,
    writers: usize,
    /// Memories in the one namespace of the FerretDB section.
    mongo_in_namespace: usize,
}

/// A small deterministic generator (xorshift64*), so every run seeds the same corpus.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// A standard normal sample (Box-Muller).
    fn normal(&mut self) -> f32 {
        let u = self.unit().max(f64::MIN_POSITIVE);
        let v = self.unit();
        ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
    }
}

/// The synthetic embedding space: `TOPICS` random directions; a memory's embedding is
/// its topic's direction plus isotropic noise, so its true neighbours are mostly in its
/// topic but the exact order needs the full vectors (the known answer is computed by
/// exact cosine over the whole namespace).
#[derive(Clone)]
struct Topics(Arc<Vec<Vec<f32>>>);

impl Topics {
    fn new(rng: &mut Rng) -> Self {
        Topics(Arc::new(
            (0..TOPICS)
                .map(|_| (0..DIMS).map(|_| rng.normal()).collect())
                .collect(),
        ))
    }
    fn embedding(&self, rng: &mut Rng) -> Vec<f32> {
        let topic = &self.0[(rng.next() % TOPICS as u64) as usize];
        topic.iter().map(|x| x + 0.9 * rng.normal()).collect()
    }
}

fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let (mut dot, mut na, mut nb) = (0f32, 0f32, 0f32);
    for (x, y) in a.iter().zip(b) {
        dot += x * y;
        na += x * x;
        nb += y * y;
    }
    dot / (na.sqrt() * nb.sqrt()).max(f32::MIN_POSITIVE)
}

/// Indices of the `n` rows of `corpus` closest to `q` by exact cosine, best first.
fn exact_top(corpus: &[Vec<f32>], q: &[f32], n: usize) -> Vec<usize> {
    let mut scored: Vec<(f32, usize)> = corpus
        .iter()
        .enumerate()
        .map(|(i, v)| (cosine(q, v), i))
        .collect();
    let n = n.min(scored.len());
    scored.select_nth_unstable_by(n.saturating_sub(1), |a, b| b.0.total_cmp(&a.0));
    scored.truncate(n);
    scored.sort_by(|a, b| b.0.total_cmp(&a.0));
    scored.into_iter().map(|(_, i)| i).collect()
}

/// Zipf(1) over the vocabulary by inverse CDF on precomputed cumulative weights.
struct Zipf(Vec<f64>);

impl Zipf {
    fn new(n: usize) -> Self {
        let mut acc = 0.0;
        let mut cdf = Vec::with_capacity(n);
        for rank in 1..=n {
            acc += 1.0 / rank as f64;
            cdf.push(acc);
        }
        let total = acc;
        Zipf(cdf.into_iter().map(|c| c / total).collect())
    }
    fn sample(&self, rng: &mut Rng) -> usize {
        let u = rng.unit();
        self.0.partition_point(|c| *c < u)
    }
}

/// Word `i` of the vocabulary: pronounceable, distinct, alphabetic.
fn word(i: usize) -> String {
    const SYL: [&str; 20] = [
        "ka", "lo", "mi", "ne", "su", "ta", "ri", "po", "ve", "da", "ga", "hu", "zo", "be", "fi",
        "ju", "xo", "qua", "wy", "el",
    ];
    let mut n = i;
    let mut w = String::new();
    loop {
        w.push_str(SYL[n % SYL.len()]);
        n /= SYL.len();
        if n == 0 {
            break;
        }
    }
    w.push_str(SYL[i % 7]);
    w
}

fn text(rng: &mut Rng, zipf: &Zipf, words: &[String]) -> String {
    (0..WORDS_PER_MEMORY)
        .map(|_| words[zipf.sample(rng).min(words.len() - 1)].as_str())
        .collect::<Vec<_>>()
        .join(" ")
}

fn record(ns: &Namespace, key: &str, body: String, now: i64, rng: &mut Rng) -> MemoryRecord {
    MemoryRecord {
        id: ns.record_id(key),
        namespace: ns.clone(),
        kind: MemoryKind::Semantic,
        memory_key: key.to_owned(),
        media_type: "text/plain".into(),
        content_hash: content_digest(body.as_bytes()),
        body,
        provenance: Default::default(),
        approval_status: ApprovalStatus::NotRequired,
        approval: Default::default(),
        classification: Default::default(),
        importance: (rng.unit() as f32).clamp(0.0, 1.0),
        embedding: None,
        revision: 1,
        source_revisions: vec![],
        retention_policy: "standard".into(),
        review_required: false,
        created_at_ms: now - (rng.next() % (90 * 24 * 3600 * 1000)) as i64,
        updated_at_ms: now - (rng.next() % (90 * 24 * 3600 * 1000)) as i64,
        expires_at_ms: None,
    }
}

fn namespace(k: &Keyring, subject: usize) -> Namespace {
    let ctx = MemoryContext {
        subject: k.subject_ref(&format!("user-{subject}")),
        agent_id: "bench-agent".into(),
        organization: None,
    };
    Namespace::derive(k, &ctx, MemoryScope::User)
        .unwrap_or_else(|e| fail(&format!("namespace: {e}")))
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let s = if full {
        Settings {
            in_namespace: 100_000,
            total: 1_000_000,
            searches: 2_000,
            put_duration: Duration::from_secs(6),
            writers: 64,
            mongo_in_namespace: mongo_records(1_000),
        }
    } else {
        Settings {
            in_namespace: 2_000,
            total: 10_000,
            searches: 50,
            put_duration: Duration::from_millis(300),
            writers: 8,
            mongo_in_namespace: mongo_records(200),
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|e| fail(&format!("tokio: {e}")));
    let scratch = tempfile::tempdir().unwrap_or_else(|e| fail(&format!("temp dir: {e}")));
    let k = Keyring::new(b"memory-bench-key-0123456789abcdef0123".to_vec(), "bench")
        .unwrap_or_else(|e| fail(&e.to_string()));
    let words: Vec<String> = (0..VOCABULARY).map(word).collect();
    let zipf = Zipf::new(VOCABULARY);

    let mut json = serde_json::Map::new();
    runtime.block_on(async {
        let store = Arc::new(
            SqliteStore::open(&scratch.path().join("memory.db"), Limits::default())
                .await
                .unwrap_or_else(|e| fail(&format!("sqlite: {e}"))),
        );
        // Seed: the target namespace (subject 0), then the others, 1,000 per namespace.
        let started = Instant::now();
        let now = now_ms();
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        let target = namespace(&k, 0);
        let mut erng = Rng(0x2545_F491_4F6C_DD1D);
        let topics = Topics::new(&mut erng);
        // The searched namespace's embeddings and update times, for the exact answers.
        let mut target_vectors: Vec<Vec<f32>> = Vec::with_capacity(s.in_namespace);
        let mut target_updated: Vec<i64> = Vec::with_capacity(s.in_namespace);
        let mut batch = Vec::with_capacity(LOAD_BATCH);
        let mut loaded = 0usize;
        let others_each = 1_000;
        for i in 0..s.total {
            let (ns, key) = if i < s.in_namespace {
                (target.clone(), format!("m/{i}"))
            } else {
                let j = i - s.in_namespace;
                (namespace(&k, 1 + j / others_each), format!("m/{}", j % others_each))
            };
            let body = text(&mut rng, &zipf, &words);
            let mut r = record(&ns, &key, body, now, &mut rng);
            let v = topics.embedding(&mut erng);
            if i < s.in_namespace {
                target_vectors.push(v.clone());
                target_updated.push(r.updated_at_ms);
            }
            r.embedding = Some(v);
            batch.push(r);
            if batch.len() == LOAD_BATCH || i + 1 == s.total {
                loaded += store.load_memories(std::mem::take(&mut batch)).await.unwrap_or_else(|e| fail(&format!("load: {e}"))) as usize;
                if loaded.is_multiple_of(100_000) || loaded == s.total {
                    progress(&format!("seeded {loaded} of {} memories ({:.0} s)", s.total, started.elapsed().as_secs_f64()));
                }
            }
        }
        let seed_s = started.elapsed().as_secs_f64();
        let db_bytes: u64 = std::fs::read_dir(scratch.path())
            .map(|d| d.flatten().filter_map(|e| e.metadata().ok()).map(|m| m.len()).sum())
            .unwrap_or(0);

        // Search.
        progress("searching by words");
        let mut qrng = Rng(0xD1B5_4A32_D192_ED03);
        let mut plain = Vec::with_capacity(s.searches);
        let mut budgeted = Vec::with_capacity(s.searches);
        let mut hits = 0usize;
        let mut utilisation = 0.0;
        for i in 0..s.searches {
            let n = 2 + (qrng.next() % 2) as usize;
            let q: Vec<&str> = (0..n).map(|_| words[50 + (qrng.next() as usize) % (VOCABULARY - 50)].as_str()).collect();
            let query = CandidateQuery { terms: rank::query_terms(&q.join(" ")), kinds: vec![], lexical_limit: 64, embedding: None, vector_limit: 0, now_ms: now_ms() };
            let t = Instant::now();
            let candidates = store.memory_candidates(&target, &query).await.unwrap_or_else(|e| fail(&format!("search: {e}")));
            let ranked = rank::rank(candidates, None, query.now_ms, Weights::default());
            if i % 2 == 0 {
                let top: Vec<_> = ranked.into_iter().take(10).collect();
                plain.push(t.elapsed().as_secs_f64() * 1e3);
                hits += top.len();
            } else {
                let sel = rank::select_within_budget(ranked, 400, 50);
                budgeted.push(t.elapsed().as_secs_f64() * 1e3);
                utilisation += sel.utilisation;
            }
        }
        plain.sort_by(f64::total_cmp);
        budgeted.sort_by(f64::total_cmp);

        // Search with an embedding: a memory's embedding plus noise (a paraphrase). The
        // first search builds the namespace's index and is reported on its own.
        let queries = s.searches / 4;
        // What the search offered before the index: the namespace's 256 most recent.
        let recent: HashSet<usize> = {
            let mut order: Vec<usize> = (0..target_updated.len()).collect();
            order.sort_by_key(|&i| std::cmp::Reverse(target_updated[i]));
            order.into_iter().take(256).collect()
        };
        progress("searching by embedding");
        let (vector_lat, recall, recent_recall, build_ms) =
            vector_searches(store.as_ref(), &target, &target_vectors, queries, &recent).await;

        // Puts through the pipeline, `writers` at once, new keys across 1,000 namespaces.
        let set = Arc::new(MemoryPolicySet {
            policies: [(
                "all-agents".to_owned(),
                serde_json::from_value(serde_json::json!({"agentSelector": {"allAgents": true}}))
                    .unwrap_or_else(|e| fail(&format!("policy: {e}"))),
            )]
            .into(),
            ..Default::default()
        });
        progress("puts");
        let (put_lat, put_s) = puts(store.clone(), &set, &k, &words, &topics, s.writers, s.put_duration).await;

        // The baseline, right after: the same bytes per put through the same writer and
        // group commit, into an otherwise empty database with one table and no index.
        let baseline = Arc::new(
            Baseline::open(&scratch.path().join("baseline.db"))
                .await
                .unwrap_or_else(|e| fail(&format!("baseline: {e}"))),
        );
        progress("baseline puts");
        let deadline = Instant::now() + s.put_duration;
        let base_started = Instant::now();
        let tasks: Vec<_> = (0..s.writers)
            .map(|w| {
                let (baseline, words, topics) = (baseline.clone(), words.clone(), topics.clone());
                tokio::spawn(async move {
                    let zipf = Zipf::new(VOCABULARY);
                    let mut rng = Rng(0xA076_1D64_78BD_642F ^ (w as u64 + 1));
                    let mut latencies = Vec::new();
                    while Instant::now() < deadline {
                        let namespace = format!("ns-{}", rng.next() % 1_000);
                        let t = Instant::now();
                        let mut bytes = text(&mut rng, &zipf, &words).into_bytes();
                        bytes.extend(topics.embedding(&mut rng).iter().flat_map(|x| x.to_le_bytes()));
                        baseline
                            .write(&namespace, &bytes)
                            .await
                            .unwrap_or_else(|e| fail(&format!("baseline put: {e}")));
                        latencies.push(t.elapsed().as_secs_f64() * 1e3);
                    }
                    latencies
                })
            })
            .collect();
        let base_lat = joined(tasks, "baseline writer").await;
        let base_s = base_started.elapsed().as_secs_f64();
        let base_per_s = base_lat.len() as f64 / base_s;

        let puts_per_s = put_lat.len() as f64 / put_s;
        println!();
        println!("memory bench ({}), embedded SQLite store", if full { "full" } else { "smoke" });
        println!("seeded {loaded} memories ({} in the searched namespace) in {seed_s:.1} s; database {:.0} MiB", s.in_namespace, db_bytes as f64 / (1 << 20) as f64);
        println!("{:<34} {:>8} {:>9} {:>9} {:>12}", "operation", "count", "p50 ms", "p99 ms", "per second");
        println!("{:<34} {:>8} {:>9.2} {:>9.2} {:>12}", "search (top 10)", plain.len(), percentile(&plain, 0.5), percentile(&plain, 0.99), "");
        println!("{:<34} {:>8} {:>9.2} {:>9.2} {:>12}", "search (budget 400 tokens)", budgeted.len(), percentile(&budgeted, 0.5), percentile(&budgeted, 0.99), "");
        println!("{:<34} {:>8} {:>9.2} {:>9.2} {:>12}", format!("search by embedding ({DIMS} dims)"), vector_lat.len(), percentile(&vector_lat, 0.5), percentile(&vector_lat, 0.99), "");
        println!("{:<34} {:>8} {:>9.2} {:>9.2} {:>12.0}", format!("put ({} writers, pipeline + CAS)", s.writers), put_lat.len(), percentile(&put_lat, 0.5), percentile(&put_lat, 0.99), puts_per_s);
        println!("{:<34} {:>8} {:>9.2} {:>9.2} {:>12.0}", format!("put baseline ({} writers, no protocol)", s.writers), base_lat.len(), percentile(&base_lat, 0.5), percentile(&base_lat, 0.99), base_per_s);
        println!("puts: {:.2} of the baseline (the same bytes through the same writer, no indexes, no pipeline)", puts_per_s / base_per_s.max(f64::MIN_POSITIVE));
        println!("mean hits per top-10 search: {:.1}; mean budget utilisation: {:.3}", hits as f64 / plain.len().max(1) as f64, utilisation / budgeted.len().max(1) as f64);
        println!("embedding search: recall@10 against exact cosine over the namespace {recall:.3} (the 256 most recent records, what search offered before the index: {recent_recall:.3}); first search, building the index of {} vectors: {build_ms:.0} ms", s.in_namespace);
        json.insert("vector_dims".into(), DIMS.into());
        json.insert("vector_search_count".into(), vector_lat.len().into());
        json.insert("vector_search_p50_ms".into(), percentile(&vector_lat, 0.5).into());
        json.insert("vector_search_p99_ms".into(), percentile(&vector_lat, 0.99).into());
        json.insert("vector_recall_at_10".into(), recall.into());
        json.insert("recent_256_recall_at_10".into(), recent_recall.into());
        json.insert("vector_index_build_ms".into(), build_ms.into());

        json.insert("mode".into(), (if full { "full" } else { "smoke" }).into());
        json.insert("memories_total".into(), loaded.into());
        json.insert("memories_in_namespace".into(), s.in_namespace.into());
        json.insert("seed_seconds".into(), seed_s.into());
        json.insert("database_bytes".into(), db_bytes.into());
        json.insert("search_count".into(), plain.len().into());
        json.insert("search_p50_ms".into(), percentile(&plain, 0.5).into());
        json.insert("search_p99_ms".into(), percentile(&plain, 0.99).into());
        json.insert("search_budgeted_p50_ms".into(), percentile(&budgeted, 0.5).into());
        json.insert("search_budgeted_p99_ms".into(), percentile(&budgeted, 0.99).into());
        json.insert("search_mean_hits".into(), (hits as f64 / plain.len().max(1) as f64).into());
        json.insert("budget_mean_utilisation".into(), (utilisation / budgeted.len().max(1) as f64).into());
        json.insert("put_writers".into(), s.writers.into());
        json.insert("put_count".into(), put_lat.len().into());
        json.insert("puts_per_s".into(), puts_per_s.into());
        json.insert("put_p50_ms".into(), percentile(&put_lat, 0.5).into());
        json.insert("put_p99_ms".into(), percentile(&put_lat, 0.99).into());
        json.insert("baseline_puts_per_s".into(), base_per_s.into());
        json.insert("baseline_put_p50_ms".into(), percentile(&base_lat, 0.5).into());
        json.insert("baseline_put_p99_ms".into(), percentile(&base_lat, 0.99).into());
        json.insert("puts_of_baseline".into(), (puts_per_s / base_per_s.max(f64::MIN_POSITIVE)).into());

        // The MongoDB protocol on FerretDB v1, what this machine can run (opt-in:
        // HARNESS_BENCH_MEMORY_MONGO=1): FerretDB has no vector search, so the store keeps
        // its in-process index there too. A smaller corpus of the same shape (one
        // namespace; HARNESS_BENCH_MEMORY_MONGO_RECORDS, 1,000 by default), searched the
        // same way. Opt-in and small because FerretDB v1 serves no filter but an exact
        // `_id` from an index: it decodes every document of the collection for the
        // search's recent-records query and for a put's identity lookup (about 2 ms per
        // document with a 384-float embedding on the two-core machine).
        if std::env::var("HARNESS_BENCH_MEMORY_MONGO").as_deref() == Ok("1") {
            let mongo_in_namespace = s.mongo_in_namespace;
            let ferret = ferret::FerretDb::start(scratch.path());
            let mongo = Arc::new(
                MongoStore::connect(&ferret.uri(), &format!("membench_{}", std::process::id()), Limits::default())
                    .await
                    .unwrap_or_else(|e| fail(&format!("mongo: {e}"))),
            );
            let started = Instant::now();
            let mut mrng = Rng(0x9E37_79B9_7F4A_7C15);
            let mut merng = Rng(0x2545_F491_4F6C_DD1D);
            let mut vectors = Vec::with_capacity(mongo_in_namespace);
            let mut batch = Vec::with_capacity(MONGO_LOAD_BATCH);
            for i in 0..mongo_in_namespace {
                let mut r = record(&target, &format!("m/{i}"), text(&mut mrng, &zipf, &words), now, &mut mrng);
                let v = topics.embedding(&mut merng);
                vectors.push(v.clone());
                r.embedding = Some(v);
                batch.push(r);
                if batch.len() == MONGO_LOAD_BATCH || i + 1 == mongo_in_namespace {
                    mongo.load_memories(std::mem::take(&mut batch)).await.unwrap_or_else(|e| fail(&format!("mongo load: {e}")));
                    progress(&format!("FerretDB: loaded {} of {mongo_in_namespace} memories ({:.0} s)", i + 1, started.elapsed().as_secs_f64()));
                }
            }
            let mongo_seed_s = started.elapsed().as_secs_f64();
            progress("FerretDB: searching by embedding");
            let (m_lat, m_recall, _, m_build_ms) = vector_searches(mongo.as_ref(), &target, &vectors, MONGO_SEARCHES, &HashSet::new()).await;
            progress("FerretDB: puts");
            let (m_put_lat, m_put_s) = puts(mongo.clone(), &set, &k, &words, &topics, s.writers, s.put_duration).await;
            let m_puts_per_s = m_put_lat.len() as f64 / m_put_s;
            println!();
            println!("MongoDB protocol (FerretDB v1, sqlite handler): {mongo_in_namespace} memories in one namespace, seeded in {mongo_seed_s:.1} s");
            println!("{:<34} {:>8} {:>9.2} {:>9.2} {:>12}", format!("search by embedding ({DIMS} dims)"), m_lat.len(), percentile(&m_lat, 0.5), percentile(&m_lat, 0.99), "");
            println!("{:<34} {:>8} {:>9.2} {:>9.2} {:>12.0}", format!("put ({} writers, pipeline + CAS)", s.writers), m_put_lat.len(), percentile(&m_put_lat, 0.5), percentile(&m_put_lat, 0.99), m_puts_per_s);
            println!("embedding search: recall@10 against exact cosine {m_recall:.3}; first search, building the index from the collection: {m_build_ms:.0} ms");
            json.insert("mongo_memories_in_namespace".into(), mongo_in_namespace.into());
            json.insert("mongo_seed_seconds".into(), mongo_seed_s.into());
            json.insert("mongo_vector_search_p50_ms".into(), percentile(&m_lat, 0.5).into());
            json.insert("mongo_vector_search_p99_ms".into(), percentile(&m_lat, 0.99).into());
            json.insert("mongo_vector_recall_at_10".into(), m_recall.into());
            json.insert("mongo_vector_index_build_ms".into(), m_build_ms.into());
            json.insert("mongo_puts_per_s".into(), m_puts_per_s.into());
            json.insert("mongo_put_p50_ms".into(), percentile(&m_put_lat, 0.5).into());
            json.insert("mongo_put_p99_ms".into(), percentile(&m_put_lat, 0.99).into());
        }
    });
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench");
    let _ = std::fs::create_dir_all(&out);
    let path = out.join("memory.json");
    match std::fs::write(
        &path,
        serde_json::to_string_pretty(&json).unwrap_or_default(),
    ) {
        Ok(()) => println!("wrote {}", path.display()),
        Err(e) => fail(&format!("writing {}: {e}", path.display())),
    }
}

/// Searches by embedding in `target`, `queries` times after a first search (which
/// builds the namespace's index and is timed on its own). A query is one of `vectors`
/// (keys `m/<i>`) plus noise. Returns the latencies (sorted), recall@10 of the top 10
/// by cosine among what the search considered against the exact top 10 over `vectors`,
/// the share of that exact top 10 held by `recent`, and the first search's time.
async fn vector_searches<S: MemoryStore + ?Sized>(
    store: &S,
    target: &Namespace,
    vectors: &[Vec<f32>],
    queries: usize,
    recent: &HashSet<usize>,
) -> (Vec<f64>, f64, f64, f64) {
    let mut lat = Vec::with_capacity(queries);
    let (mut recall_sum, mut recent_sum, mut build_ms) = (0.0, 0.0, 0.0);
    let mut vrng = Rng(0x94D0_49BB_1331_11EB);
    for i in 0..=queries {
        let base = &vectors[(vrng.next() % vectors.len() as u64) as usize];
        let q: Vec<f32> = base.iter().map(|x| x + 0.5 * vrng.normal()).collect();
        let query = CandidateQuery {
            terms: vec![],
            kinds: vec![],
            lexical_limit: 64,
            embedding: Some(q.clone()),
            vector_limit: VECTOR_LIMIT,
            now_ms: now_ms(),
        };
        let t = Instant::now();
        let candidates = store
            .memory_candidates(target, &query)
            .await
            .unwrap_or_else(|e| fail(&format!("vector search: {e}")));
        let ranked = rank::rank(candidates, Some(&q), query.now_ms, Weights::default());
        let ms = t.elapsed().as_secs_f64() * 1e3;
        if i == 0 {
            build_ms = ms;
            continue;
        }
        lat.push(ms);
        let truth = exact_top(vectors, &q, 10);
        let truth_keys: HashSet<String> = truth.iter().map(|i| format!("m/{i}")).collect();
        let mut by_cosine: Vec<(f64, &str)> = ranked
            .iter()
            .filter_map(|r| r.vector.map(|v| (v, r.record.memory_key.as_str())))
            .collect();
        by_cosine.sort_by(|a, b| b.0.total_cmp(&a.0));
        let got = by_cosine
            .iter()
            .take(10)
            .filter(|(_, k)| truth_keys.contains(*k))
            .count();
        recall_sum += got as f64 / truth.len().max(1) as f64;
        recent_sum +=
            truth.iter().filter(|i| recent.contains(i)).count() as f64 / truth.len().max(1) as f64;
    }
    lat.sort_by(f64::total_cmp);
    let n = queries.max(1) as f64;
    (lat, recall_sum / n, recent_sum / n, build_ms)
}

/// Puts through the write pipeline and the store's compare-and-set, `writers` at once
/// for `duration`, new keys across 1,000 namespaces: the latencies (sorted) and the
/// seconds they took.
async fn puts<S: MemoryStore + 'static>(
    store: Arc<S>,
    set: &Arc<MemoryPolicySet>,
    k: &Keyring,
    words: &[String],
    topics: &Topics,
    writers: usize,
    duration: Duration,
) -> (Vec<f64>, f64) {
    let writer = Writer {
        principal: "bench".into(),
        is_worker: true,
        is_application_writer: false,
    };
    let words: Arc<Vec<String>> = Arc::new(words.to_vec());
    let deadline = Instant::now() + duration;
    let started = Instant::now();
    let tasks: Vec<_> = (0..writers)
        .map(|w| {
            let (store, set, writer, k, words, topics) = (
                store.clone(),
                set.clone(),
                writer.clone(),
                k.clone(),
                words.clone(),
                topics.clone(),
            );
            tokio::spawn(async move {
                let zipf = Zipf::new(VOCABULARY);
                let mut rng = Rng(0xA076_1D64_78BD_642F ^ (w as u64 + 1));
                let policy = set.effective("bench-agent");
                let mut latencies = Vec::new();
                let mut n = 0u64;
                while Instant::now() < deadline {
                    let ns = namespace(&k, (rng.next() % 1_000) as usize);
                    let t = Instant::now();
                    let proposal = Proposal {
                        memory_key: format!("put/{w}/{n}"),
                        kind: MemoryKind::Semantic,
                        media_type: "text/plain".into(),
                        body: text(&mut rng, &zipf, &words),
                        importance: None,
                        embedding: Some(topics.embedding(&mut rng)),
                        retention_policy: None,
                        source_run_id: Some(format!("run-{n}")),
                        model_version: None,
                    };
                    let ctx = WriteContext {
                        namespace: &ns,
                        writer: &writer,
                        policy: &policy,
                        deployment: &set.deployment,
                        source_binding_id: None,
                        harness: None,
                        now_ms: now_ms(),
                    };
                    let record =
                        prepare(proposal, &ctx).unwrap_or_else(|e| fail(&format!("pipeline: {e}")));
                    store
                        .put_memory(&MemoryPut {
                            record,
                            expected_revision: None,
                            consolidation: policy.consolidation,
                            fence: None,
                        })
                        .await
                        .unwrap_or_else(|e| fail(&format!("put: {e}")));
                    latencies.push(t.elapsed().as_secs_f64() * 1e3);
                    n += 1;
                }
                latencies
            })
        })
        .collect();
    let lat = joined(tasks, "writer").await;
    (lat, started.elapsed().as_secs_f64())
}

/// The latencies of all `tasks` (each returns its own), sorted.
async fn joined(tasks: Vec<tokio::task::JoinHandle<Vec<f64>>>, what: &str) -> Vec<f64> {
    let mut lat = Vec::new();
    for t in tasks {
        lat.extend(t.await.unwrap_or_else(|e| fail(&format!("{what}: {e}"))));
    }
    lat.sort_by(f64::total_cmp);
    lat
}

fn fail(msg: &str) -> ! {
    eprintln!("bench-memory: {msg}");
    std::process::exit(1)
}

/// A progress line on stderr (the full run takes minutes; a profiler can wait for a phase).
fn progress(msg: &str) {
    eprintln!("bench-memory: {msg}");
}

/// The FerretDB section's corpus size: HARNESS_BENCH_MEMORY_MONGO_RECORDS, else `default`.
fn mongo_records(default: usize) -> usize {
    match std::env::var("HARNESS_BENCH_MEMORY_MONGO_RECORDS") {
        Err(_) => default,
        Ok(v) => match v.parse::<usize>() {
            Ok(n) if n >= 20 => n,
            _ => fail(&format!(
                "HARNESS_BENCH_MEMORY_MONGO_RECORDS: want a whole number of at least 20, got {v:?}"
            )),
        },
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}
