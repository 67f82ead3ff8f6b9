//! The vector index memory search uses when a query carries an embedding: one flat index
//! per namespace, so the search considers every searchable record of the namespace and
//! nothing of any other (the namespace filter comes first, as for lexical search).
//!
//! Each vector is kept as its direction quantized to 8 bits (the vector divided by its
//! norm, times 127, rounded), so a record costs one byte per dimension in memory and a
//! search is one pass of integer dot products over the namespace. The pass returns the
//! best candidates by that approximate cosine; the caller reads those records and ranks
//! them with their stored, full-precision embeddings, so quantization can only change
//! which records reach ranking, never their scores. With several times more candidates
//! than results the exact top results are almost always among them (`make bench-memory`
//! measures recall against exact cosine).
//!
//! A namespace's index is built from the store the first time it is searched, and kept
//! up to date by the writes of this process after they are durable ([`VectorIndex::apply`]).
//! To build without missing a write, the namespace is registered (as loading) before the
//! store is read: a write that lands after the read began is logged meanwhile and
//! replayed onto what was read. Changes are whole (a key's vector, or its removal), so
//! replaying one that the read already saw changes nothing.
//!
//! Vectors of different lengths live side by side; a query is compared with the vectors
//! of its own length only (cosine of vectors of different lengths is 0 in ranking too).

use std::{
    cmp::Reverse,
    collections::{BinaryHeap, HashMap},
    hash::Hash,
    sync::{Arc, Mutex, PoisonError, RwLock},
    time::Instant,
};

/// How many nearest vectors to look at, round by round, to find `limit` that pass a
/// filter the index does not know (a kind, expiry, a record awaiting approval): `limit`,
/// then four times more each round, up to sixteen times `limit`. Each round is one pass
/// over the namespace's vectors; the rows read grow with what the filter drops. A
/// filter that drops more than fifteen in sixteen of the nearest can still return
/// fewer than `limit` (docs/memory.md).
pub fn widen(limit: usize) -> impl Iterator<Item = usize> {
    let last = limit.saturating_mul(WIDEN_MAX);
    std::iter::successors(Some(limit.max(1)), move |n| {
        (*n < last).then(|| n.saturating_mul(4).min(last))
    })
}

/// How far [`widen`] goes, as a multiple of the limit.
pub const WIDEN_MAX: usize = 16;

/// A change to one key's vector: its new direction, or `None` when it leaves the index
/// (deleted, no longer searchable, or written without an embedding).
#[derive(Clone, Debug)]
pub struct Change<K> {
    pub namespace: Option<String>,
    pub key: K,
    pub vector: Option<Vec<f32>>,
}

impl<K> Change<K> {
    /// What a durable write of `record` under `key` does to the index: only admitted
    /// records are searched, so only they hold a place in it.
    pub fn of_write(key: K, record: &crate::domain::memory::MemoryRecord) -> Self {
        Change {
            namespace: Some(record.namespace.key.clone()),
            key,
            vector: record
                .embedding
                .clone()
                .filter(|_| record.approval_status.searchable()),
        }
    }

    /// A record deleted under `key` (from whichever namespace holds it).
    pub fn removal(key: K) -> Self {
        Change {
            namespace: None,
            key,
            vector: None,
        }
    }
}

/// Every namespace's index (those searched since the process started).
pub struct VectorIndex<K> {
    spaces: Mutex<HashMap<String, Arc<Space<K>>>>,
}

impl<K> Default for VectorIndex<K> {
    fn default() -> Self {
        VectorIndex {
            spaces: Mutex::new(HashMap::new()),
        }
    }
}

/// One namespace's index.
pub struct Space<K> {
    state: RwLock<State<K>>,
}

struct State<K> {
    /// The index; `None` until first built.
    flat: Option<Flat<K>>,
    built: Option<Instant>,
    /// While a build reads the store: the changes since it began, to replay onto what it
    /// read.
    log: Option<Vec<Change<K>>>,
}

