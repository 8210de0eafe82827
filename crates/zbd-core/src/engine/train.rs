//! Trained dictionaries: sampling hands a full sample to training, which installs an adopted
//! dictionary (region copies, two checkpoints) under the state lock (dicts.rs has the rules).

use super::*;
use crate::codec::unit;
use crate::error::Result;
use std::sync::Arc;

/// What a retrain did ([`crate::Volume::retrain_dictionary`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Retrained {
    /// A new dictionary was installed and serves new blocks.
    Installed,
    /// Not adopted: the sample did not train, or the dictionary saved less than 1 % of the
    /// held-out units' stored bytes (training then stops for this open, docs/savings.md).
    NotWorthIt,
    /// The directory or the dictionary region is full until a retirement frees room.
    NoRoom,
    /// Training is off, has stopped, or is running already.
    Unavailable,
}

impl Inner {
    /// Trains a dictionary once the sample is complete (off the state lock: it takes a fraction
    /// of a second) and installs it (dicts.rs).
    pub(super) fn train_if_ready(&self) -> Result<()> {
        let Some(samples) = self.dicts.take_sample() else {
            return Ok(());
        };
        self.train_and_install(samples).map(|_| ())
    }

    /// Trains a new dictionary from `samples` now, as if a drift check had asked for one and
    /// the sample were complete (tests: retraining as an operation of the model test).
    pub fn retrain_with(&self, samples: Vec<Vec<u8>>) -> Result<Retrained> {
        if !self.dicts.begin_forced() {
            return Ok(Retrained::Unavailable);
        }
        self.train_and_install(samples)
    }

    /// Trains on `samples` and installs the result if it pays; the caller holds the training
    /// turn (`Dicts::take_sample` or `Dicts::begin_forced`), released here.
    pub(super) fn train_and_install(&self, samples: Vec<Vec<u8>>) -> Result<Retrained> {
        // Train on seven groups in eight; the eighth (units of the volume's size) decides.
        let n = usize::from(self.unit_blocks);
        let (mut train, mut held) = (Vec::new(), Vec::new());
        for (i, g) in samples.chunks(n).enumerate() {
            if i % 8 == 7 && g.len() == n {
                held.push(g.concat());
            } else {
                train.extend(g.iter().cloned());
            }
        }
        drop(samples);
        let trained = crate::dicts::train(&self.sb, &train).and_then(|c| {
            crate::codec::dict::Dictionary::new(1, self.codec, 0, c.clone()).map(|d| (c, d))
        });
        let content = match trained {
            Ok((c, d)) => {
                // Adopted only if it saves >= 1 % of stored bytes on the held-out units (zstd's
                // trained entropy tables can lose to none: docs/savings.md).
                let stored = |with: Option<&crate::codec::dict::Dictionary>| -> usize {
                    held.iter()
                        .map(|u| match unit::compress_unit(self.codec, with, u) {
                            Ok(s) => s.bytes.len(),
                            Err(_) => u.len(),
                        })
                        .sum()
                };
                let (with, without) = (stored(Some(&d)), stored(None));
                if held.is_empty() || with * 100 > without * 99 {
                    self.dicts.done(true);
                    return Ok(Retrained::NotWorthIt);
                }
                c
            }
            // The sample did not train (too uniform, say): try again with the next one.
            Err(_) => {
                self.dicts.done(false);
                self.dicts.start_sampling_if_needed();
                return Ok(Retrained::NotWorthIt);
            }
        };
        let r = self.install_dictionary(content);
        match r {
            // Not installed: `no_room` stopped training until a retirement frees room.
            Ok(installed) => {
                self.dicts.done(false);
                Ok(if installed {
                    Retrained::Installed
                } else {
                    Retrained::NoRoom
                })
            }
            Err(e) => {
                self.dicts.done(true);
                Err(e)
            }
        }
    }

    /// Stores a trained dictionary and starts using it (the install order of dicts.rs).
    /// `Ok(false)`: the directory or the region is full; nothing was written.
    pub(super) fn install_dictionary(&self, content: Vec<u8>) -> Result<bool> {
        self.check_writable()?;
        let mut st = self.lock_for_write();
        let cx = self.ctx();
        // Strictly newer than every listed dictionary (which one is newest decides at open
        // which serves new blocks; ids alone do not, once they wrap around).
        let seq = st
            .dicts
            .iter()
            .map(|e| e.created_seq + 1)
            .max()
            .unwrap_or(0)
            .max(st.next_seq);
        let len = crate::codec::dict::HEADER_BYTES + content.len();
        let retiring: Vec<_> = st.retiring.iter().map(|&(e, _)| e).collect();
        let Some((slot, id, at)) = crate::dicts::place(&self.sb, &st.dicts, &retiring, len) else {
            // Training waits until a retirement frees room (`Dicts::resume`).
            self.dicts.no_room();
            return Ok(false);
        };
        let d = crate::codec::dict::Dictionary::new(id, self.codec, seq, content)?;
        let encoded = d.encode();
        crate::dicts::write_region(&*self.storage, &self.sb, at, &encoded)?;
        st.dicts[slot] = crate::format::DictEntry {
            id,
            codec: self.codec.id(),
            flags: 1,
            region_offset: at,
            len: encoded.len() as u32,
            crc: crc32c::crc32c(&encoded),
            created_seq: seq,
            live_blocks: 0,
        };
        self.sync_read_counters(&mut st);
        // Two checkpoints: both slots list it before any record names it.
        st.checkpoint(&cx)?;
        st.checkpoint(&cx)?;
        self.dicts.add(Arc::new(d), true);
        Ok(true)
    }
}
