//! Test kit (work in progress).
