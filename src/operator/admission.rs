//! Which bindings may start their first lease now.
//!
//! A burst of new bindings (a GitOps sync, a load test) must not take every reconcile
//! slot of the binding controller: a claim that turns Ready has to find a slot free for
//! its binding's next step. So at most `slots` bindings without a lease are reconciled
//! at once (half of `--concurrency`); the others wait in arrival order and are woken,
//! one per freed slot, through the controller's trigger stream. A waiting binding costs
//! nothing while it waits: no timer per binding, no reconcile, no API call.
//!
//! A freed slot is handed to the first waiter (not put back for anyone to take), so a
//! binding that arrived later cannot overtake the queue. A binding that was admitted
//! once and has to come back (a conflict, a failure) goes to the front: it is further
//! along than the bindings that never started. A handed-over slot the woken binding
//! never comes to take (it was deleted meanwhile) is passed on after [`GRANT_TTL`].

use std::{
    collections::{HashMap, HashSet, VecDeque},
    sync::{Arc, Mutex, MutexGuard},
    time::{Duration, Instant},
};

use kube::runtime::reflector::ObjectRef;
use tokio::sync::mpsc;

use crate::api::HarnessBinding;

/// How long a slot handed to a woken binding stays reserved for it.
pub const GRANT_TTL: Duration = Duration::from_secs(30);

type Key = ObjectRef<HarnessBinding>;

/// The admission queue of bindings starting their first lease.
pub struct Admission {
    state: Mutex<State>,
    wake: mpsc::UnboundedSender<Key>,
}

#[derive(Default)]
struct State {
    free: usize,
    /// Waiting bindings, first to be admitted at the front.
    waiting: VecDeque<Key>,
    queued: HashSet<Key>,
    /// Slots handed to woken bindings that have not come to take them yet.
    granted: HashMap<Key, Instant>,
    /// Bindings admitted at least once that hold no lease yet.
    started: HashSet<Key>,
}

/// What [`Admission::enter`] answers.
pub enum Entry {
    /// Go on; the slot is free again when this is dropped.
    Admitted(Slot),
    /// Wait: the binding is queued at `position` (0 = next) and will be woken.
    Waiting { position: usize, newly: bool },
}

/// One admitted binding's slot; dropping it admits the next waiter.
pub struct Slot {
    admission: Arc<Admission>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.admission.release(Instant::now());
    }
}

