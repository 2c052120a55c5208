//! The integrity records kept in memory: table blocks (1008 records each) of the tables in use,
//! within a fixed budget (design study §5.6: records are 1/1000 of raw capacity, so a large
//! array cannot hold them all; 64 MiB covers about 64 GiB of raw capacity).
//!
//! A page is a table block's records plus what the write-out needs: the epoch its copies carry
//! on disk and a generation that counts changes. A page changed since its last write-out
//! (`gen != written`) is never evicted: the disk would give back older records. Others leave in
//! clock order (a page read since the hand last passed gets a second chance), so that what the
//! members are read and written at stays resident. Shards keep lookups from contending, and
//! each counts its own hits and misses: counters shared by every lookup were a cache line that
//! two cores passed back and forth on every member I/O.

use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

/// (subject role, table index).
pub(crate) type Key = (usize, u64);

/// Shards of a cache large enough to have them.
const MAX_SHARDS: usize = 64;

/// One table block's records, resident.
pub(crate) struct Page {
    pub recs: Vec<u32>,
    /// The largest epoch of the block's copies on disk (a write-out must use a larger one).
    pub epoch: u64,
    /// Changes so far; `written` is the value the last write-out saw.
    pub gen: u64,
    written: u64,
    referenced: bool,
    /// In the integrity's set of tables for the next write-out since a change; cleared by the
    /// write-out that takes the set, as it reads the page. Spares a writer the set's lock
    /// when the page is already queued (the set is one lock for every member write).
    pub queued: bool,
}

impl Page {
    pub fn loaded(recs: Vec<u32>, epoch: u64) -> Page {
        Page {
            recs,
            epoch,
            gen: 0,
            written: 0,
            referenced: true,
            queued: false,
        }
    }

    /// The page now differs from its copies on disk.
    pub fn changed(&mut self) {
        self.gen += 1;
    }

    fn modified(&self) -> bool {
        self.gen != self.written
    }
}

/// Keys are small integers chosen by the array, not by clients: a multiplicative mix spreads
/// them well enough, at a fraction of the default hasher's cost (a lookup per member I/O).
#[derive(Default)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        // The product's entropy sits in its high bits; the table indexes by the low ones (and
        // a shard's keys share their low bits: see `RecordCache::shard`).
        self.0 ^ (self.0 >> 32)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }

    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
}

#[derive(Default)]
struct Shard {
    pages: HashMap<Key, Page, BuildHasherDefault<KeyHasher>>,
    /// Clock order of the resident keys.
    hand: VecDeque<Key>,
    hits: u64,
    misses: u64,
    /// Pages evicted so far.
    evictions: u64,
}

/// Cache statistics, for status.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    pub capacity_pages: u64,
    pub resident_pages: u64,
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
}

pub(crate) struct RecordCache {
    shards: Vec<Mutex<Shard>>,
    per_shard: usize,
}

impl RecordCache {
    /// A cache of at most `pages` pages (more only while changed pages wait for a write-out).
    pub fn new(pages: usize) -> RecordCache {
        let shards = pages.clamp(1, MAX_SHARDS);
        RecordCache {
            shards: (0..shards).map(|_| Mutex::default()).collect(),
            per_shard: pages.div_ceil(shards).max(1),
        }
    }

    pub fn capacity(&self) -> usize {
        self.per_shard * self.shards.len()
    }

    fn shard(&self, key: Key) -> &Mutex<Shard> {
        let h = (key.1 as usize).wrapping_mul(0x9e37_79b9) ^ key.0.wrapping_mul(0x85eb_ca6b);
        &self.shards[h % self.shards.len()]
    }

    /// Run `f` on the resident page `key`; None if it is not resident.
    pub fn get<R>(&self, key: Key, f: impl FnOnce(&mut Page) -> R) -> Option<R> {
        let mut sh = self.shard(key).lock();
        let sh = &mut *sh;
        let page = sh.pages.get_mut(&key)?;
        page.referenced = true;
        sh.hits += 1;
        Some(f(page))
    }

    /// Start loading record `at` of page `key` into the CPU's cache, if the page is resident
    /// (a page that is not is loaded when it is needed; that read dwarfs a cache miss).
    pub fn prefetch(&self, key: Key, at: usize) {
        if let Some(page) = self.shard(key).lock().pages.get(&key) {
            prefetch(&page.recs[at]);
        }
    }

