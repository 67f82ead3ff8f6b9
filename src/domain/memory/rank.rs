//! Ranking and budgeted selection of memory candidates.
//!
//! A store returns candidates already restricted to one authorized namespace and to
//! admitted, unexpired records (`spec/001` §5: "Retrieval applies authorization and
//! namespace filters before search/ranking"); this module only orders them. The score
//! combines lexical relevance (BM25), optional caller-supplied embeddings (cosine),
//! recency and importance. The budgeted mode is the greedy-by-value-density selection of
//! `spec/002_6a0ddaf11b83bfe4.txt` §4: value per token, skip what does not fit, report
//! utilisation. It is an approximation of the 0/1 knapsack, not an optimum.

use std::collections::HashMap;

use super::MemoryRecord;

/// BM25 parameters (the usual defaults).
const K1: f64 = 1.2;
const B: f64 = 0.75;
/// Recency half-life: a memory untouched for this long weighs half as much as a new one.
const RECENCY_HALF_LIFE_MS: f64 = 30.0 * 24.0 * 3600.0 * 1000.0;
/// Longest query, in terms: bounds the work of one search.
pub const MAX_QUERY_TERMS: usize = 32;

/// Score weights. Illustrative starting points (spec 002 §4.1 says as much), tuned so
/// relevance dominates and recency and importance break ties.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Weights {
    pub lexical: f64,
    pub vector: f64,
    pub recency: f64,
    pub importance: f64,
}

impl Default for Weights {
    fn default() -> Self {
        Weights {
            lexical: 0.55,
            vector: 0.25,
            recency: 0.1,
            importance: 0.1,
        }
    }
}

/// Lower-cased alphanumeric terms of at least two characters, at most 64 each.
pub fn tokenize(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|t| t.chars().count() >= 2)
        .map(|t| t.chars().take(64).collect::<String>().to_lowercase())
        .collect()
}

/// Distinct query terms, in order, bounded.
pub fn query_terms(text: &str) -> Vec<String> {
    let mut seen = Vec::new();
    for t in tokenize(text) {
        if !seen.contains(&t) {
            seen.push(t);
        }
        if seen.len() == MAX_QUERY_TERMS {
            break;
        }
    }
    seen
}

/// BM25 of each document for `terms`, with document frequencies counted over `docs`
/// (which must be every namespace document holding any query term) and `namespace_docs`
/// the namespace's size. Used by stores that rank in process.
pub fn bm25(terms: &[String], docs: &[&str], namespace_docs: u64) -> Vec<f64> {
    let tokenized: Vec<Vec<String>> = docs.iter().map(|d| tokenize(d)).collect();
    let n = (namespace_docs.max(docs.len() as u64)) as f64;
    let avgdl = if tokenized.is_empty() {
        1.0
    } else {
        (tokenized.iter().map(Vec::len).sum::<usize>() as f64 / tokenized.len() as f64).max(1.0)
    };
    let df: HashMap<&str, f64> = terms
        .iter()
        .map(|t| {
            let c = tokenized
                .iter()
                .filter(|d| d.iter().any(|w| w == t))
                .count();
            (t.as_str(), c as f64)
        })
        .collect();
    tokenized
        .iter()
        .map(|doc| {
            let dl = doc.len() as f64;
            terms
                .iter()
                .map(|t| {
                    let tf = doc.iter().filter(|w| *w == t).count() as f64;
                    if tf == 0.0 {
                        return 0.0;
                    }
                    let d = df.get(t.as_str()).copied().unwrap_or(0.0);
                    let idf = ((n - d + 0.5) / (d + 0.5) + 1.0).ln();
                    idf * tf * (K1 + 1.0) / (tf + K1 * (1.0 - B + B * dl / avgdl))
                })
                .sum()
        })
        .collect()
}

/// Cosine similarity; 0 when either vector is empty, of another length, or zero.
pub fn cosine(a: &[f32], b: &[f32]) -> f64 {
    if a.is_empty() || a.len() != b.len() {
        return 0.0;
    }
    let (mut dot, mut na, mut nb) = (0f64, 0f64, 0f64);
    for (x, y) in a.iter().zip(b) {
        let (x, y) = (f64::from(*x), f64::from(*y));
        dot += x * y;
        na += x * x;
        nb += y * y;
    }
    if na == 0.0 || nb == 0.0 {
        0.0
    } else {
        dot / (na.sqrt() * nb.sqrt())
    }
}

/// A candidate the store found: the record and its raw lexical score (BM25, higher is
/// better; 0 when it came in only as a recent record for vector ranking).
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate {
    pub record: MemoryRecord,
    pub lexical: f64,
}

/// A ranked result with its score parts, so a caller can see why it ranked.
#[derive(Clone, Debug, PartialEq)]
pub struct Scored {
    pub record: MemoryRecord,
    pub score: f64,
    pub lexical: f64,
    pub vector: Option<f64>,
    pub recency: f64,
    /// Estimated tokens of the body.
    pub tokens: u64,
}

