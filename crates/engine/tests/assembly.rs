//! Assembly rules over simulated members: dirty + degraded parity arrays refused unless forced
//! (md's `start_dirty_degraded`), forced assembly of stale or faulty-recorded members
//! (`mdadm --assemble --force`), foreign members never accepted, and the role table made
//! durable before the array is handed out; a forgotten member refused unless `--run`.

use device::{Device, SimDevice};
use engine::{assemble, Array, AssembleOptions, MemberState};
use format::{Superblock, ROLE_FAULTY};
use layout::Level;
use simkit::{config, devs};
use std::sync::Arc;

const MIB: u64 = 1 << 20;
const MEMBER_BYTES: u64 = 16 * MIB;
const CHUNK: u64 = 64 << 10;

fn sims(prefix: &str, n: usize, seed: u64) -> Vec<Arc<SimDevice>> {
    (0..n)
        .map(|i| {
            Arc::new(SimDevice::new(
                format!("{prefix}{i}"),
                MEMBER_BYTES,
                seed * 100 + i as u64,
            ))
        })
        .collect()
}

fn make(level: Level, members: &[Arc<SimDevice>], spares: &[Arc<SimDevice>]) {
    simkit::create_clean("asm", level, None, CHUNK, devs(members), devs(spares));
}

fn opts(force: bool) -> AssembleOptions {
    AssembleOptions {
        name: None,
        config: config(),
        force,
        ..Default::default()
    }
}

fn pick(all: &[Arc<SimDevice>], idx: &[usize]) -> Vec<Arc<SimDevice>> {
    idx.iter().map(|&i| all[i].clone()).collect()
}

fn sb(sim: &SimDevice) -> Superblock {
    engine::read_superblock(sim).expect("superblock")
}