    /// Run `f` on page `key`, made resident from `load` on a miss (the loader runs unlocked:
    /// it reads the members).
    pub fn with<R>(&self, key: Key, load: impl Fn() -> Page, f: impl FnOnce(&mut Page) -> R) -> R {
        loop {
            let evictions = {
                let mut sh = self.shard(key).lock();
                let sh = &mut *sh;
                if let Some(page) = sh.pages.get_mut(&key) {
                    page.referenced = true;
                    sh.hits += 1;
                    return f(page);
                }
                sh.evictions
            };
            let page = load();
            let mut sh = self.shard(key).lock();
            // A page evicted from this shard meanwhile may be this one, written out after the
            // load read the disk: the load may be older than the disk now; read again.
            if sh.pages.contains_key(&key) || sh.evictions == evictions {
                return self.insert_locked(&mut sh, key, page, f);
            }
        }
    }

    /// Make `page` resident as `key` unless another thread did first (theirs stays: it may
    /// have changed since), then run `f` on the resident page.
    pub fn insert<R>(&self, key: Key, page: Page, f: impl FnOnce(&mut Page) -> R) -> R {
        let mut sh = self.shard(key).lock();
        self.insert_locked(&mut sh, key, page, f)
    }

    fn insert_locked<R>(
        &self,
        sh: &mut Shard,
        key: Key,
        page: Page,
        f: impl FnOnce(&mut Page) -> R,
    ) -> R {
        sh.misses += 1;
        if !sh.pages.contains_key(&key) {
            self.make_room(sh);
            sh.pages.insert(key, page);
            sh.hand.push_back(key);
        }
        f(sh.pages.get_mut(&key).expect("just made resident"))
    }

    /// Evict until the shard has room; changed pages stay (the shard then runs over).
    fn make_room(&self, sh: &mut Shard) {
        let mut turns = 2 * sh.hand.len();
        while sh.pages.len() >= self.per_shard && turns > 0 {
            turns -= 1;
            let Some(key) = sh.hand.pop_front() else {
                break;
            };
            let page = sh
                .pages
                .get_mut(&key)
                .expect("the hand holds resident keys");
            if page.referenced || page.modified() {
                page.referenced = false;
                sh.hand.push_back(key);
                continue;
            }
            sh.pages.remove(&key);
            sh.evictions += 1;
        }
    }

    /// A write-out of `key` taken at generation `gen` with `epoch` ended: unless the page
    /// changed since, it matches the disk again.
    pub fn written(&self, key: Key, gen: u64, epoch: u64) {
        let mut sh = self.shard(key).lock();
        if let Some(page) = sh.pages.get_mut(&key) {
            page.epoch = page.epoch.max(epoch);
            if page.gen == gen {
                page.written = gen;
            }
        }
    }

    pub fn stats(&self) -> CacheStats {
        let mut stats = CacheStats {
            capacity_pages: self.capacity() as u64,
            ..CacheStats::default()
        };
        for sh in &self.shards {
            let sh = sh.lock();
            stats.resident_pages += sh.pages.len() as u64;
            stats.hits += sh.hits;
            stats.misses += sh.misses;
            stats.evictions += sh.evictions;
        }
        stats
    }
}

/// A hint that `x` is about to be used: its cache line starts loading now.
#[inline]
fn prefetch<T>(x: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is only a hint: it never faults and changes nothing the program can
    // see, and SSE, the feature it needs, is part of x86_64's baseline.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>(std::ptr::from_ref(x).cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = x;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changed_pages_stay_and_clean_ones_leave() {
        let c = RecordCache::new(1);
        let keys: Vec<Key> = (0..3).map(|i| (0, i)).collect();
        c.insert(keys[0], Page::loaded(vec![1], 1), |p| p.changed());
        c.insert(keys[1], Page::loaded(vec![2], 1), |_| ());
        // The changed page survived the second insert: the shard ran over.
        assert!(c.get(keys[0], |p| p.recs[0]).is_some());
        assert!(c.get(keys[1], |p| p.recs[0]).is_some());
        // Once written, it may go; the unreferenced clean page goes first.
        let gen = c.get(keys[0], |p| p.gen).unwrap();
        c.written(keys[0], gen, 2);
        c.insert(keys[2], Page::loaded(vec![3], 1), |_| ());
        let resident = keys.iter().filter(|k| c.get(**k, |_| ()).is_some()).count();
        assert!(resident <= 2, "{resident} pages resident in a cache of one");
        assert!(c.stats().evictions >= 1);
        // A page changed after the write-out began stays changed.
        let c = RecordCache::new(1);
        c.insert((1, 1), Page::loaded(vec![0], 1), |p| p.changed());
        let gen = c.get((1, 1), |p| p.gen).unwrap();
        c.get((1, 1), |p| p.changed());
        c.written((1, 1), gen, 5);
        assert!(c.get((1, 1), |p| p.modified()).unwrap());
        assert_eq!(c.get((1, 1), |p| p.epoch).unwrap(), 5);
    }
}
