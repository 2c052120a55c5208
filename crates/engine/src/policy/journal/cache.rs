//! The journal's write-back cache behind [`WriteBackCache`]: pages logged without parity and
//! kept until their row goes home.

use super::{data_units, write_out_need, CachedRow, Journal, Space, TicketGuard, PAGE};
use crate::error::Result;
use crate::policy::host::PolicyHost;
use crate::policy::write_back::WriteBackCache;
use device::AlignedBuf;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

impl WriteBackCache for Journal {
    fn caching_paused(&self) -> bool {
        self.paused.load(Ordering::Acquire) && {
            let drained = self.cache_bytes() == 0;
            if drained {
                self.paused.store(false, Ordering::Release);
            }
            !drained
        }
    }

    fn pause_caching(&self) {
        self.paused.store(true, Ordering::Release);
    }

    fn cache_bytes(&self) -> usize {
        self.cache.lock().bytes
    }

    fn cached_page(&self, row: u64, d: usize, off: u64) -> Option<AlignedBuf> {
        let c = self.cache.lock();
        c.rows
            .get(&row)
            .and_then(|r| r.pages.get(&(off, d)))
            .map(|p| AlignedBuf::copy_from(p))
    }

    fn cache_pages(
        &self,
        host: &dyn PolicyHost,
        row: u64,
        pages: Vec<(usize, u64, AlignedBuf)>,
    ) -> Result<bool> {
        let g = host.geometry();
        let grow = {
            let c = self.cache.lock();
            let known = |off: u64| {
                c.rows
                    .get(&row)
                    .is_some_and(|r| r.pages.range((off, 0)..(off, usize::MAX)).next().is_some())
            };
            let mut offs: Vec<u64> = pages.iter().map(|p| p.1).filter(|&o| !known(o)).collect();
            offs.sort_unstable();
            offs.dedup();
            write_out_need(offs.len() as u64, g)
        };
        let keyed: BTreeMap<(u64, usize), AlignedBuf> =
            pages.into_iter().map(|(d, off, p)| ((off, d), p)).collect();
        let units = data_units(g, self.seed, row, &keyed);
        let Some(seqs) = self.write_units(host, units, Space::Cache { grow })? else {
            return Ok(false);
        };
        // A ticket while the pages go into the cache: a failed log's settling waits for it
        // before it writes the cache out, so it cannot miss these pages.
        self.take_ticket(host)?;
        let _ticket = TicketGuard(self);
        let mut c = self.cache.lock();
        let c = &mut *c;
        let before = c.rows.get(&row).map(CachedRow::oldest_seq);
        let entry = c.rows.entry(row).or_insert_with(|| {
            self.cached_rows.fetch_add(1, Ordering::AcqRel);
            CachedRow {
                pages: BTreeMap::new(),
                seqs: Vec::new(),
                need: 0,
                since: host.clock().now(),
                recovered: false,
            }
        });
        entry.need += grow;
        entry.seqs.extend(seqs);
        let after = entry.oldest_seq();
        if before != Some(after) {
            if let Some(b) = before {
                c.by_age.remove(&(b, row));
            }
            c.by_age.insert((after, row));
        }
        for (key, page) in keyed {
            c.bytes += PAGE;
            if entry.pages.insert(key, page).is_some() {
                c.bytes -= PAGE;
            }
        }
        Ok(true)
    }

    fn row_full(&self, row: u64, data_disks: usize, chunk_bytes: u64) -> bool {
        let c = self.cache.lock();
        c.rows
            .get(&row)
            .is_some_and(|r| r.pages.len() as u64 == data_disks as u64 * chunk_bytes / PAGE as u64)
    }

    fn take_row(&self, row: u64) -> Option<CachedRow> {
        let mut c = self.cache.lock();
        let r = c.rows.remove(&row)?;
        c.by_age.remove(&(r.oldest_seq(), row));
        c.bytes -= r.pages.len() * PAGE;
        c.writing.insert(row);
        Some(r)
    }

    fn restore_row(&self, row: u64, r: CachedRow) {
        let mut c = self.cache.lock();
        c.bytes += r.pages.len() * PAGE;
        c.writing.remove(&row);
        c.by_age.insert((r.oldest_seq(), row));
        c.rows.insert(row, r);
    }

    fn written_out(&self, row: u64, r: &CachedRow) {
        {
            let mut c = self.cache.lock();
            if c.writing.remove(&row) {
                self.cached_rows.fetch_sub(1, Ordering::AcqRel);
            }
        }
        let mut st = self.st.lock();
        for &seq in &r.seqs {
            st.unit(seq).home = true;
        }
        self.cv.notify_all();
    }

    fn cached_rows_by_age(&self, now: Duration, limit: usize) -> Vec<(u64, Duration)> {
        let c = self.cache.lock();
        debug_assert_eq!(
            c.by_age.len(),
            c.rows.len(),
            "every cached row is in the age order"
        );
        c.by_age
            .iter()
            .take(limit)
            .map(|&(_, row)| (row, now.saturating_sub(c.rows[&row].since)))
            .collect()
    }

    fn pending_rows(&self) -> Vec<u64> {
        let c = self.cache.lock();
        let mut rows: Vec<u64> = c.rows.keys().chain(c.writing.iter()).copied().collect();
        rows.sort_unstable();
        rows.dedup();
        rows
    }
}
