//! Errors of the engine. Every variant names what failed and where.

use std::io;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// A member device failed an operation (the member has been marked faulty when this is
    /// returned to a client: redundancy could not cover it).
    #[error("{member}: {op} at byte {offset_bytes}: {source}")]
    MemberIo {
        member: String,
        op: &'static str,
        offset_bytes: u64,
        source: io::Error,
    },
    /// Too many members are missing or faulty to serve this range.
    #[error("array {array} cannot serve bytes {offset_bytes}..+{len_bytes}: {reason}")]
    Unrecoverable {
        array: String,
        offset_bytes: u64,
        len_bytes: u64,
        reason: String,
    },
    /// A member's backing store is full (ENOSPC/EDQUOT): the write did not complete; the member
    /// stays in the array and the range is resynced once space is back.
    #[error("array {array}: no space on a member's backing store for bytes {offset_bytes}..+{len_bytes}")]
    NoSpace {
        array: String,
        offset_bytes: u64,
        len_bytes: u64,
    },
    /// The array refuses writes.
    #[error("array {array} is read-only: {reason}")]
    ReadOnly { array: String, reason: String },
    /// A request outside the array or otherwise malformed.
    #[error("invalid request: {0}")]
    InvalidArgument(String),
    /// A member's superblock or the set of members cannot form an array.
    #[error("{member}: {reason}")]
    Assemble { member: String, reason: String },
    /// Creating an array failed before or while writing superblocks.
    #[error("{member}: {reason}")]
    Create { member: String, reason: String },
    /// Refused because it would break the array (md's EBUSY); a force flag insists.
    #[error("{0}")]
    Busy(String),
    /// Something valid that this version does not implement.
    #[error("unsupported: {0}")]
    Unsupported(String),
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;

impl From<EngineError> for io::Error {
    fn from(e: EngineError) -> io::Error {
        let kind = match &e {
            EngineError::InvalidArgument(_) => io::ErrorKind::InvalidInput,
            EngineError::ReadOnly { .. } => io::ErrorKind::PermissionDenied,
            EngineError::Unsupported(_) => io::ErrorKind::Unsupported,
            EngineError::NoSpace { .. } => io::ErrorKind::StorageFull,
            EngineError::Busy(_) => io::ErrorKind::ResourceBusy,
            _ => io::ErrorKind::Other,
        };
        io::Error::new(kind, e.to_string())
    }
}
