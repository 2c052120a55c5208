//! Silent faults from the simulated device's own injection (a lost write, a misdirected write,
//! bit rot on a member): without integrity records they reach clients as good data, because
//! md's format has no way to tell; with records (`CreateSpec::integrity`) every read returns
//! what was written.

use device::{Faults, SimDevice};
use engine::{assemble, AssembleOptions};
use layout::Level;
use std::sync::Arc;

fn wrong_data_after(fault: Faults) -> bool {
    wrong_data_with(fault, false)
}

fn wrong_data_with(fault: Faults, integrity: bool) -> bool {
    let sims: Vec<Arc<SimDevice>> = (0..4)
        .map(|i| Arc::new(SimDevice::new(format!("m{i}"), 4 << 20, 77 + i)))
        .collect();
    let devs = || simkit::devs(&sims);
    engine::create(&engine::CreateSpec {
        integrity,
        ..simkit::clean_spec("silent", Level::Raid5, None, 64 << 10, devs(), vec![])
    })
    .expect("create");
    let array = assemble(devs(), AssembleOptions::default()).expect("assemble");
    let old = vec![0x11u8; 3 * (64 << 10)];
    array.write(0, &old, false).expect("first write");
    // Member 1 misbehaves for exactly the next full-stripe write.
    sims[1].set_faults(fault);
    let new = vec![0x22u8; 3 * (64 << 10)];
    array
        .write(0, &new, false)
        .expect("the array believes this write landed");
    sims[1].set_faults(Faults::default());
    let mut back = vec![0u8; new.len()];
    array
        .read(0, &mut back)
        .expect("the array reports no error");
    back != new
}

fn faults() -> [Faults; 3] {
    [
        Faults {
            lost_write: 1.0,
            ..Faults::default()
        },
        Faults {
            misdirected_write: 1.0,
            ..Faults::default()
        },
        Faults {
            bit_rot: 1.0,
            ..Faults::default()
        },
    ]
}

#[test]
fn with_integrity_records_every_read_returns_what_was_written() {
    for fault in faults() {
        assert!(!wrong_data_with(fault, true), "{fault:?}");
    }
}

#[test]
fn lost_misdirected_and_rotten_writes_reach_clients_undetected_without_records() {
    let lost = Faults {
        lost_write: 1.0,
        ..Faults::default()
    };
    let misdirected = Faults {
        misdirected_write: 1.0,
        ..Faults::default()
    };
    let rot = Faults {
        bit_rot: 1.0,
        ..Faults::default()
    };
    assert!(
        wrong_data_after(lost),
        "a lost write went unnoticed: wrong data expected today"
    );
    assert!(
        wrong_data_after(misdirected),
        "a misdirected write: wrong data expected today"
    );
    assert!(wrong_data_after(rot), "bit rot: wrong data expected today");
    // Canary of the canary: without a fault the same run reads back right.
    assert!(!wrong_data_after(Faults::default()));
}
