//! Member management on a running array: `add` (a new spare) and `remove` (a faulty member or
//! a spare). `fail` lives with the failure path in the member set (`members/`).
//!
//! Every change is a superblock update on all members (events bump), so a restart at any moment
//! assembles the same array with the same trust in each member.

use crate::array::Array;
use crate::error::{EngineError, Result};
use crate::members::metadata::Metadata;
use crate::members::Member;
use crate::members::{read_superblock, superblock_block, MemberSb};
use crate::policy::takeover::gather_other_slots;
use device::{AlignedBuf, Device};
use format::{ROLE_FAULTY, ROLE_MAX, ROLE_SPARE, SB_OFFSET_SECTORS};
use std::sync::Arc;

impl Array {
    /// Add `dev` as a spare; it starts rebuilding at once if a role is missing.
    pub fn add_member(&self, dev: Arc<dyn Device>, force: bool) -> Result<()> {
        let mut meta = self.members.meta.lock();
        let (own, template) = self.refuse_add(&meta, dev.as_ref(), force)?;
        let readd = own
            .as_ref()
            .filter(|_| self.members.coordinator().alone())
            .and_then(|sb| self.readd_role(&meta, sb));
        if readd.is_some() {
            gather_other_slots(self.policy.bitmap(), &self.members, &self.name)?;
        }
        let free = |n: u32| {
            !meta.members.iter().any(|m| m.member.dev_number == n)
                && meta.roles.get(n as usize).is_none_or(|r| *r >= ROLE_MAX)
        };
        // A re-added member keeps its device number when nobody took it meanwhile (md does).
        let dev_number = match (&own, readd) {
            (Some(sb), Some(_)) if free(sb.dev_number) => sb.dev_number,
            _ => (0u32..)
                .find(|&n| free(n))
                .expect("a free device number exists"),
        };
        if meta.roles.len() <= dev_number as usize {
            meta.roles.resize(dev_number as usize + 1, ROLE_FAULTY);
        }
        meta.roles[dev_number as usize] = ROLE_SPARE;
        let mut sb = template;
        sb.dev_number = dev_number;
        sb.device_uuid = match (&own, readd) {
            (Some(own), Some(_)) => own.device_uuid,
            _ => crate::clock::new_uuid(self.sync.clock.as_ref()),
        };
        sb.data_size = dev.len_bytes() / 512 - sb.data_offset;
        sb.feature_map &= !(format::feature::RECOVERY_OFFSET | format::feature::RECOVERY_BITMAP);
        sb.recovery_offset = 0;
        sb.max_dev = sb.max_dev.max(meta.roles.len() as u32);
        sb.events = meta.events;
        sb.dev_roles.clone_from(&meta.roles);
        // The other nodes of a cluster agree before the member is written (md-cluster's
        // NEWDISK); alone, this always passes.
        self.members.coordinator().add_new_disk(sb.device_uuid)?;
        let member = Arc::new(Member::fresh(dev.clone(), &sb));
        let bblog_at = (SB_OFFSET_SECTORS as i64 + i64::from(sb.bblog_offset)) as u64 * 512;
        let mut bblog = AlignedBuf::zeroed(usize::from(sb.bblog_size) * 512);
        bblog.fill(0xff);
        let log = Metadata::BadBlockLog { at: bblog_at };
        self.members
            .write_metadata(&member, log, &bblog, false)
            .and_then(|()| {
                let block = superblock_block(&sb);
                self.members
                    .write_metadata(&member, Metadata::Superblock, &block, true)
            })
            .map_err(|e| EngineError::MemberIo {
                member: dev.name().into(),
                op: "write superblock",
                offset_bytes: 4096,
                source: e,
            })?;
        let max_dev = meta.roles.len() as u32;
        for m in meta.members.iter_mut() {
            m.sb.max_dev = m.sb.max_dev.max(max_dev);
        }
        meta.members.push(MemberSb {
            member: member.clone(),
            sb,
            writable: true,
        });
        if let Some(role) = readd {
            let slot = &self.members.slots[role];
            if let Some(old) = slot.member() {
                meta.retire(old.dev_number, ROLE_FAULTY);
            }
            meta.readd(dev_number, role as u16);
            slot.install(member.clone(), 0);
            slot.set_bitmap_guided(true);
            // The tables the new member holds are written at the next flush.
            if let Some(integ) = &self.integrity {
                integ.held_by_new_member(role);
            }
        }
        self.members.commit(meta);
        self.announce_added(dev.name(), readd, member, dev_number);
        self.sync.wake();
        Ok(())
    }

    /// Refusals of `add`, from what the array and the device's own superblock say: the device's
    /// superblock if it has one, and the superblock the new member's is copied from.
    fn refuse_add(
        &self,
        meta: &crate::members::Meta,
        dev: &dyn Device,
        force: bool,
    ) -> Result<(Option<format::Superblock>, format::Superblock)> {
        if self.personality.redundancy() == 0 {
            return Err(EngineError::Unsupported(format!(
                "{} has no redundancy; it cannot use a spare",
                self.name
            )));
        }
        if meta.members.iter().any(|m| m.member.name() == dev.name()) {
            return Err(EngineError::InvalidArgument(format!(
                "{} is already a member of {}",
                dev.name(),
                self.name
            )));
        }
        let own = read_superblock(dev).ok();
        if let Some(sb) = &own {
            if sb.set_uuid != self.uuid && !force {
                return Err(EngineError::InvalidArgument(format!(
                    "{}: holds a superblock of another array ({}); use --force to overwrite it",
                    dev.name(),
                    format::format_uuid_mdadm(&sb.set_uuid)
                )));
            }
        }
        let template = meta.members.first().map(|m| m.sb.clone()).ok_or_else(|| {
            EngineError::InvalidArgument(format!(
                "{} has no member to copy the superblock from",
                self.name
            ))
        })?;
        let needed = (template.data_offset + template.size) * 512;
        if dev.len_bytes() < needed {
            return Err(EngineError::InvalidArgument(format!(
                "{}: too small ({} bytes); members of {} need {needed}",
                dev.name(),
                dev.len_bytes(),
                self.name
            )));
        }
        Ok((own, template))
    }

