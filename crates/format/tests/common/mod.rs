//! Test helper: finding the external tools a test needs, and failing when one is missing.
//!
//! The logic lives in the `testkit` crate, shared by every test; this re-exports what these
//! tests use.

#![allow(unused_imports)]

pub use testkit::{require_tool, ALLOW_MISSING_TOOLS};