/// A token estimate: about four characters a token, at least one. Callers that need an
/// exact count for their model budget in their own tokenizer; this bounds the window.
pub fn estimate_tokens(text: &str) -> u64 {
    (text.chars().count() as u64).div_ceil(4).max(1)
}

/// Orders candidates by score, best first. Lexical scores are normalized by the best
/// one, so the weights mean the same for any corpus; the vector weight applies only
/// when the query has an embedding, and is otherwise given to lexical relevance.
pub fn rank(
    candidates: Vec<Candidate>,
    query_embedding: Option<&[f32]>,
    now_ms: i64,
    w: Weights,
) -> Vec<Scored> {
    let max_lex = candidates.iter().map(|c| c.lexical).fold(0.0f64, f64::max);
    let mut scored: Vec<Scored> = candidates
        .into_iter()
        .map(|c| {
            let lexical = if max_lex > 0.0 {
                c.lexical / max_lex
            } else {
                0.0
            };
            let vector = query_embedding.map(|q| {
                c.record
                    .embedding
                    .as_deref()
                    .map_or(0.0, |e| cosine(q, e))
                    .max(0.0)
            });
            let age = (now_ms - c.record.updated_at_ms).max(0) as f64;
            let recency = 0.5f64.powf(age / RECENCY_HALF_LIFE_MS);
            let importance = f64::from(c.record.importance.clamp(0.0, 1.0));
            let score = match vector {
                Some(v) => w.lexical * lexical + w.vector * v,
                None => (w.lexical + w.vector) * lexical,
            } + w.recency * recency
                + w.importance * importance;
            let tokens = estimate_tokens(&c.record.body);
            Scored {
                record: c.record,
                score,
                lexical,
                vector,
                recency,
                tokens,
            }
        })
        .collect();
    scored.sort_by(|a, b| {
        b.score
            .total_cmp(&a.score)
            .then_with(|| a.record.memory_key.cmp(&b.record.memory_key))
    });
    scored
}

/// The budgeted selection and what it used.
#[derive(Clone, Debug, PartialEq)]
pub struct Selection {
    pub selected: Vec<Scored>,
    pub budget_tokens: u64,
    pub used_tokens: u64,
    pub considered: usize,
    /// used / budget, rounded to three places.
    pub utilisation: f64,
}

