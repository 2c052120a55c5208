//! The array engine: assembles md arrays from member devices and serves reads, writes and
//! flushes on them with md's layouts, parity and superblocks.
//!
//! Layers below (pure): `layout` maps addresses, `parity` computes XOR / P+Q, `format` encodes
//! superblocks. The engine sees members only through `device::Device`. Frontends (NBD, CLI) call
//! [`Array`]'s methods from as many threads as they like.

#![warn(clippy::too_many_lines)]

mod array;
mod background;
mod clock;
pub mod cluster;
mod error;
mod events;
mod integrity;
mod intervals;
mod io;
mod lifecycle;
mod lock;
mod members;
mod personality;
mod policy;
mod status;
mod stripe_parity;
mod work;

pub use array::{AnyBytes, Array, ArrayConfig, SyncWindow};
pub use background::{SyncStatus, DEFAULT_SPEED_MAX, DEFAULT_SPEED_MIN};
pub use clock::{Clock, ManualClock, SystemClock};
pub use error::{EngineError, ErrorKind, Result};
pub use events::Event;
pub use integrity::record_cache::CacheStats;
pub use integrity::{IntegrityCounts, IntegrityStatus};
pub use io::bufpool::PoolUsage;
pub use io::no_space::NoSpaceStatus;
pub use io::ReadVerifier;
pub use lifecycle::assemble::{assemble, AssembleOptions};
pub use lifecycle::create::{
    create, create_with_clock, BitmapSpec, ClusterFormat, CreateSpec, Created,
};
pub use lifecycle::leave::{leave_cluster, LeaveReport};
pub use members::read_superblock;
pub use personality::gathered::GatheredWrite;
pub use personality::intent::WriteIntent;
pub use personality::parts::ASSEMBLED_READ_ONLY;
pub use policy::bitmap::{read_bitmap, read_bitmap_slot};
pub use policy::guided::{GuidanceStatus, WriteWatch, DEFAULT_GUIDE_TIMEOUT};
pub use policy::journal::{JournalStatus, Replayed};
pub use policy::takeover::TakeoverReport;
pub use status::{ArrayStatus, BitmapStatus, MemberState, MemberStatus, MemoryStatus, UsedStatus};
pub use work::{SyncAction, VerifyReport};
