//! Member I/O fan-out: the only place the engine calls into devices for data.
//!
//! A request's member operations run in parallel on a dedicated thread pool (blocking I/O, so not
//! the global rayon pool), or inline when there is one. A failed operation marks its member
//! faulty (via [`Array::fail_role`], which records it in the superblocks) before the caller
//! sees the error, so that the caller can fall back to redundancy at once.

use crate::array::Array;
use std::io;

pub(crate) enum IoKind<'a> {
    Read(&'a mut [u8]),
    Write(&'a [u8], bool),
}

/// One operation on the member filling `role`, at `offset_bytes` into its data area.
pub(crate) struct MemberIo<'a> {
    pub role: usize,
    pub offset_bytes: u64,
    pub kind: IoKind<'a>,
    pub ok: bool,
}

impl<'a> MemberIo<'a> {
    pub fn read(role: usize, offset_bytes: u64, buf: &'a mut [u8]) -> MemberIo<'a> {
        MemberIo {
            role,
            offset_bytes,
            kind: IoKind::Read(buf),
            ok: false,
        }
    }

    pub fn write(role: usize, offset_bytes: u64, buf: &'a [u8], fua: bool) -> MemberIo<'a> {
        MemberIo {
            role,
            offset_bytes,
            kind: IoKind::Write(buf, fua),
            ok: false,
        }
    }

    fn run(&mut self, array: &Array) -> Option<io::Error> {
        let member = array.slot(self.role).usable()?;
        let at = member.data_offset_bytes + self.offset_bytes;
        let res = match &mut self.kind {
            IoKind::Read(buf) => member.dev.read_at(buf, at),
            IoKind::Write(buf, fua) => member.dev.write_at(buf, at, *fua),
        };
        match res {
            Ok(()) => {
                self.ok = true;
                None
            }
            Err(e) => Some(e),
        }
    }

    fn len(&self) -> usize {
        match &self.kind {
            IoKind::Read(b) => b.len(),
            IoKind::Write(b, _) => b.len(),
        }
    }

    fn op_name(&self) -> &'static str {
        match self.kind {
            IoKind::Read(_) => "read",
            IoKind::Write(..) => "write",
        }
    }
}

/// Batches up to this many bytes may run inline on fast members.
const CHEAP_BATCH_BYTES: usize = 128 * 1024;
/// Small member operations faster than this (moving average) count as memory speed.
const CHEAP_OP_NANOS: u64 = 20_000;

impl Array {
    /// Small batch and members fast enough (recent small operations, averaged) that issuing
    /// them one after the other beats waking other threads.
    fn io_is_cheap(&self, ios: &[MemberIo<'_>]) -> bool {
        ios.iter().map(MemberIo::len).sum::<usize>() <= CHEAP_BATCH_BYTES
            && self
                .small_io_nanos
                .load(std::sync::atomic::Ordering::Relaxed)
                < CHEAP_OP_NANOS
    }

    /// Fold the duration of a small operation into the moving average.
    fn note_io_latency(&self, len: usize, took: std::time::Duration) {
        use std::sync::atomic::Ordering::Relaxed;
        if len <= 64 * 1024 {
            let ns = took.as_nanos().min(u128::from(u32::MAX)) as u64;
            let avg = self.small_io_nanos.load(Relaxed);
            self.small_io_nanos.store(avg - avg / 16 + ns / 16, Relaxed);
        }
    }

    /// Run `ios` (in parallel when more than one). Each `ok` tells whether it succeeded; a
    /// member that failed has been marked faulty on return. Returns true if all succeeded.
    pub(crate) fn run_io(&self, ios: &mut [MemberIo<'_>]) -> bool {
        let mut errors: Vec<(usize, &'static str, u64, io::Error)> = Vec::new();
        if ios.is_empty() {
            return true;
        }
        if ios.len() == 1 || self.io_is_cheap(ios) {
            // One operation, or small ones on members that answer at memory speed: a hand-off
            // to another thread would cost more than the I/O itself.
            for op in ios.iter_mut() {
                let started = std::time::Instant::now();
                if let Some(e) = op.run(self) {
                    errors.push((op.role, op.op_name(), op.offset_bytes, e));
                }
                self.note_io_latency(op.len(), started.elapsed());
            }
        } else {
            // The caller's thread does the first operation itself: one hand-off fewer.
            let found = parking_lot::Mutex::new(Vec::new());
            let (first, rest) = ios.split_first_mut().expect("more than one operation");
            self.pool().in_place_scope(|s| {
                for op in rest.iter_mut() {
                    let found = &found;
                    s.spawn(move |_| {
                        if let Some(e) = op.run(self) {
                            found
                                .lock()
                                .push((op.role, op.op_name(), op.offset_bytes, e));
                        }
                    });
                }
                let started = std::time::Instant::now();
                if let Some(e) = first.run(self) {
                    found
                        .lock()
                        .push((first.role, first.op_name(), first.offset_bytes, e));
                }
                self.note_io_latency(first.len(), started.elapsed());
            });
            errors = found.into_inner();
        }
        for (role, op, offset, e) in &errors {
            self.fail_role(*role, &format!("{op} at data byte {offset} failed: {e}"));
        }
        ios.iter().all(|op| op.ok)
    }
}
