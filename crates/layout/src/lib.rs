//! Geometry and address mapping for every Linux md personality, keeping md's
//! on-disk format (see `md-format.md` §2–§4).
//!
//! * [`Level`], layout names ([`parse_layout`], [`layout_name`],
//!   [`default_layout`]) and create-time sizing ([`component_sectors_for`]).
//! * [`Geometry`]: validated shape; parity levels map through
//!   [`Geometry::locate`] / [`Geometry::stripe_roles`], the others through
//!   [`Geometry::map_copies`] / [`Geometry::reverse_copy`].
//!
//! Pure arithmetic: no I/O, and the per-request mapping functions never
//! allocate (role tables and copy sets are fixed-size `Copy` values).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod copies;
mod error;
mod geometry;
mod level;
mod linear;
mod names;
mod raid0;
mod raid10;
mod raid5;
mod raid6;
mod stripe;

pub use copies::{Copies, Loc};
pub use error::LayoutError;
pub use geometry::{Geometry, GeometrySpec};
pub use level::Level;
pub use names::{component_sectors_for, default_layout, layout_name, parse_layout};
pub use raid0::{RAID0_ALTERNATE, RAID0_ORIGINAL};
pub use stripe::{ChunkRole, StripePos, StripeRoles};

/// Bytes per md sector (independent of the device's logical block size).
pub const SECTOR_BYTES: u64 = 512;
/// Largest number of raid disks ironraid supports, md's: the role slots a v1.2 superblock
/// holds ((4096 - 256) / 2); `Geometry::new` refuses more.
pub const MAX_RAID_DISKS: usize = 1920;
/// Largest RAID6: Q weighs data disk `i` by g^i in GF(2^8), whose powers repeat after 255, so
/// two data disks beyond 255 would share a weight and their double failure could not be solved
/// (Anvin, "The mathematics of RAID-6": 255 data disks, 257 devices).
pub const MAX_RAID6_DISKS: usize = 257;
