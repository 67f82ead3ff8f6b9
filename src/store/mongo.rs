//! MongoDB backend (work in progress).
