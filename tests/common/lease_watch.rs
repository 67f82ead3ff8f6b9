//! Watches one binding's claims and lease generations for a whole test: the most live
//! (not deleting) claims seen at once, and every generation its status showed, in order.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use futures::StreamExt;
use harness_engine::{
    api::{HarnessBinding, sandbox::SandboxClaim},
    operator::binding::BINDING_UID_LABEL,
};
use kube::{
    Api, ResourceExt,
    runtime::{WatchStreamExt, watcher},
};

pub struct LeaseWatch {
    max_live: Arc<Mutex<usize>>,
    generations: Arc<Mutex<Vec<i64>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl LeaseWatch {
    /// Starts both watches for the binding `name` (uid `uid`).
    pub fn start(
        claims: Api<SandboxClaim>,
        bindings: Api<HarnessBinding>,
        uid: &str,
        name: &str,
    ) -> Self {
        let max_live = Arc::new(Mutex::new(0usize));
        let generations: Arc<Mutex<Vec<i64>>> = Arc::default();
        let claim_watch = {
            let max_live = max_live.clone();
            // Watches go on through API-server restarts (backoff, then a fresh list).
            let stream = watcher(
                claims,
                watcher::Config::default().labels(&format!("{BINDING_UID_LABEL}={uid}")),
            )
            .default_backoff();
            tokio::spawn(async move {
                let mut live: HashMap<String, bool> = HashMap::new();
                let mut stream = std::pin::pin!(stream);
                while let Some(event) = stream.next().await {
                    let Ok(event) = event else { continue };
                    match event {
                        // A fresh list after a broken watch: what it lists is all there is.
                        watcher::Event::Init => live.clear(),
                        watcher::Event::Apply(c) | watcher::Event::InitApply(c) => {
                            live.insert(c.name_any(), c.metadata.deletion_timestamp.is_none());
                        }
                        watcher::Event::Delete(c) => {
                            live.remove(&c.name_any());
                        }
                        _ => {}
                    }
                    let n = live.values().filter(|v| **v).count();
                    let mut m = max_live.lock().unwrap_or_else(|e| e.into_inner());
                    *m = (*m).max(n);
                }
            })
        };
        let binding_watch = {
            let generations = generations.clone();
            let stream = watcher(
                bindings,
                watcher::Config::default().fields(&format!("metadata.name={name}")),
            )
            .default_backoff();
            tokio::spawn(async move {
                let mut stream = std::pin::pin!(stream);
                while let Some(event) = stream.next().await {
                    let Ok(event) = event else { continue };
                    if let watcher::Event::Apply(b) | watcher::Event::InitApply(b) = event
                        && let Some(g) = b.status.and_then(|s| s.lease).map(|l| l.generation)
                    {
                        generations
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .push(g);
                    }
                }
            })
        };
        LeaseWatch {
            max_live,
            generations,
            tasks: vec![claim_watch, binding_watch],
        }
    }

    /// Stops the watches: (most live claims at once, the generations seen in order).
    pub fn finish(self) -> (usize, Vec<i64>) {
        for t in &self.tasks {
            t.abort();
        }
        let max = *self.max_live.lock().unwrap_or_else(|e| e.into_inner());
        let seen = self
            .generations
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        (max, seen)
    }
}