impl Admission {
    /// `slots` bindings may start at once; `wake` receives the bindings to reconcile
    /// again because a slot was handed to them.
    pub fn new(slots: usize) -> (Arc<Self>, mpsc::UnboundedReceiver<Key>) {
        let (wake, woken) = mpsc::unbounded_channel();
        let admission = Admission {
            state: Mutex::new(State {
                free: slots.max(1),
                ..State::default()
            }),
            wake,
        };
        (Arc::new(admission), woken)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state stays consistent across every early return, so a panic elsewhere
        // while it was held leaves nothing half-done: keep using it.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A binding without a lease asks to start.
    pub fn enter(self: &Arc<Self>, key: &Key) -> Entry {
        self.enter_at(key, Instant::now())
    }

    fn enter_at(self: &Arc<Self>, key: &Key, now: Instant) -> Entry {
        let mut s = self.lock();
        for _ in 0..s.expire(now) {
            self.hand_over(&mut s, now);
        }
        let admitted = if s.granted.remove(key).is_some() {
            true
        } else if s.free > 0 && s.waiting.is_empty() {
            s.free -= 1;
            true
        } else {
            false
        };
        if admitted {
            s.started.insert(key.clone());
            return Entry::Admitted(Slot {
                admission: self.clone(),
            });
        }
        if s.queued.contains(key) {
            let position = s.waiting.iter().position(|k| k == key).unwrap_or(0);
            return Entry::Waiting {
                position,
                newly: false,
            };
        }
        s.queued.insert(key.clone());
        let position = if s.started.contains(key) {
            s.waiting.push_front(key.clone());
            0
        } else {
            s.waiting.push_back(key.clone());
            s.waiting.len() - 1
        };
        Entry::Waiting {
            position,
            newly: true,
        }
    }

    /// The binding holds a lease, or is going away: it no longer waits, and a slot
    /// handed to it goes to the next waiter.
    pub fn leave(&self, key: &Key) {
        let mut s = self.lock();
        s.started.remove(key);
        if s.queued.remove(key) {
            s.waiting.retain(|k| k != key);
        }
        if s.granted.remove(key).is_some() {
            self.hand_over(&mut s, Instant::now());
        }
    }

    /// Bindings waiting for a slot.
    pub fn waiting(&self) -> usize {
        self.lock().waiting.len()
    }

    /// A slot is free again.
    fn release(&self, now: Instant) {
        let mut s = self.lock();
        self.hand_over(&mut s, now);
    }

    /// Hands a free slot to the first waiter and wakes it, or keeps it.
    fn hand_over(&self, s: &mut State, now: Instant) {
        match s.waiting.pop_front() {
            Some(next) => {
                s.queued.remove(&next);
                s.granted.insert(next.clone(), now);
                // A closed receiver means the controller stopped: nothing to wake.
                let _ = self.wake.send(next);
            }
            None => s.free += 1,
        }
    }
}

impl State {
    /// Drops grants older than [`GRANT_TTL`]; returns how many slots they free.
    fn expire(&mut self, now: Instant) -> usize {
        let before = self.granted.len();
        self.granted
            .retain(|_, at| now.saturating_duration_since(*at) < GRANT_TTL);
        before - self.granted.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> Key {
        ObjectRef::new(name).within("ns")
    }

    fn admitted(e: Entry) -> Slot {
        match e {
            Entry::Admitted(s) => s,
            Entry::Waiting { position, .. } => panic!("waiting at {position}, not admitted"),
        }
    }

    fn position(e: Entry) -> usize {
        match e {
            Entry::Admitted(_) => panic!("admitted, not waiting"),
            Entry::Waiting { position, .. } => position,
        }
    }

    #[test]
    fn waiters_are_admitted_in_arrival_order_and_woken_one_per_freed_slot() {
        let (adm, mut woken) = Admission::new(2);
        let a = admitted(adm.enter(&key("a")));
        let _b = admitted(adm.enter(&key("b")));
        assert_eq!(position(adm.enter(&key("c"))), 0);
        assert_eq!(position(adm.enter(&key("d"))), 1);
        // Asking again keeps the place and queues nothing twice.
        assert_eq!(position(adm.enter(&key("d"))), 1);
        assert_eq!(adm.waiting(), 2);
        // A newcomer cannot take the slot a finished binding frees: it goes to c.
        drop(a);
        assert_eq!(woken.try_recv().ok(), Some(key("c")));
        assert!(woken.try_recv().is_err(), "one wake per freed slot");
        assert_eq!(position(adm.enter(&key("e"))), 1);
        let _c = admitted(adm.enter(&key("c")));
        assert_eq!(adm.waiting(), 2);
    }

    #[test]
    fn a_binding_admitted_before_comes_back_at_the_front() {
        let (adm, _woken) = Admission::new(1);
        let a = admitted(adm.enter(&key("a")));
        assert_eq!(position(adm.enter(&key("b"))), 0);
        drop(a);
        // `a` lost a conflict and asks again while b holds the handed-over slot.
        let b = admitted(adm.enter(&key("b")));
        assert_eq!(position(adm.enter(&key("c"))), 0);
        assert_eq!(position(adm.enter(&key("a"))), 0, "a goes before c");
        drop(b);
        let _a = admitted(adm.enter(&key("a")));
    }

    #[test]
    fn a_deleted_waiter_leaves_the_queue_and_its_grant_passes_on() {
        let (adm, mut woken) = Admission::new(1);
        let a = admitted(adm.enter(&key("a")));
        position(adm.enter(&key("b")));
        position(adm.enter(&key("c")));
        position(adm.enter(&key("d")));
        adm.leave(&key("c"));
        assert_eq!(adm.waiting(), 2);
        drop(a);
        assert_eq!(woken.try_recv().ok(), Some(key("b")));
        // b is deleted before it takes its slot: d is woken instead.
        adm.leave(&key("b"));
        assert_eq!(woken.try_recv().ok(), Some(key("d")));
        let _d = admitted(adm.enter(&key("d")));
    }

    #[test]
    fn a_grant_nobody_takes_expires_and_frees_the_slot() {
        let (adm, mut woken) = Admission::new(1);
        let a = admitted(adm.enter(&key("a")));
        position(adm.enter(&key("b")));
        drop(a);
        assert_eq!(woken.try_recv().ok(), Some(key("b")));
        // b never comes; past the grant's lifetime a newcomer gets the slot.
        let later = Instant::now() + GRANT_TTL + Duration::from_secs(1);
        let _x = admitted(adm.enter_at(&key("x"), later));
    }

    #[test]
    fn a_lease_holder_leaving_frees_nothing_it_did_not_hold() {
        let (adm, _woken) = Admission::new(1);
        let _a = admitted(adm.enter(&key("a")));
        adm.leave(&key("a"));
        adm.leave(&key("zz"));
        position(adm.enter(&key("b")));
    }
}
