//! pgoutput decoder (work in progress).
