//! Dev-only helpers shared by the workspace's tests (a `[dev-dependencies]` entry only; never
//! published). It depends on none of the workspace's crates, so any crate's tests can use it and
//! the references it holds cannot borrow from the code they check:
//!
//! - [`tools`]: finding the external programs a test needs, and failing the test — or, with
//!   `IRONRAID_ALLOW_MISSING_TOOLS=1`, skipping it — when one is missing;
//! - [`md_model`]: md's layouts as grids filled from md-format.md's prose (the layout crate's
//!   tests compare the crate with it);
//! - [`oracle`]: where md puts data, parity and copies in member images and whether redundancy
//!   agrees, computed byte by byte from [`md_model`];
//! - [`crash_model`]: what an array may hold after a power cut, sector by sector;
//! - [`etcd`]: a real etcd server on free loopback ports, for the cluster's tests;
//! - [`seeds`]: which seeds a simulation test runs, and the replay line of a failing one
//!   ([`for_each_seed!`]).
//!
//! The harness that builds engine arrays over simulated members is `simkit`, above this crate.

pub mod crash_model;
pub mod etcd;
pub mod md_model;
pub mod oracle;
pub mod seeds;
pub mod tools;

pub use crash_model::CrashModel;
pub use seeds::Seeds;
pub use tools::{
    locate, on_path, package_of, require_tool, require_tools, tool_missing, tool_present,
    ALLOW_MISSING_TOOLS, SBIN_DIRS,
};