    fn announce_added(
        &self,
        dev: &str,
        readd: Option<usize>,
        member: Arc<Member>,
        dev_number: u32,
    ) {
        match readd {
            Some(role) => self.members.events.emit(
                "member_readded",
                &self.name,
                Some(dev),
                format!("role {role}: recovering only the chunks the write-intent bitmap marks"),
            ),
            None => {
                self.members.spares.lock().push(member);
                self.members.events.emit(
                    "spare_added",
                    &self.name,
                    Some(dev),
                    format!("device number {dev_number}"),
                );
            }
        }
    }

    /// The role a member that left this array may take back with a bitmap-guided recovery:
    /// the one its own superblock records, if that role is empty now, and only if the bitmap
    /// still covers every write it missed (its events are not older than the last time bits
    /// were cleared, md's `events_cleared` rule). Otherwise it is a new spare.
    fn readd_role(&self, meta: &crate::members::Meta, sb: &format::Superblock) -> Option<usize> {
        let bm = self.policy.bitmap()?;
        if sb.set_uuid != self.uuid {
            return None;
        }
        let format::DevRole::Active(role) = sb.role() else {
            return None;
        };
        let role = usize::from(role);
        let template = &meta.members.first()?.sb;
        let fits = sb.data_offset == template.data_offset && sb.size == template.size;
        let fresh = sb.events >= bm.events_cleared() && sb.events <= meta.events;
        (role < self.members.slots.len() && self.members.slots[role].is_faulty() && fits && fresh)
            .then_some(role)
    }

    /// Remove a faulty member or a spare from the array (an active member must fail first).
    /// A failed journal goes only once its cache is written out (`journal_fail.rs`).
    pub fn remove_member(&self, name: &str) -> Result<()> {
        if let Some(j) = self.policy.journal().filter(|j| j.member().name() == name) {
            if j.failed().is_none() {
                return Err(EngineError::InvalidArgument(format!(
                    "{name} is the working journal of {}; fail it first",
                    self.name
                )));
            }
            self.settle_journal()?;
        }
        let mut meta = self.members.meta.lock();
        let idx = meta
            .members
            .iter()
            .position(|m| m.member.name() == name)
            .ok_or_else(|| {
                EngineError::InvalidArgument(format!("{name} is not a member of {}", self.name))
            })?;
        let dev_number = meta.members[idx].member.dev_number;
        self.members.coordinator().remove_disk(dev_number)?;
        self.forget_member(&mut meta, idx)?;
        self.members.commit(meta);
        self.members
            .events
            .emit("member_removed", &self.name, Some(name), String::new());
        Ok(())
    }

    /// Take member `idx` of `meta` out of the array here (not yet durable): a spare leaves
    /// the spares, a faulty member its role; an active member is refused.
    pub(crate) fn forget_member(&self, meta: &mut crate::members::Meta, idx: usize) -> Result<()> {
        let (dev_number, name) = {
            let m = &meta.members[idx].member;
            (m.dev_number, m.name().to_string())
        };
        let mut spares = self.members.spares.lock();
        if let Some(pos) = spares.iter().position(|s| s.dev_number == dev_number) {
            spares.remove(pos);
        } else if let Some(slot) = self
            .members
            .slots
            .iter()
            .find(|s| s.member().is_some_and(|m| m.dev_number == dev_number))
        {
            if !slot.is_faulty() {
                return Err(EngineError::InvalidArgument(format!(
                    "{name} is an active member of {}; fail it first",
                    self.name
                )));
            }
            slot.clear();
        }
        drop(spares);
        meta.retire(dev_number, ROLE_FAULTY);
        meta.members.remove(idx);
        Ok(())
    }

    /// Switch the journal between write-through and write-back (md's `journal_mode`).
    /// Leaving write-back writes out everything cached first.
    pub fn set_journal_mode(&self, write_back: bool) -> Result<()> {
        let Some(j) = self.policy.journal() else {
            return Err(crate::EngineError::InvalidArgument(format!(
                "{} has no journal",
                self.name
            )));
        };
        if write_back && self.members.slots.iter().any(|s| !s.is_complete()) {
            return Err(crate::EngineError::InvalidArgument(format!(
                "{} is degraded: write-back needs every member (md refuses it too)",
                self.name
            )));
        }
        j.set_write_back(write_back);
        if !write_back {
            self.parity().write_out_all(self)?;
        }
        if !self.config.read_only {
            // Recorded on the journal device, so the next start is in the same mode.
            let mut meta = self.members.meta.lock();
            if let Some(m) = meta
                .members
                .iter_mut()
                .find(|m| Arc::ptr_eq(&m.member, j.member()))
            {
                let flag = format::DEVFLAG_JOURNAL_WRITE_BACK;
                let old = m.sb.devflags;
                m.sb.devflags = if write_back { old | flag } else { old & !flag };
                if m.sb.devflags != old {
                    let block = crate::members::superblock_block(&m.sb);
                    let sb = crate::members::metadata::Metadata::Superblock;
                    let wrote = self.members.write_metadata(&m.member, sb, &block, true);
                    if let Err(e) = wrote {
                        drop(meta);
                        j.fail(&self.parts, &format!("cannot record the journal mode: {e}"));
                    }
                }
            }
        }
        Ok(())
    }
}
