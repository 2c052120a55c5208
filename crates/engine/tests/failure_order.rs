//! A member's failure is on disk before any write that skipped the member is acknowledged.
//!
//! Writer A's write fails on member 1; recording that failure in member 0's superblock is made
//! slow. Writer B, starting meanwhile, sees member 1 faulty and writes only member 0. Were B
//! acknowledged before the failure record landed, a power cut at that moment would bring member
//! 1 back as current, holding old data where B's acknowledged write should be.

use device::{Device, SimDevice};
use engine::{assemble, AssembleOptions};
use layout::Level;
use parking_lot::Mutex;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// md's v1.2 superblock sits 4 KiB into every member.
const SB_OFFSET: u64 = 4096;
const SB_DELAY: Duration = Duration::from_millis(300);

/// A member whose data writes can be made to fail and whose superblock writes can be made slow;
/// it notes when superblock writes complete.
struct Member {
    inner: SimDevice,
    fail_data_writes: AtomicBool,
    slow_superblock: AtomicBool,
    sb_written: Mutex<Vec<Instant>>,
}

impl Member {
    fn new(name: &str) -> Arc<Member> {
        Arc::new(Member {
            inner: SimDevice::new(name, 8 << 20, 1),
            fail_data_writes: AtomicBool::new(false),
            slow_superblock: AtomicBool::new(false),
            sb_written: Mutex::new(Vec::new()),
        })
    }
}

impl Device for Member {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn len_bytes(&self) -> u64 {
        self.inner.len_bytes()
    }
    fn read_at(&self, buf: &mut [u8], offset_bytes: u64) -> io::Result<()> {
        self.inner.read_at(buf, offset_bytes)
    }
    fn write_at(&self, buf: &[u8], offset_bytes: u64, fua: bool) -> io::Result<()> {
        if offset_bytes == SB_OFFSET {
            if self.slow_superblock.load(Ordering::Acquire) {
                std::thread::sleep(SB_DELAY);
            }
            let res = self.inner.write_at(buf, offset_bytes, fua);
            self.sb_written.lock().push(Instant::now());
            return res;
        }
        if self.fail_data_writes.load(Ordering::Acquire) {
            return Err(io::Error::other("injected write error"));
        }
        self.inner.write_at(buf, offset_bytes, fua)
    }
    fn flush(&self) -> io::Result<()> {
        self.inner.flush()
    }
    fn discard_zeroes(&self, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
        self.inner.discard_zeroes(offset_bytes, len_bytes)
    }
}

#[test]
fn writes_that_skip_a_failed_member_wait_for_its_failure_record() {
    let m0 = Member::new("m0");
    let m1 = Member::new("m1");
    let devs = || -> Vec<Arc<dyn Device>> { vec![m0.clone(), m1.clone()] };
    simkit::create_clean("order", Level::Raid1, None, 64 << 10, devs(), vec![]);
    let array = Arc::new(assemble(devs(), AssembleOptions::default()).expect("assemble"));
    // The array goes active before the test starts timing.
    array.write(0, &[1u8; 4096], false).expect("first write");
    m1.fail_data_writes.store(true, Ordering::Release);
    m0.slow_superblock.store(true, Ordering::Release);
    m0.sb_written.lock().clear();

    let started = Instant::now();
    let a = {
        let array = array.clone();
        std::thread::spawn(move || array.write(1 << 20, &[2u8; 4096], false))
    };
    // B starts once A's failure is set in memory (microseconds after A's write) while its
    // record is still being written (SB_DELAY). Not polled through `status`, which waits for
    // the metadata lock and so for the record itself.
    std::thread::sleep(SB_DELAY / 6);
    array
        .write(2 << 20, &[3u8; 4096], true)
        .expect("B's write to the surviving member");
    let acked = Instant::now();
    a.join().expect("writer A").expect("A's write");
    assert!(
        acked.duration_since(started) < SB_DELAY * 3,
        "B took too long: did it wait for more than the failure record?"
    );
    let recorded = m0.sb_written.lock().first().copied();
    let recorded = recorded.expect("the failure was recorded in member 0's superblock");
    assert!(
        acked >= recorded,
        "B was acknowledged {:?} before member 1's failure reached a superblock",
        recorded - acked
    );
    let sb = engine::read_superblock(&m0.inner).expect("superblock");
    assert_eq!(sb.role_of(1), format::DevRole::Faulty);
}
