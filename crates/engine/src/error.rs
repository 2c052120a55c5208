//! Errors of the engine. Every variant names what failed and where, and belongs to one
//! [`ErrorKind`]: what a caller decides on (the errno a client gets, whether to retry, whether
//! data was found damaged) without reading messages.

use std::io;

/// What kind of failure an [`EngineError`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// Member I/O failed, or too few members are left to serve the range (EIO).
    Io,
    /// Data read back failed verification (integrity records, a read verifier) beyond what
    /// redundancy can rebuild: damage, never served (EIO).
    Corruption,
    /// On-disk metadata (superblocks, bitmap, used-region map, journal) cannot be read,
    /// written or made to form an array (EIO).
    Metadata,
    /// A malformed request or option (EINVAL).
    InvalidArgument,
    /// Valid, but not implemented here (ENOTSUP).
    Unsupported,
    /// The array refuses writes (EPERM).
    ReadOnly,
    /// A member's backing store is full (ENOSPC).
    NoSpace,
    /// Refused because it would break the array; a force flag insists (EIO over NBD).
    Busy,
}

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
    /// What `member` holds at its byte `offset_bytes` failed verification, and redundancy
    /// could not rebuild it: the range is not served.
    #[error("array {array} cannot serve bytes {offset_bytes}..+{len_bytes} of {member}: {reason}")]
    Corruption {
        array: String,
        member: String,
        offset_bytes: u64,
        len_bytes: u64,
        reason: String,
    },
    /// A metadata write a request depends on (write-intent bitmap, used-region map) failed:
    /// the request is not done.
    #[error("array {array} cannot serve bytes {offset_bytes}..+{len_bytes}: {reason}")]
    Metadata {
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
    /// This node may not do I/O now (a cluster node whose lease is unconfirmed): the array is
    /// not read-only, the request may succeed later or on another node.
    #[error("array {array} is unavailable on this node: {reason}")]
    Unavailable { array: String, reason: String },
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

impl EngineError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            EngineError::MemberIo { .. }
            | EngineError::Unrecoverable { .. }
            | EngineError::Unavailable { .. } => ErrorKind::Io,
            EngineError::Corruption { .. } => ErrorKind::Corruption,
            EngineError::Metadata { .. }
            | EngineError::Assemble { .. }
            | EngineError::Create { .. } => ErrorKind::Metadata,
            EngineError::InvalidArgument(_) => ErrorKind::InvalidArgument,
            EngineError::Unsupported(_) => ErrorKind::Unsupported,
            EngineError::ReadOnly { .. } => ErrorKind::ReadOnly,
            EngineError::NoSpace { .. } => ErrorKind::NoSpace,
            EngineError::Busy(_) => ErrorKind::Busy,
        }
    }
}

/// Frontends turn errors into errno values by `io::ErrorKind` (see `nbd::errno_for`): damage,
/// failed members and failed metadata all reach a client as EIO.
impl From<EngineError> for io::Error {
    fn from(e: EngineError) -> io::Error {
        let kind = match e.kind() {
            ErrorKind::InvalidArgument => io::ErrorKind::InvalidInput,
            ErrorKind::ReadOnly => io::ErrorKind::PermissionDenied,
            ErrorKind::Unsupported => io::ErrorKind::Unsupported,
            ErrorKind::NoSpace => io::ErrorKind::StorageFull,
            ErrorKind::Busy => io::ErrorKind::ResourceBusy,
            ErrorKind::Io | ErrorKind::Corruption | ErrorKind::Metadata => io::ErrorKind::Other,
        };
        io::Error::new(kind, e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The errno each client sees stays what it was before errors had kinds: only invalid
    /// requests, read-only arrays, unsupported requests and full members are told apart.
    #[test]
    fn kinds_reach_clients_as_before() {
        let a = || String::from("a");
        let r = || String::from("r");
        let cases = [
            (
                EngineError::Corruption {
                    array: a(),
                    member: "m1".into(),
                    offset_bytes: 0,
                    len_bytes: 4096,
                    reason: r(),
                },
                io::ErrorKind::Other,
            ),
            (
                EngineError::Metadata {
                    array: a(),
                    offset_bytes: 0,
                    len_bytes: 4096,
                    reason: r(),
                },
                io::ErrorKind::Other,
            ),
            (
                EngineError::Unrecoverable {
                    array: a(),
                    offset_bytes: 0,
                    len_bytes: 4096,
                    reason: r(),
                },
                io::ErrorKind::Other,
            ),
            (
                EngineError::Assemble {
                    member: a(),
                    reason: r(),
                },
                io::ErrorKind::Other,
            ),
            (
                EngineError::NoSpace {
                    array: a(),
                    offset_bytes: 0,
                    len_bytes: 4096,
                },
                io::ErrorKind::StorageFull,
            ),
            (
                EngineError::InvalidArgument(r()),
                io::ErrorKind::InvalidInput,
            ),
            (
                EngineError::ReadOnly {
                    array: a(),
                    reason: r(),
                },
                io::ErrorKind::PermissionDenied,
            ),
            // A fenced cluster node: EIO, not the read-only array's EPERM.
            (
                EngineError::Unavailable {
                    array: a(),
                    reason: r(),
                },
                io::ErrorKind::Other,
            ),
            (EngineError::Unsupported(r()), io::ErrorKind::Unsupported),
            (EngineError::Busy(r()), io::ErrorKind::ResourceBusy),
        ];
        for (e, want) in cases {
            let what = format!("{e:?}");
            assert_eq!(io::Error::from(e).kind(), want, "{what}");
        }
    }
}
