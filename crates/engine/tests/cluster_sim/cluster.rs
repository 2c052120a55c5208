//! The in-memory cluster the nodes' coordinators share, with etcd's semantics as
//! `ironraid/src/cluster` uses them: the metadata token, failure agreement (recorded once,
//! applied and acknowledged by every live node) and extent ownership as `ownership.rs` gives
//! it (one owner per extent; all of a range or none; handed over only once its owner has no
//! user there, after that owner flushed). Every wait gives the turn back to the scheduler.
//! A fenced node reaches none of it: its waits end at once, with nothing taken (the engine
//! then refuses what it waited for).

use crate::world::{Block, Instr, Owner, State, World};
use std::ops::Range;

impl World {
    pub fn live_nodes(&self) -> usize {
        self.st.lock().nodes.iter().filter(|n| n.live).count()
    }

    pub fn take_token(&self, me: usize) {
        let mut st = self.st.lock();
        let cut_off = |st: &crate::world::State| st.nodes[me].dead || st.nodes[me].fenced;
        while st.token.is_some() && !cut_off(&st) {
            match self.wait_turn(&mut st, me, Block::Token) {
                Instr::Go | Instr::Die => {}
                other => unreachable!("{other:?} while waiting for the token"),
            }
        }
        if !cut_off(&st) {
            st.token = Some(me);
        }
    }

    pub fn give_token(&self, me: usize) {
        let mut st = self.st.lock();
        if st.token == Some(me) {
            st.token = None;
        }
    }

    /// Extents of per-member bytes `range`.
    pub fn extents(&self, range: &Range<u64>) -> Range<u64> {
        let e = self.st.lock().extent_bytes;
        assert!(range.start < range.end, "owning an empty range");
        range.start / e..(range.end - 1) / e + 1
    }

    /// Own every extent of `ext` (one more user each) or, if another node owns one, give the
    /// turn back until it is handed over; `serve` runs what the scheduler hands this node
    /// meanwhile (hand-offs, failures). Err if the node died.
    pub fn own(
        &self,
        me: usize,
        ext: Range<u64>,
        mut serve: impl FnMut(Instr),
    ) -> Result<(), String> {
        let mut st = self.st.lock();
        loop {
            if st.nodes[me].dead {
                return Err("this node is dead".into());
            }
            if st.nodes[me].fenced {
                return Err("this node is cut off from the cluster (fenced)".into());
            }
            if st.ownable(me, &ext) {
                for e in ext.clone() {
                    if !st.owners.contains_key(&e) {
                        st.stats.claims += 1;
                    }
                    let o = st.owners.entry(e).or_insert(Owner {
                        node: me,
                        users: 0,
                        giving: false,
                    });
                    o.users += 1;
                }
                return Ok(());
            }
            let instr = self.wait_turn(&mut st, me, Block::Extents(ext.clone()));
            if !matches!(instr, Instr::Go) {
                drop(st);
                serve(instr);
                st = self.st.lock();
            }
        }
    }

    pub fn release(&self, me: usize, ext: Range<u64>) {
        let mut st = self.st.lock();
        if st.nodes[me].dead {
            return;
        }
        for e in ext {
            match st.owners.get_mut(&e) {
                Some(o) if o.node == me && o.users > 0 => o.users -= 1,
                other => panic!("node {me} released extent {e} it does not use: {other:?}"),
            }
        }
    }

    /// Start handing `e` over: no new user here from now on.
    pub fn start_handoff(&self, me: usize, e: u64) {
        let mut st = self.st.lock();
        let o = st.owners.get_mut(&e).expect("handing over an owned extent");
        assert!(o.node == me && o.users == 0 && !o.giving, "{o:?}");
        o.giving = true;
    }

    /// The owner flushed: `to` owns `e` now.
    pub fn finish_handoff(&self, me: usize, e: u64, to: usize) {
        let mut st = self.st.lock();
        if st.nodes[me].dead {
            return;
        }
        st.stats.handoffs += 1;
        if st.nodes[to].live {
            st.owners.insert(
                e,
                Owner {
                    node: to,
                    users: 0,
                    giving: false,
                },
            );
        } else {
            st.owners.remove(&e);
        }
    }

    /// A node that stopped cleanly (flushed) owns nothing any more.
    pub fn drop_extents(&self, me: usize) {
        let mut st = self.st.lock();
        assert!(
            st.owners.values().all(|o| o.node != me || o.users == 0),
            "node {me} stops with extents in use"
        );
        st.owners.retain(|_, o| o.node != me);
    }

    /// Record `dev` faulty as applied by `me`; then wait for every live node to apply it,
    /// serving what the scheduler hands this node meanwhile.
    pub fn agree_failure(&self, me: usize, dev: u32, mut serve: impl FnMut(Instr)) {
        let mut st = self.st.lock();
        if st.nodes[me].dead || st.nodes[me].fenced {
            return;
        }
        st.failures.entry(dev).or_default().insert(me);
        loop {
            if st.nodes[me].dead || st.nodes[me].fenced || st.all_acked(dev) {
                return;
            }
            let instr = self.wait_turn(&mut st, me, Block::Acks(dev));
            if !matches!(instr, Instr::Go) {
                drop(st);
                serve(instr);
                st = self.st.lock();
            }
        }
    }

    pub fn acknowledge(&self, me: usize, dev: u32) {
        let mut st = self.st.lock();
        if st.nodes[me].dead {
            return;
        }
        st.stats.served_failures += 1;
        st.failures.entry(dev).or_default().insert(me);
    }

    /// A joining node read the superblocks: every failure recorded so far is applied there.
    pub fn joined(&self, me: usize) {
        let mut st = self.st.lock();
        for acked in st.failures.values_mut() {
            acked.insert(me);
        }
    }
}

impl State {
    pub(crate) fn ownable(&self, me: usize, ext: &Range<u64>) -> bool {
        ext.clone().all(|e| match self.owners.get(&e) {
            None => true,
            Some(o) => o.node == me && !o.giving,
        })
    }

    pub(crate) fn all_acked(&self, dev: u32) -> bool {
        let acked = &self.failures[&dev];
        self.nodes
            .iter()
            .enumerate()
            .all(|(i, n)| !n.live || acked.contains(&i))
    }
}
