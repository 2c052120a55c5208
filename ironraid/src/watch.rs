//! The ext4 write watch of a guided array run with `--guide ext4`: the online conformance
//! check (study §3.6, `format::jbd2_watch`) judging every client write against the jbd2 log
//! the file system on the array keeps. Writes the ext4 guide would not find after a crash make
//! the members say so before they go out (the engine's `WriteWatch` seam), so a crash then
//! falls back to the bitmap resync; the counts say how often that happens.
//!
//! The watch arms itself from what is on the array (first at start, then every 2 s while it
//! is not armed: a new file system, one that was rewritten or a log it lost track of), at a
//! moment with no client write in flight: a flush, then the scan under the watch's lock.

use engine::{Array, WriteWatch};
use format::jbd2_watch::{Jbd2Watch, Nonconforming};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

/// What the watch saw, for `detail --json`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct WatchDetail {
    pub armed: bool,
    /// Why it is not armed (null when armed).
    pub disarmed_reason: Option<String>,
    pub conforming_writes: u64,
    pub conforming_bytes: u64,
    /// Writes no guide would find, per reason (`unarmed`, `discard`, `log`, `home`,
    /// `outside_fs`): `[writes, bytes]`.
    pub nonconforming: BTreeMap<String, [u64; 2]>,
    /// Conforming writes a later commit or tail move left uncovered, not yet durable.
    pub orphans: usize,
    /// Times the watch armed itself.
    pub arms: u64,
}

#[derive(Default)]
struct Inner {
    watch: Jbd2Watch,
    began: u64,
    inflight: u64,
    detail: WatchDetail,
}

pub struct Ext4Watch {
    inner: Mutex<Inner>,
}

/// The watch of this daemon's array, if it has one.
static WATCH: OnceLock<Arc<Ext4Watch>> = OnceLock::new();

impl WriteWatch for Ext4Watch {
    fn begin(&self, offset: u64, len: u64, data: Option<&[u8]>) -> (bool, u64) {
        let mut i = self.inner.lock();
        i.began += 1;
        i.inflight += 1;
        let (verdict, id) = i.watch.begin(offset, len, data);
        match verdict {
            Ok(()) => {
                i.detail.conforming_writes += 1;
                i.detail.conforming_bytes += len;
            }
            Err(why) => {
                if let Some(reason) = i.watch.disarmed_reason().map(str::to_string) {
                    if why == Nonconforming::Unarmed && i.detail.armed {
                        tracing::warn!("ext4 write watch lost track: {reason}");
                    }
                }
                let e = i.detail.nonconforming.entry(why.name().into()).or_default();
                e[0] += 1;
                e[1] += len;
            }
        }
        i.detail.armed = i.watch.is_armed();
        (verdict.is_ok(), id)
    }

    fn end(&self, id: u64, ok: bool, durable: bool) {
        let mut i = self.inner.lock();
        i.inflight -= 1;
        i.watch.end(id, ok, durable);
    }

    fn flush_begin(&self) -> u64 {
        self.inner.lock().watch.flush_begin()
    }

    fn flush_end(&self, token: u64) {
        self.inner.lock().watch.flush_end(token);
    }

    fn orphans(&self) -> usize {
        self.inner.lock().watch.orphans()
    }
}

impl Ext4Watch {
    /// Try to arm from the array as it is now: only with no client write in flight, and
    /// only if none began between the flush and the scan.
    fn try_arm(&self, array: &Array) -> Result<(), String> {
        let began = {
            let i = self.inner.lock();
            if i.watch.is_armed() {
                return Ok(());
            }
            if i.inflight > 0 {
                return Err("client writes in flight".into());
            }
            i.began
        };
        // What the scan reads is durable before the watch relies on it.
        array.flush().map_err(|e| e.to_string())?;
        let mut i = self.inner.lock();
        if i.began != began || i.inflight > 0 {
            return Err("client writes began meanwhile".into());
        }
        let mut read = |off: u64, buf: &mut [u8]| array.read(off, buf).map_err(|e| e.to_string());
        let res = i.watch.arm(&mut read, array.size_bytes());
        i.detail.armed = i.watch.is_armed();
        match res {
            Ok(()) => {
                i.detail.arms += 1;
                Ok(())
            }
            Err(e) => Err(e.to_string()),
        }
    }

    fn detail(&self) -> WatchDetail {
        let i = self.inner.lock();
        WatchDetail {
            armed: i.watch.is_armed(),
            disarmed_reason: i.watch.disarmed_reason().map(str::to_string),
            orphans: i.watch.orphans(),
            ..i.detail.clone()
        }
    }
}

/// Install the ext4 watch on a guided array, arm it now if it can, and keep re-arming it in
/// the background while the array lives.
pub fn install(array: &Arc<Array>) -> anyhow::Result<()> {
    let watch = Arc::new(Ext4Watch {
        inner: Mutex::new(Inner::default()),
    });
    array
        .set_write_watch(Some(watch.clone()))
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    if let Err(e) = watch.try_arm(array) {
        tracing::info!(array = %array.name(), "ext4 write watch not armed yet: {e}");
    } else {
        tracing::info!(array = %array.name(), "ext4 write watch armed");
    }
    let _ = WATCH.set(watch.clone());
    let weak: Weak<Array> = Arc::downgrade(array);
    std::thread::Builder::new()
        .name("ext4-watch".into())
        .spawn(move || loop {
            std::thread::sleep(Duration::from_secs(2));
            let Some(array) = weak.upgrade() else {
                return;
            };
            let was = watch.inner.lock().watch.is_armed();
            if !was && watch.try_arm(&array).is_ok() {
                tracing::info!(array = %array.name(), "ext4 write watch armed");
            }
        })?;
    Ok(())
}

/// The watch's counters (None: no watch in this daemon).
pub fn detail() -> Option<WatchDetail> {
    WATCH.get().map(|w| w.detail())
}
