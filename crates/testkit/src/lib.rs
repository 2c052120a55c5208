//! Dev-only helpers shared by the workspace's tests (a `[dev-dependencies]` entry only; never
//! published). [`tools`]: finding the external programs a test needs, and failing the test —
//! or, with `IRONRAID_ALLOW_MISSING_TOOLS=1`, skipping it — when one is missing.

pub mod tools;

pub use tools::{
    locate, on_path, package_of, require_tool, require_tools, tool_missing, tool_present,
    ALLOW_MISSING_TOOLS, SBIN_DIRS,
};