/// Change a member's superblock in place (as an older or differently updated copy would be).
fn rewrite_sb(sim: &SimDevice, f: impl FnOnce(&mut Superblock)) {
    let mut s = sb(sim);
    f(&mut s);
    sim.scribble(format::SB_OFFSET_SECTORS * 512, &s.encode());
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Write `data` at 0 and flush; leaves the array dirty (a crash if it is then dropped).
fn write_flush(a: &Array, data: &[u8]) {
    a.write(0, data, false).expect("write");
    a.flush().expect("flush");
}

fn read_back(a: &Array, len: usize) -> Vec<u8> {
    let mut back = vec![0u8; len];
    a.read(0, &mut back).expect("read");
    back
}

/// A member given but left out of the array (not current) is not among its members.
fn left_out(a: &Array, name: &str) -> bool {
    a.status().members.iter().all(|m| m.name != name)
}

fn member_state(a: &Array, name: &str) -> (Option<usize>, MemberState) {
    let st = a.status();
    let m = st
        .members
        .iter()
        .find(|m| m.name == name)
        .unwrap_or_else(|| panic!("{name} not in {:?}", st.members));
    (m.role, m.state)
}

#[test]
fn dirty_degraded_raid5_is_refused_unless_forced() {
    let s = sims("r5-", 4, 1);
    make(Level::Raid5, &s, &[]);
    let data = pattern(7, (3 * MIB) as usize);
    {
        let a = assemble(devs(&s), opts(false)).unwrap();
        write_flush(&a, &data);
        // Dropped without close: the superblocks still say "active".
    }
    assert!(!sb(&s[0]).is_clean());
    let present = pick(&s, &[0, 1, 3]);
    let before: Vec<Superblock> = present.iter().map(|d| sb(d)).collect();
    let err = assemble(devs(&present), opts(false))
        .err()
        .expect("a dirty, degraded RAID5 must not start unforced")
        .to_string();
    for want in [
        "array 'asm'",
        "role 2 missing",
        "not stopped cleanly",
        "write hole",
        "parity that disagrees",
        "silently wrong",
        "run --force",
    ] {
        assert!(err.contains(want), "missing '{want}' in: {err}");
    }
    assert!(!err.contains('\n'), "one line: {err}");
    let after: Vec<Superblock> = present.iter().map(|d| sb(d)).collect();
    assert_eq!(before, after, "a refused assembly writes nothing");

    let a = assemble(devs(&present), opts(true)).expect("forced start");
    assert!(a.was_dirty_at_assembly());
    assert_eq!(a.status().missing_roles, vec![2]);
    assert!(read_back(&a, data.len()) == data);
    // The missing role is recorded faulty on every present member before any write.
    for d in &present {
        let now = sb(d);
        assert_eq!(now.dev_roles[2], ROLE_FAULTY, "{}", d.name());
        assert_eq!(now.events, before[0].events + 1);
    }
}

#[test]
fn dirty_degraded_raid6_is_refused_clean_degraded_raid5_starts() {
    let s = sims("r6-", 5, 2);
    make(Level::Raid6, &s, &[]);
    {
        let a = assemble(devs(&s), opts(false)).unwrap();
        write_flush(&a, &pattern(1, MIB as usize));
    }
    let err = assemble(devs(&pick(&s, &[0, 2, 3, 4])), opts(false))
        .err()
        .expect("dirty degraded RAID6 refused")
        .to_string();
    assert!(
        err.contains("role 1 missing") && err.contains("RAID6 write hole"),
        "{err}"
    );

    let s = sims("c5-", 4, 3);
    make(Level::Raid5, &s, &[]);
    let data = pattern(3, MIB as usize);
    {
        let a = assemble(devs(&s), opts(false)).unwrap();
        write_flush(&a, &data);
        a.close().unwrap();
    }
    let a = assemble(devs(&pick(&s, &[1, 2, 3])), opts(false)).expect("clean degraded starts");
    assert!(read_back(&a, data.len()) == data);
}

#[test]
fn dirty_degraded_mirrors_start() {
    for (level, n) in [(Level::Raid1, 3), (Level::Raid10, 4)] {
        let s = sims(&format!("{level:?}-"), n, 4);
        make(level, &s, &[]);
        let data = pattern(9, MIB as usize);
        {
            let a = assemble(devs(&s), opts(false)).unwrap();
            write_flush(&a, &data);
        }
        let present = pick(&s, &(1..n).collect::<Vec<_>>());
        let a = assemble(devs(&present), opts(false)).expect("dirty degraded mirror starts");
        assert!(a.was_dirty_at_assembly());
        assert!(read_back(&a, data.len()) == data, "{level:?}");
        assert_eq!(sb(&s[1]).dev_roles[0], ROLE_FAULTY, "{level:?}");
    }
}

#[test]
fn missing_role_is_recorded_durably_and_the_absent_member_stays_out() {
    let s = sims("dur-", 4, 5);
    make(Level::Raid5, &s, &[]);
    let events = sb(&s[0]).events;
    // Read-only: nothing written, not even the role table.
    let ro = AssembleOptions {
        config: engine::ArrayConfig {
            read_only: true,
            ..config()
        },
        ..opts(false)
    };
    drop(assemble(devs(&pick(&s, &[1, 2, 3])), ro).unwrap());
    assert_eq!(sb(&s[1]).events, events);
    assert_eq!(sb(&s[1]).dev_roles[0], 0);

    // Read-write: the role table says "role 0 faulty" on every present member at once.
    drop(assemble(devs(&pick(&s, &[1, 2, 3])), opts(false)).unwrap());
    for d in &s[1..] {
        assert_eq!(sb(d).dev_roles[0], ROLE_FAULTY, "{}", d.name());
        assert_eq!(sb(d).events, events + 1);
    }
    // The absent member comes back one event behind, which alone would let it in as current;
    // the recorded table keeps it out.
    let a = assemble(devs(&s), opts(false)).unwrap();
    assert!(left_out(&a, "dur-0"));
    assert_eq!(a.status().missing_roles, vec![0]);
}

#[test]
fn force_takes_back_the_freshest_stale_member() {
    let s = sims("st-", 4, 6);
    make(Level::Raid5, &s, &[]);
    let data = pattern(11, (2 * MIB) as usize);
    {
        let a = assemble(devs(&s), opts(false)).unwrap();
        write_flush(&a, &data);
        a.close().unwrap();
    }
    let e = sb(&s[0]).events;
    // Members 2 and 3 went on without 0 and 1 (several updates each): 0 is 5 behind, 1 is 3.
    rewrite_sb(&s[2], |sb| sb.events = e + 10);
    rewrite_sb(&s[3], |sb| sb.events = e + 10);
    rewrite_sb(&s[1], |sb| sb.events = e + 7);
    rewrite_sb(&s[0], |sb| sb.events = e + 5);
    let err = assemble(devs(&s), opts(false))
        .err()
        .expect("two stale members: too few")
        .to_string();
    assert!(err.contains("too few members"), "{err}");
    assert!(err.contains("run --force"), "{err}");
    assert!(err.contains("st-1 (role 1, 3 events behind)"), "{err}");
    assert!(!err.contains("st-0"), "only what is needed is named: {err}");

    let a = assemble(devs(&s), opts(true)).expect("forced");
    assert_eq!(member_state(&a, "st-1"), (Some(1), MemberState::InSync));
    assert_eq!(a.status().missing_roles, vec![0]);
    assert!(read_back(&a, data.len()) == data);
    for d in &s[1..] {
        assert_eq!(sb(d).events, e + 11, "forced member made current");
        assert_eq!(sb(d).dev_roles[..4], [ROLE_FAULTY, 1, 2, 3]);
    }
    assert_eq!(
        sb(&s[0]).events,
        e + 5,
        "the member left out is not written"
    );
    a.close().unwrap();
    drop(a);
    // Now it assembles without force (degraded, role 0 recorded faulty).
    let a = assemble(devs(&s), opts(false)).expect("after forcing, current");
    assert!(read_back(&a, data.len()) == data);
}

#[test]
fn force_takes_back_a_member_recorded_faulty() {
    let s = sims("fl-", 4, 7);
    make(Level::Raid5, &s, &[]);
    let first = pattern(1, MIB as usize);
    let second = pattern(2, MIB as usize);
    {
        let a = assemble(devs(&s), opts(false)).unwrap();
        write_flush(&a, &first);
        a.fail_member("fl-0").unwrap();
        // Lands on 1, 2, 3 only.
        a.write(MIB, &second, false).unwrap();
        a.flush().unwrap();
        a.fail_member("fl-1").unwrap();
        assert!(a.is_failed());
        // Crash: left dirty.
    }
    let e = sb(&s[2]).events;
    assert_eq!(sb(&s[1]).events, e - 1);
    let err = assemble(devs(&s), opts(false))
        .err()
        .expect("two recorded faulty: too few")
        .to_string();
    assert!(
        err.contains("fl-1 (role 1, 1 event behind, recorded faulty)"),
        "{err}"
    );
    assert!(err.contains("run --force"), "{err}");

    let a = assemble(devs(&s), opts(true)).expect("forced");
    assert_eq!(member_state(&a, "fl-1"), (Some(1), MemberState::InSync));
    assert!(left_out(&a, "fl-0"));
    let mut back = vec![0u8; 2 * MIB as usize];
    a.read(0, &mut back).unwrap();
    assert!(back[..MIB as usize] == first[..]);
    assert!(back[MIB as usize..] == second[..]);
    assert_eq!(sb(&s[1]).events, sb(&s[2]).events);
    assert_eq!(sb(&s[1]).dev_roles[1], 1);
}

#[test]
fn force_never_accepts_another_arrays_member() {
    let a_sims = sims("a-", 4, 8);
    let b_sims = sims("b-", 4, 9);
    make(Level::Raid5, &a_sims, &[]);
    make(Level::Raid5, &b_sims, &[]);
    let mut mixed = pick(&a_sims, &[0, 1, 2]);
    mixed.push(b_sims[3].clone());
    for force in [false, true] {
        let err = assemble(devs(&mixed), opts(force))
            .err()
            .expect("foreign member refused")
            .to_string();
        assert!(err.starts_with("b-3: belongs to array"), "{err}");
    }
}

#[test]
fn force_never_takes_a_role_that_is_filled() {
    let s = sims("tk-", 4, 10);
    let spare = sims("tk-spare", 1, 11);
    make(Level::Raid5, &s, &spare);
    let e = sb(&s[0]).events;
    // The spare (slot 4) rebuilt role 3 after member 3 failed; then 0 and 1 were lost.
    for d in [&s[2], &spare[0]] {
        rewrite_sb(d, |sb| {
            sb.events = e + 4;
            sb.dev_roles[..5].copy_from_slice(&[ROLE_FAULTY, ROLE_FAULTY, 2, ROLE_FAULTY, 3]);
        });
    }
    let given = vec![s[2].clone(), s[3].clone(), spare[0].clone()];
    for force in [false, true] {
        let err = assemble(devs(&given), opts(force))
            .err()
            .expect("roles 0 and 1 missing; tk-3's role is filled")
            .to_string();
        assert!(err.contains("too few members"), "{err}");
        assert!(err.contains("tk-3 (its role 3 is taken)"), "{err}");
        assert!(!err.contains("would take back"), "{err}");
        assert_eq!(force, err.contains("even with --force"), "{err}");
    }
}

#[test]
fn a_reused_slot_belongs_to_its_fresher_holder() {
    let s = sims("ru-", 4, 12);
    make(Level::Raid5, &s, &[]);
    let data = pattern(4, MIB as usize);
    let spare = sims("ru-new", 1, 13);
    {
        let a = Arc::new(assemble(devs(&pick(&s, &[1, 2, 3])), opts(false)).unwrap());
        write_flush(&a, &data);
        a.add_member(spare[0].clone(), false).unwrap();
        a.start_background();
        assert!(a.wait_sync_idle(std::time::Duration::from_secs(60)));
        assert_eq!(a.status().missing_roles, Vec::<usize>::new());
        a.close().unwrap();
    }
    // The absent member's slot went to the new one; both come back.
    assert_eq!(sb(&spare[0]).dev_number, sb(&s[0]).dev_number);
    let mut all = s.clone();
    all.push(spare[0].clone());
    let a = assemble(devs(&all), opts(false)).expect("the older claim is left out");
    assert!(left_out(&a, "ru-0"));
    assert_eq!(member_state(&a, "ru-new0"), (Some(0), MemberState::InSync));
    assert!(read_back(&a, data.len()) == data);
    drop(a);
    // Given the other way round, the same.
    all.rotate_right(1);
    let a = assemble(devs(&all), opts(false)).unwrap();
    assert!(left_out(&a, "ru-0"));
    // A true copy (same slot, same count) is still refused.
    let copy = Arc::new(SimDevice::new("ru-copy", MEMBER_BYTES, 14));
    copy.scribble(0, &s[1].contents()[..(2 * MIB) as usize]);
    let err = assemble(devs(&[s[1].clone(), s[2].clone(), copy]), opts(true))
        .err()
        .expect("a copy is refused")
        .to_string();
    assert!(err.contains("appears twice"), "{err}");
}

/// Two spares claiming one device number with the same event count (a spare whose addition a
/// cut left unrecorded, then another spare given the same free number): neither holds data, so
/// one is kept and the other left out, instead of refusing the array. A copy of a spare (same
/// device UUID) is still refused.
#[test]
fn two_spares_claiming_one_device_number_keep_the_first() {
    let s = sims("sp-", 4, 21);
    let spare = sims("sp-spare", 2, 22);
    make(Level::Raid5, &s, &spare[..1]);
    let data = pattern(6, MIB as usize);
    {
        let mut with_spare = s.clone();
        with_spare.push(spare[0].clone());
        let a = assemble(devs(&with_spare), opts(false)).unwrap();
        write_flush(&a, &data);
        a.close().unwrap();
    }
    // A second spare with the first one's superblock but its own device UUID.
    let first = sb(&spare[0]);
    let mut other = first.clone();
    other.device_uuid[0] ^= 0xff;
    spare[1].scribble(format::SB_OFFSET_SECTORS * 512, &other.encode());
    let mut all = s.clone();
    all.extend(spare.iter().cloned());
    let a = assemble(devs(&all), opts(false)).expect("two claiming spares are not fatal");
    assert_eq!(member_state(&a, "sp-spare0"), (None, MemberState::Spare));
    assert!(left_out(&a, "sp-spare1"));
    assert!(read_back(&a, data.len()) == data);
    drop(a);
    // An exact copy of the spare is still refused.
    spare[1].scribble(format::SB_OFFSET_SECTORS * 512, &first.encode());
    let err = assemble(devs(&all), opts(false))
        .err()
        .expect("a copy is refused")
        .to_string();
    assert!(err.contains("appears twice"), "{err}");
}

/// md's "need N to start it (use --run to insist)": a member the role table records as working
/// but not given is refused when asked to (`refuse_unfailed_missing`), before anything is
/// written; a member recorded faulty earlier, or `force`, lets the array start degraded.
#[test]
fn a_forgotten_member_is_refused_and_nothing_written_unless_run_or_force() {
    let all = sims("fg", 4, 21);
    make(Level::Raid5, &all, &[]);
    let refuse = AssembleOptions {
        refuse_unfailed_missing: true,
        ..opts(false)
    };
    let events = sb(&all[0]).events;
    let err = assemble(devs(&pick(&all, &[0, 1, 2])), refuse.clone())
        .err()
        .expect("refused");
    let msg = err.to_string();
    assert!(msg.contains("role 3") && msg.contains("--run"), "{msg}");
    assert_eq!(sb(&all[0]).events, events, "a refused assembly wrote");
    // Force implies run.
    let forced = AssembleOptions {
        force: true,
        ..refuse.clone()
    };
    let a = assemble(devs(&pick(&all, &[0, 1, 2])), forced).expect("forced");
    assert!(!a.status().missing_roles.is_empty());
    a.close().expect("close");
    // Recorded faulty by that run: the three start without being told.
    let a = assemble(devs(&pick(&all, &[0, 1, 2])), refuse).expect("known degraded");
    a.close().expect("close");
}
