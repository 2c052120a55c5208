//! What another node of the array's cluster did to the member set, applied on this node
//! (md-cluster's NEWDISK, METADATA_UPDATED and RESYNCING for a recovery, as messages from the
//! node that did it). The other node made every change durable in the superblocks first;
//! these only bring this node's view to it, and write nothing.
//!
//! A member rebuilt elsewhere: this node learns of it as a spare, then, before it lets go of
//! each recovery window the rebuilding node announces, that everything below the window is
//! rebuilt (so its writes there reach the new member too, exactly as the rebuilding node's
//! own in-sync point makes them). Its superblock is the rebuilding node's to write meanwhile;
//! when the walk stops, the member's superblock says how far it got.

use crate::array::Array;
use crate::error::{EngineError, Result};

use crate::members::{read_superblock, Member, MemberSb, FULLY_IN_SYNC};
use device::Device;
use format::{ROLE_FAULTY, ROLE_MAX, ROLE_SPARE};
use std::sync::Arc;

impl Array {
    /// Another node of the array's cluster recorded member `dev_number` (md's device number,
    /// the same on every node) faulty: stop using it here too. Nothing happens if it is not
    /// in a role here (failed already, or never added).
    pub fn member_failed_elsewhere(&self, dev_number: u32, why: &str) {
        if let Some(role) = self.members.role_of_member(dev_number) {
            self.members.fail_role(role, None, why);
        }
    }

    /// Another node removed member `dev_number` (a spare, or a faulty member) and recorded it
    /// in the superblocks: it leaves this node's view too, so that no superblock of this
    /// node's names it again or is written to it. An active member here is kept (and said).
    pub fn member_removed_elsewhere(&self, dev_number: u32) {
        let mut meta = self.members.meta.lock();
        let Some(idx) = meta
            .members
            .iter()
            .position(|m| m.member.dev_number == dev_number)
        else {
            return;
        };
        let name = meta.members[idx].member.name().to_string();
        match self.forget_member(&mut meta, idx) {
            Ok(()) => {
                drop(meta);
                self.members.events.emit(
                    "member_removed",
                    &self.name,
                    Some(&name),
                    "removed on another node".into(),
                );
            }
            Err(e) => {
                tracing::error!(array = %self.name, member = %name, "not removed here as on another node: {e}")
            }
        }
    }

    /// Another node of the cluster (its coordinator) started the check, repair or resync this
    /// node asked for.
    pub fn sync_started_elsewhere(&self, action: crate::SyncAction, node: &str) {
        self.sync.started_elsewhere(self, action, node);
    }

    /// ... and ended it: the sectors it found inconsistent, or why it failed.
    pub fn sync_ended_elsewhere(
        &self,
        action: crate::SyncAction,
        node: &str,
        outcome: std::result::Result<u64, String>,
    ) {
        self.sync.record_elsewhere(self, action, node, outcome);
    }

    /// Another node added `dev` (its superblock written, and the array's): it becomes a spare
    /// here too. A member this node knows already is left as it is.
    pub fn member_added_elsewhere(&self, dev: Arc<dyn Device>) -> Result<()> {
        let sb = read_superblock(dev.as_ref())
            .map_err(|e| EngineError::InvalidArgument(format!("{}: {e}", dev.name())))?;
        if sb.set_uuid != self.uuid {
            return Err(EngineError::InvalidArgument(format!(
                "{} is not a member of {}",
                dev.name(),
                self.name
            )));
        }
        let mut meta = self.members.meta.lock();
        if let Some(known) = meta
            .members
            .iter()
            .find(|m| m.member.dev_number == sb.dev_number)
        {
            return match known.sb.device_uuid == sb.device_uuid {
                true => Ok(()),
                false => Err(EngineError::InvalidArgument(format!(
                    "{}: device number {} is another member's here",
                    dev.name(),
                    sb.dev_number
                ))),
            };
        }
        let member =
            Arc::new(
                Member::from_sb(dev.clone(), &sb).map_err(|e| EngineError::MemberIo {
                    member: dev.name().into(),
                    op: "read the bad-block log",
                    offset_bytes: 0,
                    source: e,
                })?,
            );
        let d = sb.dev_number as usize;
        if meta.roles.len() <= d {
            meta.roles.resize(d + 1, ROLE_FAULTY);
        }
        meta.roles[d] = ROLE_SPARE;
        meta.members.push(MemberSb {
            member: member.clone(),
            sb,
            writable: true,
        });
        drop(meta);
        self.members.spares.lock().push(member);
        self.members.events.emit(
            "spare_added",
            &self.name,
            Some(dev.name()),
            format!("device number {d}, added on another node"),
        );
        Ok(())
    }

