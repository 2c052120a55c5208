//! The array engine: assembles md arrays from member devices and serves reads, writes and
//! flushes on them with md's layouts, parity and superblocks.
//!
//! Layers below (pure): `layout` maps addresses, `parity` computes XOR / P+Q, `format` encodes
//! superblocks. The engine sees members only through `device::Device`. Frontends (NBD, CLI) call
//! [`Array`]'s methods from as many threads as they like.

#![warn(clippy::too_many_lines)]

mod array;
mod assemble;
mod badblocks;
mod bitmap;
mod bufpool;
mod clock;
mod commit;
mod create;
mod error;
mod events;
mod gathered;
mod guided;
mod heal;
mod integrity;
mod intent;
mod io;
mod journal;
mod journal_fail;
mod manage;
mod member;
mod meta;
mod mirror;
mod mirror_heal;
mod no_space;
mod paged;
mod policy;
mod range_lock;
mod rebuild;
mod record_cache;
mod scrub;
mod stripe;
mod stripe_cache;
mod sync;
mod used;
mod verify;
mod writeback;

pub use array::{
    Array, ArrayConfig, ArrayStatus, BitmapStatus, MemberState, MemberStatus, UsedStatus,
    ASSEMBLED_READ_ONLY,
};
pub use assemble::{assemble, AssembleOptions};
pub use bitmap::read_bitmap;
pub use clock::{Clock, ManualClock, SystemClock};
pub use create::{create, create_with_clock, BitmapSpec, CreateSpec, Created};
pub use error::{EngineError, ErrorKind, Result};
pub use events::Event;
pub use gathered::GatheredWrite;
pub use guided::{GuidanceStatus, WriteWatch, DEFAULT_GUIDE_TIMEOUT};
pub use integrity::{IntegrityCounts, IntegrityStatus};
pub use intent::WriteIntent;
pub use io::ReadVerifier;
pub use journal::{JournalStatus, Replayed};
pub use meta::read_superblock;
pub use no_space::NoSpaceStatus;
pub use record_cache::CacheStats;
pub use sync::{SyncAction, SyncStatus, DEFAULT_SPEED_MAX, DEFAULT_SPEED_MIN};
pub use verify::VerifyReport;
