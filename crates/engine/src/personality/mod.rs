//! The md personalities' data paths: how a level reads, writes and reads degraded.
//!
//! `raid456`: RAID4/5/6, stripe by stripe through the stripe cache (`stripe_cache`), with the
//! write plans (full stripe, read-modify-write, reconstruct-write) and degraded reads that
//! rebuild from parity; `intent` and `gathered` are md's plugging on that path. `copies`: the
//! levels whose sectors have one or more plain copies (linear, RAID0, RAID1, RAID10).
//! `raid456_heal` and `copies_heal`: data that failed its integrity records, rebuilt from what
//! redundancy vouches for, rewritten and read back (the records themselves are `integrity/`).

pub(crate) mod copies;
pub(crate) mod copies_heal;
pub(crate) mod gathered;
pub(crate) mod intent;
pub(crate) mod raid456;
pub(crate) mod raid456_heal;
pub(crate) mod stripe_cache;
