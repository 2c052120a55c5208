//! Another node's recovery window held on this node (`Array::hold_recovery_window`): RAID10
//! rebuilds in member bytes, so a node holding one of its windows must keep its client writes
//! out of the array bytes that window's chunks hold, and only those (not the chunks between
//! them, which other members hold).

use engine::Array;
use layout::Level;
use std::sync::Arc;
use std::time::Duration;

const MIB: u64 = 1 << 20;
const CHUNK: u64 = 64 << 10;

/// Whether a 4 KiB write at array byte `at` waits while `hold` (taken on the same array) lives;
/// the write always ends once the hold is dropped.
fn write_waits(array: &Arc<Array>, at: u64, hold: fn(&Array) -> engine::SyncWindow<'_>) -> bool {
    let guard = hold(array);
    let a = array.clone();
    let writer = std::thread::spawn(move || a.write(at, &[7; 4096], false).unwrap());
    std::thread::sleep(Duration::from_millis(300));
    let waited = !writer.is_finished();
    drop(guard);
    writer.join().unwrap();
    waited
}

/// Role 2's member bytes 8..10 MiB, held as another node's recovery window.
fn window(a: &Array) -> engine::SyncWindow<'_> {
    a.hold_recovery_window(2, 8 * MIB, 2 * MIB)
}

/// The same numbers taken for sync coordinates (array bytes, for RAID10).
fn as_sync_range(a: &Array) -> engine::SyncWindow<'_> {
    a.hold_sync_window(8 * MIB, 2 * MIB)
}

#[test]
fn a_raid10_recovery_window_holds_the_array_bytes_its_member_chunks_hold() {
    // Near copies over four members: member bytes 8..10 MiB of role 2 hold array chunks
    // 2k+1 of rows 128..160, array bytes 16..20 MiB; array bytes 8..10 MiB live elsewhere.
    let s = simkit::sim_array(Level::Raid10, None, 4, CHUNK, 32 * MIB, 1);
    let array = Arc::new(s.array);
    assert!(
        write_waits(&array, 16 * MIB + CHUNK, window),
        "a write into the window's chunks went on"
    );
    assert!(
        write_waits(&array, 20 * MIB - CHUNK, window),
        "a write into the window's last chunk went on"
    );
    // Between the window's chunks: array chunks on members 0 and 1 of the same rows.
    assert!(
        !write_waits(&array, 16 * MIB, window),
        "a write between the window's chunks waited"
    );
    // The canary: the same range read as sync (array) coordinates holds other bytes.
    assert!(!write_waits(&array, 16 * MIB + CHUNK, as_sync_range));
    assert!(
        !write_waits(&array, 24 * MIB, window),
        "a write far from the window waited"
    );
}