    /// Another node rebuilds member `dev_number` into `role` and has rebuilt every byte below
    /// `rebuilt_below` (sync coordinates: per-member bytes): use it there from now on.
    pub fn recovery_window_elsewhere(
        &self,
        dev_number: u32,
        role: usize,
        rebuilt_below: u64,
    ) -> Result<()> {
        let slot = self.members.slots.get(role).ok_or_else(|| {
            EngineError::InvalidArgument(format!("{}: no role {role}", self.name))
        })?;
        let mut meta = self.members.meta.lock();
        let holds = slot.member().filter(|_| !slot.is_faulty());
        match holds {
            Some(m) if m.dev_number == dev_number => {}
            Some(m) => {
                return Err(EngineError::InvalidArgument(format!(
                    "{}: role {role} is device {}'s here, not device {dev_number}'s",
                    self.name, m.dev_number
                )))
            }
            None => {
                let member = {
                    let mut spares = self.members.spares.lock();
                    let at = spares
                        .iter()
                        .position(|m| m.dev_number == dev_number)
                        .ok_or_else(|| {
                            EngineError::InvalidArgument(format!(
                                "{}: device {dev_number} is not a spare here",
                                self.name
                            ))
                        })?;
                    spares.remove(at)
                };
                assert!(role < ROLE_MAX as usize, "role {role} out of md's range");
                meta.activate_spare(dev_number, role as u16);
                if let Some(old) = slot.member() {
                    meta.retire(old.dev_number, ROLE_FAULTY);
                }
                slot.install(member.clone(), 0);
                if let Some(integ) = &self.integrity {
                    integ.held_by_new_member(role);
                }
                self.members.events.emit(
                    "spare_active",
                    &self.name,
                    Some(member.name()),
                    format!("spare takes role {role}; rebuilt by another node"),
                );
            }
        }
        meta.set_writable(dev_number, false);
        if rebuilt_below > slot.in_sync_bytes() {
            slot.advance(rebuilt_below);
        }
        drop(meta);
        if let Some(used) = &self.used {
            // The member gets this node's used-region map whole before the rebuilding node
            // goes past this window: a walk after the rebuild reads the maps on it too.
            used.copy_to_new_members(&self.members);
        }
        Ok(())
    }

    /// The other node's recovery walk over member `dev_number` stopped: its superblock says
    /// how far the member is rebuilt (whole, or up to its recovery offset).
    pub fn recovery_paused_elsewhere(&self, dev_number: u32) {
        let Some(role) = self.members.role_of_member(dev_number) else {
            return;
        };
        let slot = &self.members.slots[role];
        let Some(member) = slot.member().filter(|_| !slot.is_faulty()) else {
            return;
        };
        let sb = match read_superblock(member.dev.as_ref()) {
            Ok(sb) => sb,
            Err(e) => {
                tracing::warn!(array = %self.name, member = member.name(), "cannot read how far another node rebuilt: {e}");
                return;
            }
        };
        let mut meta = self.members.meta.lock();
        let rebuilt = match sb.feature_map & format::feature::RECOVERY_OFFSET {
            0 => FULLY_IN_SYNC,
            _ => sb.recovery_offset * 512,
        };
        if rebuilt > slot.in_sync_bytes() {
            slot.advance(rebuilt);
        }
        if slot.is_complete() {
            meta.set_recovery(dev_number, None);
            meta.set_writable(dev_number, true);
            drop(meta);
            self.members.events.emit(
                "member_in_sync",
                &self.name,
                Some(member.name()),
                format!("role {role} rebuilt by another node"),
            );
        }
    }
}