/// Greedy by value density under `budget_tokens` (spec 002 §4): candidates sorted by
/// score per token, each taken if it still fits (a large one that does not fit is
/// skipped, smaller ones after it are still tried), a body identical to one already
/// chosen is skipped ("not already said"), at most `limit` items.
pub fn select_within_budget(ranked: Vec<Scored>, budget_tokens: u64, limit: usize) -> Selection {
    let considered = ranked.len();
    let mut by_density = ranked;
    by_density.sort_by(|a, b| {
        let da = a.score / a.tokens as f64;
        let db = b.score / b.tokens as f64;
        db.total_cmp(&da)
            .then_with(|| a.record.memory_key.cmp(&b.record.memory_key))
    });
    let mut used = 0u64;
    let mut selected: Vec<Scored> = Vec::new();
    for s in by_density {
        if selected.len() == limit {
            break;
        }
        if used + s.tokens > budget_tokens || s.score <= 0.0 {
            continue;
        }
        if selected
            .iter()
            .any(|c| c.record.content_hash == s.record.content_hash)
        {
            continue;
        }
        used += s.tokens;
        selected.push(s);
    }
    let utilisation = if budget_tokens == 0 {
        0.0
    } else {
        (used as f64 / budget_tokens as f64 * 1000.0).round() / 1000.0
    };
    Selection {
        selected,
        budget_tokens,
        used_tokens: used,
        considered,
        utilisation,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::memory::{
        ApprovalRecord, ApprovalStatus, Classification, MemoryKind, MemoryScope, Namespace,
        Provenance,
    };

    fn record(key: &str, body: &str, importance: f32, updated_at_ms: i64) -> MemoryRecord {
        MemoryRecord {
            id: format!("hm_{key}"),
            namespace: Namespace {
                environment: "e".into(),
                scope: MemoryScope::User,
                key: "mn_x".into(),
                agent_id: "a".into(),
                subject_ref: None,
            },
            kind: MemoryKind::Semantic,
            memory_key: key.into(),
            media_type: "text/plain".into(),
            body: body.into(),
            content_hash: crate::domain::ids::content_digest(body.as_bytes()),
            provenance: Provenance::default(),
            approval_status: ApprovalStatus::NotRequired,
            approval: ApprovalRecord::default(),
            classification: Classification::default(),
            importance,
            embedding: None,
            revision: 1,
            source_revisions: vec![],
            retention_policy: "standard".into(),
            review_required: false,
            created_at_ms: updated_at_ms,
            updated_at_ms,
            expires_at_ms: None,
        }
    }

    #[test]
    fn tokenize_and_query_terms() {
        assert_eq!(
            tokenize("Prefer concise, ANSWERS! a"),
            vec!["prefer", "concise", "answers"]
        );
        assert_eq!(query_terms("tea tea coffee"), vec!["tea", "coffee"]);
        assert_eq!(query_terms(&"w ".repeat(10)).len(), 0);
        let many: String = (0..100).map(|i| format!("t{i} ")).collect();
        assert_eq!(query_terms(&many).len(), MAX_QUERY_TERMS);
    }

    #[test]
    fn bm25_prefers_rare_terms_and_shorter_documents() {
        let terms = vec!["tea".to_owned(), "the".to_owned()];
        let docs = [
            "the user likes tea",
            "the the the the",
            "the user likes tea and many other long things indeed",
        ];
        let s = bm25(&terms, &docs, 100);
        assert!(
            s[0] > s[1],
            "the rare term outweighs a common one repeated: {s:?}"
        );
        assert!(
            s[0] > s[2],
            "a shorter document with the same terms ranks higher: {s:?}"
        );
    }

    #[test]
    fn cosine_edges() {
        assert!((cosine(&[1.0, 0.0], &[1.0, 0.0]) - 1.0).abs() < 1e-9);
        assert!(cosine(&[1.0, 0.0], &[0.0, 1.0]).abs() < 1e-9);
        assert_eq!(cosine(&[1.0], &[1.0, 2.0]), 0.0);
        assert_eq!(cosine(&[0.0, 0.0], &[1.0, 2.0]), 0.0);
    }

    #[test]
    fn ranking_combines_terms() {
        let now = 1_000_000_000_000;
        let day = 24 * 3600 * 1000;
        let c = |key, lex, imp, age_days: i64| Candidate {
            record: record(key, key, imp, now - age_days * day),
            lexical: lex,
        };
        let ranked = rank(
            vec![
                c("relevant-old", 10.0, 0.0, 365),
                c("weak-new", 2.0, 0.0, 0),
                c("relevant-new", 10.0, 0.0, 0),
                c("relevant-new-important", 10.0, 1.0, 0),
            ],
            None,
            now,
            Weights::default(),
        );
        let keys: Vec<&str> = ranked
            .iter()
            .map(|s| s.record.memory_key.as_str())
            .collect();
        assert_eq!(
            keys,
            [
                "relevant-new-important",
                "relevant-new",
                "relevant-old",
                "weak-new"
            ]
        );

        let mut near = record("near", "x", 0.0, now);
        near.embedding = Some(vec![1.0, 0.0]);
        let mut far = record("far", "x", 0.0, now);
        far.embedding = Some(vec![0.0, 1.0]);
        let ranked = rank(
            vec![
                Candidate {
                    record: far,
                    lexical: 1.0,
                },
                Candidate {
                    record: near,
                    lexical: 1.0,
                },
            ],
            Some(&[1.0, 0.1]),
            now,
            Weights::default(),
        );
        assert_eq!(ranked[0].record.memory_key, "near");
        assert!(ranked[0].vector.is_some_and(|v| v > 0.9));
    }

    #[test]
    fn budgeted_selection_prefers_value_density() {
        // spec 002 §4: a short preference that matters beats a long chunk.
        let now = 0;
        let s = |key: &str, body_chars: usize, score: f64| Scored {
            record: record(key, &format!("{key}:{}", "x".repeat(body_chars)), 0.0, now),
            score,
            lexical: score,
            vector: None,
            recency: 1.0,
            tokens: estimate_tokens(&"y".repeat(body_chars)),
        };
        // tokens: pref 10, chunk 225, mid 50, mid2 50 (identical body to mid)
        let mut mid2 = s("mid2", 200, 0.5);
        mid2.record.content_hash = "same".into();
        let mut mid = s("mid", 200, 0.6);
        mid.record.content_hash = "same".into();
        let table = [
            // (budget, expected keys in selection order, used)
            (300u64, vec!["pref", "mid", "chunk"], 285u64),
            (100, vec!["pref", "mid"], 60),
            (9, vec![], 0),
            (240, vec!["pref", "mid"], 60),
        ];
        for (budget, want, used) in table {
            let ranked = vec![
                s("chunk", 900, 0.9),
                s("pref", 40, 0.8),
                mid.clone(),
                mid2.clone(),
            ];
            let sel = select_within_budget(ranked, budget, 10);
            let keys: Vec<&str> = sel
                .selected
                .iter()
                .map(|s| s.record.memory_key.as_str())
                .collect();
            assert_eq!(keys, want, "budget {budget}");
            assert_eq!(sel.used_tokens, used, "budget {budget}");
            assert_eq!(sel.considered, 4);
            assert!(sel.used_tokens <= budget);
            assert!(
                (sel.utilisation - ((used as f64 / budget as f64 * 1000.0).round() / 1000.0)).abs()
                    < 1e-9
            );
        }
        let sel =
            select_within_budget(vec![s("a", 4, 1.0), s("b", 4, 0.9), s("c", 4, 0.8)], 100, 2);
        assert_eq!(sel.selected.len(), 2, "the limit bounds the selection too");
    }
}
