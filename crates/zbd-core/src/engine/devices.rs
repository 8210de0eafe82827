//! Devices of one volume (design.md, "Devices"; build order step 3, first form): named block
//! devices beside the default one, each with its own size and map tree in the catalog,
//! sharing the data area, the log and (with dedup on) stored blocks. A block of device `d` is
//! the block key `block_key(d, lba)` everywhere below this module (`format::DEVICE_KEY_STRIDE`),
//! so the write and read paths, the log and the cleaner treat all devices alike.
//!
//! A create or a delete is one checkpoint: the row and its tree are in the catalog from that
//! checkpoint on, and checkpoints carry format bit 13 while more than one row exists (written
//! before any record names another device, since the create's own checkpoint carries it).
//! A delete first trims the device's whole range through the ordinary trim path (logged
//! steps, so a crash replays what was freed), then drops the emptied row in its checkpoint.

use super::Inner;
use crate::error::{Error, Result};
use crate::format::{
    block_key, DeviceKind, DeviceRow, BLOCK_BYTES, DEFAULT_DEVICE, DEVICE_KEY_MAX,
    DEVICE_KEY_STRIDE, SEG_FLAG_WIDE_RECORDS,
};
use crate::map::VolumeMap;

/// One device as `Volume::devices` lists it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct DeviceInfo {
    /// Id (1 is the default device; ids are never reused).
    pub id: u32,
    /// Name: the NBD export name (the default device is also the default export).
    pub name: String,
    /// "default", "snapshot", "clone" or "writable".
    pub kind: &'static str,
    /// Logical size in bytes.
    pub size_bytes: u64,
    /// Creation time, Unix seconds (0 for the default device).
    pub created_at: u64,
    /// Whether it takes writes.
    pub writable: bool,
}

impl DeviceInfo {
    fn of(row: &DeviceRow) -> DeviceInfo {
        let kind = match row.kind {
            DeviceKind::Default => "default",
            DeviceKind::Snapshot => "snapshot",
            DeviceKind::Clone => "clone",
            DeviceKind::Other => "writable",
        };
        DeviceInfo {
            id: row.id,
            name: row.name.clone(),
            kind,
            size_bytes: row.blocks * BLOCK_BYTES as u64,
            created_at: row.created_at,
            writable: row.flags & 1 == 0 && row.kind != DeviceKind::Snapshot,
        }
    }
}

impl Inner {
    /// The devices, in id order (a v2 map has only the default one).
    pub fn devices(&self) -> Vec<DeviceInfo> {
        self.devices_of(&self.state.lock().map)
    }

    /// The devices of `map`, this volume's (its state lock held).
    pub(super) fn devices_of(&self, map: &VolumeMap) -> Vec<DeviceInfo> {
        match map {
            VolumeMap::Tree(t) => t.devices().iter().map(DeviceInfo::of).collect(),
            VolumeMap::Pages(_) => vec![DeviceInfo {
                id: DEFAULT_DEVICE,
                name: "default".into(),
                kind: "default",
                size_bytes: self.size_bytes(),
                created_at: 0,
                writable: !self.read_only,
            }],
        }
    }

    /// The id of device `name`.
    pub fn device_id(&self, name: &str) -> Result<u32> {
        self.devices()
            .into_iter()
            .find(|d| d.name == name)
            .map(|d| d.id)
            .ok_or_else(|| Error::Invalid(format!("no device named {name:?} in this volume")))
    }

    /// Size in bytes of `device`.
    pub(super) fn device_size(&self, device: u32) -> Result<u64> {
        if device == DEFAULT_DEVICE {
            return Ok(self.size_bytes());
        }
        let blocks = self.state.lock().map.blocks_of(device);
        blocks
            .map(|b| b * BLOCK_BYTES as u64)
            .ok_or_else(|| Error::Invalid(format!("no device {device} in this volume")))
    }

    /// Makes a new writable device (`Volume::create_device`).
    pub fn create_device(&self, name: &str, size: u64) -> Result<u32> {
        self.check_writable()?;
        if size == 0 || !size.is_multiple_of(BLOCK_BYTES as u64) {
            return Err(Error::Invalid(format!(
                "device size {size}: a positive multiple of 4096 bytes"
            )));
        }
        let blocks = size / BLOCK_BYTES as u64;
        if blocks > DEVICE_KEY_STRIDE {
            return Err(Error::Invalid(format!(
                "device size {size}: at most {} bytes",
                DEVICE_KEY_STRIDE * BLOCK_BYTES as u64
            )));
        }
        if self.ctx().form.flags & SEG_FLAG_WIDE_RECORDS == 0 {
            return Err(Error::Invalid(
                "devices need a volume with metadata pages and 64-byte records \
                 (zbd create --metadata-pages)"
                    .into(),
            ));
        }
        let mut st = self.lock_for_write();
        let cx = self.ctx();
        let created_seq = st.next_seq;
        let VolumeMap::Tree(t) = &mut st.map else {
            return Err(Error::Invalid(
                "devices need a volume with metadata pages (zbd create --metadata-pages)".into(),
            ));
        };
        let created_at = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let id = t.add_device(DeviceRow {
            id: 0,
            parent: 0,
            kind: DeviceKind::Other,
            depth: 1,
            flags: 0,
            root: crate::format::ChildSlot::AllUnmapped,
            name: name.to_owned(),
            blocks,
            created_seq,
            created_at,
            bytes_used: 0,
            blocks_used: 0,
            epoch: 0,
            pages_max: 0,
        })?;
        if id > DEVICE_KEY_MAX {
            t.remove_device(id)?;
            return Err(Error::Invalid(format!(
                "device ids are used up (a block key names ids up to {DEVICE_KEY_MAX})"
            )));
        }
        // The row is durable, and bit 13 with it, before any record can name the device.
        st.checkpoint(&cx)?;
        Ok(id)
    }

    /// Deletes device `name` (`Volume::delete_device`).
    pub fn delete_device(&self, name: &str) -> Result<()> {
        self.check_writable()?;
        let id = self.device_id(name)?;
        if id == DEFAULT_DEVICE {
            return Err(Error::Invalid(
                "the default device is the volume's own: it cannot be deleted".into(),
            ));
        }
        let size = self.device_size(id)?;
        self.trim(id, 0, size)?;
        let mut st = self.lock_for_write();
        let cx = self.ctx();
        // Every block must be unmapped now: one written since the trim (a request that was
        // in flight) would be lost with the tree without its space being freed.
        let mut written = 0u64;
        st.map
            .runs(block_key(id, 0), size / BLOCK_BYTES as u64, |s, n| {
                if s != crate::format::BlockState::Unmapped {
                    written += n;
                }
            })?;
        if written > 0 {
            return Err(Error::Invalid(format!(
                "device {name:?} was written while it was being deleted ({written} blocks); \
                 delete it again"
            )));
        }
        let VolumeMap::Tree(t) = &mut st.map else {
            unreachable!("a device beside the default one lives in a page tree");
        };
        t.remove_device(id)?;
        st.checkpoint(&cx)?;
        Ok(())
    }
}