impl<K: Clone + Eq + Hash> VectorIndex<K> {
    /// The namespace's index, registered (as being built) if it was not yet. Call before
    /// reading the store to build it.
    pub fn space(&self, namespace: &str) -> Arc<Space<K>> {
        let mut spaces = self.spaces.lock().unwrap_or_else(PoisonError::into_inner);
        spaces
            .entry(namespace.to_owned())
            .or_insert_with(|| {
                Arc::new(Space {
                    state: RwLock::new(State {
                        flat: None,
                        built: None,
                        log: Some(Vec::new()),
                    }),
                })
            })
            .clone()
    }

    /// Applies durable changes to the namespaces that have an index. A change without a
    /// namespace (a delete by key) is applied to every namespace holding the key.
    pub fn apply(&self, changes: impl IntoIterator<Item = Change<K>>) {
        let spaces = self.spaces.lock().unwrap_or_else(PoisonError::into_inner);
        for change in changes {
            match &change.namespace {
                Some(ns) => {
                    if let Some(space) = spaces.get(ns) {
                        space.apply(change.clone());
                    }
                }
                None => {
                    for space in spaces.values() {
                        space.apply(change.clone());
                    }
                }
            }
        }
    }
}

impl<K: Clone + Eq + Hash> Space<K> {
    /// When the index was built; `None` while it is not.
    pub fn built(&self) -> Option<Instant> {
        self.state
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .built
    }

    /// Before reading the store to rebuild a built index: from now on changes are also
    /// logged for replay. Returns the instant to pass to [`Space::install`].
    pub fn begin_build(&self) -> Instant {
        let mut state = self.state.write().unwrap_or_else(PoisonError::into_inner);
        state.log.get_or_insert_with(Vec::new);
        Instant::now()
    }

    /// Installs what a read of the store that began at `began` found, replaying the
    /// changes logged since. Does nothing if another build that began later, or any
    /// build when `began` is `None` (first build only), got there first.
    pub fn install(&self, loaded: Vec<(K, Vec<f32>)>, began: Option<Instant>) {
        let mut flat = Flat::default();
        for (key, vector) in loaded {
            flat.upsert(key, &vector);
        }
        let mut state = self.state.write().unwrap_or_else(PoisonError::into_inner);
        let newer = match (state.built, began) {
            (None, _) => false,
            (Some(_), None) => true,
            (Some(built), Some(began)) => built >= began,
        };
        if newer {
            return;
        }
        for change in state.log.take().unwrap_or_default() {
            flat.change(change);
        }
        state.flat = Some(flat);
        state.built = Some(Instant::now());
    }

    fn apply(&self, change: Change<K>) {
        let mut state = self.state.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(log) = &mut state.log {
            log.push(change.clone());
        }
        if let Some(flat) = &mut state.flat {
            flat.change(change);
        }
    }

    /// Up to `n` keys of the vectors closest in direction to `query`, best first; empty
    /// while the index is not built. A caller that filters the keys (by kind, expiry)
    /// asks again for more through [`widen`].
    pub fn nearest(&self, query: &[f32], n: usize) -> Vec<K> {
        let state = self.state.read().unwrap_or_else(PoisonError::into_inner);
        state
            .flat
            .as_ref()
            .map_or_else(Vec::new, |flat| flat.nearest(query, n))
    }

