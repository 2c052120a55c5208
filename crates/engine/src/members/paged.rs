//! A small on-disk structure replicated on every member (the write-intent bitmap, the
//! used-region map): an in-memory image in 4 KiB pages, written out page by page with FUA.
//!
//! Changes go into the image under its lock and bump a generation; [`PagedCopy::write_through`]
//! returns once a write-out that started after the caller's change has completed. Write-outs
//! are serialised by the writer lock, and whoever holds it writes every dirty page, so changes
//! that arrive together share one write (group commit). A member without a whole, current
//! copy gets every page, not only the dirty ones: one that joined since the last write-out,
//! and one a write-out left out (a spare, which bit commits for the members in a role do not
//! reach). Every superblock commit writes the headers to every member first (the event
//! recorders), so a spare's copy is whole again before a commit records it in a role or in
//! sync: assembly reads the copies of members in sync only, and after a crash such a member
//! may be the only one left.
//!
//! Lock order: the writer lock, then the image lock. Nothing holding either takes the array's
//! metadata lock; failed member writes are returned for the caller to act on afterwards.

use crate::members::metadata::{self, Metadata};
use crate::members::{Member, MemberSet};
use device::AlignedBuf;
use parking_lot::{Mutex, MutexGuard};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

pub(crate) const PAGE_BYTES: usize = 4096;

/// Members whose write of a replicated structure failed.
pub(crate) type WriteFailures = Vec<(Arc<Member>, io::Error)>;

/// The image: bytes as they should be on disk, which pages differ from it, a generation.
pub(crate) struct Pages {
    bytes: Vec<u8>,
    dirty: Vec<bool>,
    gen: u64,
}

impl Pages {
    /// Overwrite `data` at byte `at` of the structure.
    pub fn put(&mut self, at: usize, data: &[u8]) {
        self.bytes[at..at + data.len()].copy_from_slice(data);
        for p in at / PAGE_BYTES..(at + data.len()).div_ceil(PAGE_BYTES) {
            self.dirty[p] = true;
        }
    }

    /// Set or clear bit `j` of the bit array starting at byte `base`.
    pub fn set_bit(&mut self, base: usize, j: u64, on: bool) {
        let byte = base + (j / 8) as usize;
        let mask = 1u8 << (j % 8);
        if on {
            self.bytes[byte] |= mask;
        } else {
            self.bytes[byte] &= !mask;
        }
        self.dirty[byte / PAGE_BYTES] = true;
    }

    /// Count a change that must reach the disk; returns the generation that covers it.
    pub fn bump(&mut self) -> u64 {
        self.gen += 1;
        self.gen
    }

    fn take(&mut self, all: bool) -> Vec<(usize, AlignedBuf)> {
        let mut out = Vec::new();
        for (p, d) in self.dirty.iter_mut().enumerate() {
            if *d || all {
                let at = p * PAGE_BYTES;
                out.push((p, AlignedBuf::copy_from(&self.bytes[at..at + PAGE_BYTES])));
                *d = false;
            }
        }
        out
    }
}

pub(crate) struct PagedCopy {
    /// Byte offset of the structure on every member.
    base: u64,
    image: Mutex<Pages>,
    writer: Mutex<Writer>,
    durable_gen: AtomicU64,
}

/// Held while writing out: which members have a complete copy. Members, not device numbers
/// (a spare may take over the number of a member removed before it), and weakly: a removed
/// member's device must close.
pub(crate) struct Writer {
    complete_on: Vec<Weak<Member>>,
}

impl Writer {
    /// Whether `m` holds a whole, current copy.
    fn holds(&self, m: &Arc<Member>) -> bool {
        self.complete_on
            .iter()
            .any(|c| std::ptr::eq(c.as_ptr(), Arc::as_ptr(m)))
    }

    fn forget(&mut self, m: &Arc<Member>) {
        self.complete_on
            .retain(|c| !std::ptr::eq(c.as_ptr(), Arc::as_ptr(m)));
    }
}

impl PagedCopy {
    /// An image of `bytes` (a whole number of pages) kept at `base` on every member. Nothing
    /// is assumed to be on disk yet: the first write-out writes every page.
    pub fn new(base: u64, bytes: Vec<u8>) -> PagedCopy {
        assert!(bytes.len().is_multiple_of(PAGE_BYTES), "whole pages");
        let pages = bytes.len() / PAGE_BYTES;
        PagedCopy {
            base,
            image: Mutex::new(Pages {
                bytes,
                dirty: vec![false; pages],
                gen: 0,
            }),
            writer: Mutex::new(Writer {
                complete_on: Vec::new(),
            }),
            durable_gen: AtomicU64::new(0),
        }
    }

    /// Change the image.
    pub fn edit<R>(&self, f: impl FnOnce(&mut Pages) -> R) -> R {
        f(&mut self.image.lock())
    }

    /// Hold the writer lock (to write out several times without others in between).
    pub fn writer(&self) -> MutexGuard<'_, Writer> {
        self.writer.lock()
    }

    /// Set (or clear) `bits` of the bit array at byte `base` and make that durable on every
    /// member in a role; members the write fails on are failed. False if the
    /// array has failed.
    pub fn commit_bits(
        &self,
        members: &MemberSet,
        base: usize,
        bits: impl IntoIterator<Item = u64>,
        on: bool,
    ) -> bool {
        let gen = self.edit(|pages| {
            for b in bits {
                pages.set_bit(base, b, on);
            }
            pages.bump()
        });
        let failed = self.write_through(&members.role_members(), gen);
        members.fail_metadata_writers(failed);
        !members.is_failed()
    }

    /// Make every change up to `gen` durable on `targets`, unless a write-out did already.
    pub fn write_through(&self, targets: &[Arc<Member>], gen: u64) -> WriteFailures {
        let mut w = self.writer.lock();
        if self.durable_gen.load(Ordering::Acquire) >= gen {
            return Vec::new();
        }
        self.write_out(targets, &mut w)
    }

    /// Write the dirty pages (all pages to members without a complete copy) to `targets`, FUA.
    pub fn write_out(&self, targets: &[Arc<Member>], w: &mut Writer) -> WriteFailures {
        w.complete_on.retain(|c| c.strong_count() > 0);
        let fresh: Vec<bool> = targets.iter().map(|m| !w.holds(m)).collect();
        let (pages, gen) = {
            let mut im = self.image.lock();
            (im.take(fresh.contains(&true)), im.gen)
        };
        if !pages.is_empty() {
            // A member outside `targets` (a spare, to the bit commits that reach members in a
            // role only) misses these pages: its copy is no longer whole.
            w.complete_on.retain(|c| {
                targets
                    .iter()
                    .any(|m| std::ptr::eq(c.as_ptr(), Arc::as_ptr(m)))
            });
        }
        let mut failed = Vec::new();
        for (m, is_fresh) in targets.iter().zip(fresh) {
            let res = pages.iter().try_for_each(|(p, buf)| {
                let at = self.base + (p * PAGE_BYTES) as u64;
                metadata::write(m, Metadata::Replicated { at }, buf, true)
            });
            match res {
                Ok(()) if is_fresh => w.complete_on.push(Arc::downgrade(m)),
                Ok(()) => {}
                Err(e) => {
                    w.forget(m);
                    failed.push((m.clone(), e));
                }
            }
        }
        self.durable_gen.fetch_max(gen, Ordering::AcqRel);
        failed
    }
}
