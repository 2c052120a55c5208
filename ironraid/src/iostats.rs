//! Per-member I/O counts (zpool iostat's and zpool status's READ/WRITE columns): every member
//! the daemon opens is wrapped in [`Counted`], which counts requests, bytes and errors on
//! their way to the real device. The metrics endpoint reads them by member path.

use device::Device;
use parking_lot::Mutex;
use std::io;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

#[derive(Default)]
pub struct IoCounts {
    pub reads: AtomicU64,
    pub read_bytes: AtomicU64,
    pub read_errors: AtomicU64,
    pub writes: AtomicU64,
    pub write_bytes: AtomicU64,
    pub write_errors: AtomicU64,
    pub flushes: AtomicU64,
    pub flush_errors: AtomicU64,
}

/// The counts of every member opened in this process, by device name (its path).
static ALL: Mutex<Vec<(String, Arc<IoCounts>)>> = Mutex::new(Vec::new());

/// The counts of the member named `name` (None: not opened by this daemon).
pub fn of(name: &str) -> Option<Arc<IoCounts>> {
    ALL.lock()
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, c)| c.clone())
}

pub struct Counted {
    inner: Arc<dyn Device>,
    counts: Arc<IoCounts>,
}

impl Counted {
    /// Wrap `inner`; a member opened again (removed, then added back) keeps its counts.
    pub fn wrap(inner: Arc<dyn Device>) -> Arc<dyn Device> {
        let counts = of(inner.name()).unwrap_or_else(|| {
            let c = Arc::new(IoCounts::default());
            ALL.lock().push((inner.name().to_string(), c.clone()));
            c
        });
        Arc::new(Counted { inner, counts })
    }

    /// Count one request: `ops`, then the bytes it moved or an error.
    fn count(
        ops: &AtomicU64,
        bytes: Option<(&AtomicU64, usize)>,
        errors: &AtomicU64,
        r: io::Result<()>,
    ) -> io::Result<()> {
        ops.fetch_add(1, Ordering::Relaxed);
        match (&r, bytes) {
            (Ok(()), Some((b, n))) => {
                b.fetch_add(n as u64, Ordering::Relaxed);
            }
            (Ok(()), None) => {}
            (Err(_), _) => {
                errors.fetch_add(1, Ordering::Relaxed);
            }
        }
        r
    }
}

impl Device for Counted {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn len_bytes(&self) -> u64 {
        self.inner.len_bytes()
    }

    fn read_at(&self, buf: &mut [u8], offset_bytes: u64) -> io::Result<()> {
        let len = buf.len();
        let c = &self.counts;
        let r = self.inner.read_at(buf, offset_bytes);
        Self::count(&c.reads, Some((&c.read_bytes, len)), &c.read_errors, r)
    }

    fn write_at(&self, buf: &[u8], offset_bytes: u64, fua: bool) -> io::Result<()> {
        let c = &self.counts;
        let r = self.inner.write_at(buf, offset_bytes, fua);
        Self::count(
            &c.writes,
            Some((&c.write_bytes, buf.len())),
            &c.write_errors,
            r,
        )
    }

    fn write_vectored_at(&self, bufs: &[&[u8]], offset_bytes: u64, fua: bool) -> io::Result<()> {
        let len = bufs.iter().map(|b| b.len()).sum();
        let c = &self.counts;
        let r = self.inner.write_vectored_at(bufs, offset_bytes, fua);
        Self::count(&c.writes, Some((&c.write_bytes, len)), &c.write_errors, r)
    }

    /// Counted as a read when it moved the bytes; a failure is not a read error here (the
    /// caller reads the range the ordinary way next, which counts one if the device has it).
    fn splice_to_pipe(
        &self,
        pipe: BorrowedFd<'_>,
        offset_bytes: u64,
        len: usize,
    ) -> io::Result<()> {
        let r = self.inner.splice_to_pipe(pipe, offset_bytes, len);
        if r.is_ok() {
            let c = &self.counts;
            c.reads.fetch_add(1, Ordering::Relaxed);
            c.read_bytes.fetch_add(len as u64, Ordering::Relaxed);
        }
        r
    }

    fn flush(&self) -> io::Result<()> {
        let c = &self.counts;
        let r = self.inner.flush();
        Self::count(&c.flushes, None, &c.flush_errors, r)
    }

    fn discard_zeroes(&self, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
        self.inner.discard_zeroes(offset_bytes, len_bytes)
    }
}
