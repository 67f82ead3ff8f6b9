//! Pure rules of Harness Engine: identities and keyed digests, state scopes and fencing,
//! the commit protocol's vocabulary, and the bounds every store enforces.
//!
//! Nothing here performs IO or depends on a store, a server or Kubernetes; stores and
//! servers import these types, never the other way round.

pub mod duration;
pub mod ids;
pub mod ledger;
pub mod limits;
pub mod memory;
pub mod state;