    /// Vectors in the index.
    pub fn len(&self) -> usize {
        let state = self.state.read().unwrap_or_else(PoisonError::into_inner);
        state.flat.as_ref().map_or(0, |flat| flat.slots.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The quantized vectors of one namespace, grouped by length.
struct Flat<K> {
    groups: HashMap<usize, Group<K>>,
    /// key -> (length, position in its group).
    slots: HashMap<K, (usize, usize)>,
}

impl<K> Default for Flat<K> {
    fn default() -> Self {
        Flat {
            groups: HashMap::new(),
            slots: HashMap::new(),
        }
    }
}

struct Group<K> {
    dims: usize,
    keys: Vec<K>,
    codes: Vec<i8>,
}

impl<K: Clone + Eq + Hash> Flat<K> {
    fn change(&mut self, change: Change<K>) {
        match change.vector {
            Some(v) => self.upsert(change.key, &v),
            None => self.remove(&change.key),
        }
    }

    fn upsert(&mut self, key: K, vector: &[f32]) {
        let Some(code) = quantize(vector) else {
            self.remove(&key);
            return;
        };
        if let Some(&(dims, at)) = self.slots.get(&key)
            && dims == code.len()
            && let Some(group) = self.groups.get_mut(&dims)
        {
            group.codes[at * dims..(at + 1) * dims].copy_from_slice(&code);
            return;
        }
        self.remove(&key);
        let dims = code.len();
        let group = self.groups.entry(dims).or_insert_with(|| Group {
            dims,
            keys: Vec::new(),
            codes: Vec::new(),
        });
        self.slots.insert(key.clone(), (dims, group.keys.len()));
        group.keys.push(key);
        group.codes.extend_from_slice(&code);
    }

    fn remove(&mut self, key: &K) {
        let Some((dims, at)) = self.slots.remove(key) else {
            return;
        };
        let Some(group) = self.groups.get_mut(&dims) else {
            return;
        };
        // Swap-remove: the last vector takes the freed position.
        let last = group.keys.len() - 1;
        if at != last {
            group.keys.swap(at, last);
            let (head, tail) = group.codes.split_at_mut(last * dims);
            head[at * dims..(at + 1) * dims].copy_from_slice(&tail[..dims]);
            if let Some(slot) = self.slots.get_mut(&group.keys[at]) {
                slot.1 = at;
            }
        }
        group.keys.pop();
        group.codes.truncate(last * dims);
    }

    fn nearest(&self, query: &[f32], n: usize) -> Vec<K> {
        let (Some(q), true) = (quantize(query), n > 0) else {
            return Vec::new();
        };
        let Some(group) = self.groups.get(&q.len()) else {
            return Vec::new();
        };
        // The n best (score, position) so far; the root is the worst of them.
        let mut best: BinaryHeap<Reverse<(i32, usize)>> = BinaryHeap::with_capacity(n + 1);
        for (at, code) in group.codes.chunks_exact(group.dims).enumerate() {
            let score = dot(&q, code);
            if best.len() < n {
                best.push(Reverse((score, at)));
            } else if best.peek().is_some_and(|w| score > w.0.0) {
                best.pop();
                best.push(Reverse((score, at)));
            }
        }
        let mut found: Vec<(i32, usize)> = best.into_iter().map(|r| r.0).collect();
        found.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        found
            .into_iter()
            .map(|(_, at)| group.keys[at].clone())
            .collect()
    }
}

/// The direction of `v` in 8 bits a component; `None` for a zero or non-finite vector.
fn quantize(v: &[f32]) -> Option<Vec<i8>> {
    let norm = v
        .iter()
        .map(|x| f64::from(*x) * f64::from(*x))
        .sum::<f64>()
        .sqrt();
    if v.is_empty() || !norm.is_finite() || norm == 0.0 {
        return None;
    }
    Some(
        v.iter()
            .map(|x| (f64::from(*x) / norm * 127.0).round().clamp(-127.0, 127.0) as i8)
            .collect(),
    )
}

/// Integer dot product; the compiler vectorizes the widening multiply-add.
fn dot(a: &[i8], b: &[i8]) -> i32 {
    a.iter()
        .zip(b)
        .map(|(&x, &y)| i32::from(x) * i32::from(y))
        .sum()
}

#[cfg(test)]
mod tests {
    #[test]
    fn widening_grows_fourfold_to_sixteen_times_the_limit() {
        assert_eq!(super::widen(10).collect::<Vec<_>>(), [10, 40, 160]);
        assert_eq!(super::widen(64).collect::<Vec<_>>(), [64, 256, 1024]);
        assert_eq!(super::widen(3).collect::<Vec<_>>(), [3, 12, 48]);
        assert_eq!(super::widen(0).collect::<Vec<_>>(), [1]);
    }

    use super::*;

    fn change(ns: &str, key: u32, v: Option<Vec<f32>>) -> Change<u32> {
        Change {
            namespace: Some(ns.to_owned()),
            key,
            vector: v,
        }
    }

    #[test]
    fn nearest_orders_by_direction_and_keeps_lengths_apart() {
        let index = VectorIndex::<u32>::default();
        let space = index.space("ns");
        space.install(
            vec![
                (1, vec![1.0, 0.0, 0.0]),
                (2, vec![0.0, 1.0, 0.0]),
                (3, vec![10.0, 1.0, 0.0]), // close to 1 in direction, large norm
                (4, vec![1.0, 0.0]),       // another length: never compared
            ],
            None,
        );
        assert_eq!(space.nearest(&[1.0, 0.05, 0.0], 2), vec![1, 3]);
        assert_eq!(space.nearest(&[0.0, 1.0, 0.0], 1), vec![2]);
        assert_eq!(space.nearest(&[1.0, 0.0], 5), vec![4]);
        assert!(space.nearest(&[0.0, 0.0, 0.0], 5).is_empty(), "zero query");
        assert!(space.nearest(&[1.0, 0.0, 0.0, 0.0], 5).is_empty());
    }

    #[test]
    fn changes_during_a_build_are_replayed_onto_it() {
        let index = VectorIndex::<u32>::default();
        let space = index.space("ns");
        assert!(space.nearest(&[1.0, 0.0], 3).is_empty(), "not built yet");
        // Durable while the build's read was running: one new key, one removal of a key
        // the read saw, one update of a key the read saw, one for another namespace.
        index.apply([
            change("ns", 7, Some(vec![0.0, 1.0])),
            change("ns", 1, None),
            change("ns", 2, Some(vec![-1.0, 0.0])),
            change("other", 9, Some(vec![1.0, 0.0])),
        ]);
        space.install(vec![(1, vec![1.0, 0.0]), (2, vec![1.0, 0.1])], None);
        assert_eq!(space.len(), 2);
        assert_eq!(space.nearest(&[0.0, 1.0], 1), vec![7]);
        assert_eq!(space.nearest(&[-1.0, 0.0], 1), vec![2]);
        assert!(!space.nearest(&[1.0, 0.0], 5).contains(&1), "removed");
        // After the build, changes apply directly; a delete without a namespace finds it.
        index.apply([Change {
            namespace: None,
            key: 7,
            vector: None,
        }]);
        assert_eq!(space.len(), 1);
        assert!(index.space("other").nearest(&[1.0, 0.0], 1).is_empty());
        // A rebuild keeps serving the old index, and replays what lands meanwhile.
        let began = space.begin_build();
        index.apply([change("ns", 8, Some(vec![0.0, -1.0]))]);
        assert_eq!(
            space.nearest(&[0.0, -1.0], 1),
            vec![8],
            "old index, updated"
        );
        space.install(vec![(2, vec![-1.0, 0.0])], Some(began));
        assert_eq!(space.len(), 2);
        assert_eq!(space.nearest(&[0.0, -1.0], 1), vec![8]);
        // A build that began before the last one finished is dropped.
        space.install(Vec::new(), Some(began));
        assert_eq!(space.len(), 2);
        // A first-build install after a build is dropped too.
        space.install(Vec::new(), None);
        assert_eq!(space.len(), 2);
    }

    #[test]
    fn removal_keeps_the_other_positions_right() {
        let mut flat = Flat::<u32>::default();
        // 10 degrees apart: far more than 8-bit quantization can blur.
        for k in 0..18u32 {
            let a = f32::from(u16::try_from(k).unwrap_or(0)) / 18.0 * std::f32::consts::PI;
            flat.upsert(k, &[a.cos(), a.sin()]);
        }
        for k in (0..18).step_by(3) {
            flat.remove(&k);
        }
        flat.upsert(4, &[0.0, -1.0]);
        for k in 0..18u32 {
            let a = f32::from(u16::try_from(k).unwrap_or(0)) / 18.0 * std::f32::consts::PI;
            let got = flat.nearest(&[a.cos(), a.sin()], 1);
            if k % 3 == 0 {
                assert_ne!(got, vec![k], "{k} was removed");
            } else if k == 4 {
                assert_eq!(flat.nearest(&[0.0, -1.0], 1), vec![4]);
            } else {
                assert_eq!(got, vec![k]);
            }
        }
    }
}
