//! Embedded SQLite backend (work in progress).
