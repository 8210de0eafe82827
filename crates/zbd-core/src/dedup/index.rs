//! The bounded dedup index: three tables in one fixed budget (docs/design.md, "Deduplication").
//!
//! - *recent* (1/8 of the budget): the last blocks stored, 64 fingerprint bits -> location, 4-way
//!   sets. It finds short-range copies (a file written twice, a block repeated in a write).
//! - *hooks* (5/8): a 16-bit tag -> the extent that holds the block, 8-way
//!   buckets, 6 bytes a hook. A hook that matches says "the run this block belongs to may be in
//!   that extent": the caller loads that extent's **manifest** (the fingerprint parts of the
//!   blocks it holds, which the log keeps anyway) and the rest of the run matches against it.
//!   Which blocks are hooks is chosen by content ([`Fingerprint::is_hook_at`]): every block while
//!   the table has room, then one in 2, 4, ... (the sampling level rises and the hooks that no
//!   longer qualify are dropped) so that the table covers ever more data at lower density; at
//!   [`HOOK_LEVEL_MAX`] it stops thinning and forgets its oldest hooks instead.
//! - *manifests* (1/4): the manifests loaded last, 32 fingerprint bits -> location. Measured
//!   on a clone set, a quarter of the budget here finds more than the same bytes as hooks
//!   (`zbd estimate`, docs/benchmarks.md): a run of duplicates spans several extents, and each
//!   manifest held serves the rest of the run at no RAM per block of the window.
//!
//! Every table evicts its oldest entry to make room, so a full index forgets old data and never
//! grows, waits or fails; no invariant of a volume depends on it. RAM is fixed when it is made.

use super::Fingerprint;
use std::collections::{HashMap, HashSet, VecDeque};

/// The sparsest sampling: one block in 2^10 (a window of 1,024 blocks per hook). Beyond it a
/// duplicate run would need to be ~4 MiB long to be found, so the table forgets instead.
pub const HOOK_LEVEL_MAX: u32 = 10;

/// The smallest budget [`Index::new`] accepts (smaller ones are raised to it).
pub const INDEX_BYTES_MIN: u64 = 64 << 10;

/// Where a stored block is, as the caller names it; the index only hands it back.
pub type Location = u64;

const EMPTY_LOC: Location = u64::MAX;
const EMPTY_EXTENT: u32 = u32::MAX;
const RECENT_WAYS: usize = 4;
const HOOK_WAYS: usize = 8;
/// RAM per manifest entry in the cache: hash map slot (key, location, extent, control byte at a
/// load factor of 7/8) plus its key kept for eviction.
const MANIFEST_ENTRY_BYTES: u64 = 28;

/// The start of an [`Index::image`]: what it is and its layout's version.
const IMAGE_MAGIC: &[u8; 16] = b"zbd-dedup-idx-1\0";
/// Magic, volume uuid, budget, hook level (u32), hooks held, recent slots, hook slots.
const IMAGE_HEADER_BYTES: usize = 16 + 16 + 8 + 4 + 8 + 8 + 8;

/// What the index proposes for a fingerprint.
#[derive(Debug, PartialEq, Eq)]
pub enum Candidate {
    /// A stored block that may hold the same bytes: compare them before sharing it.
    Block(Location),
    /// Hooks matched: these extents may hold the run; load their manifests
    /// ([`Index::add_manifest`]) and ask again with [`Index::lookup_cached`].
    Extents(Vec<u32>),
}

/// What the index did, for `zbd stat` and `zbd estimate`.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct IndexStats {
    /// Lookups asked.
    pub lookups: u64,
    /// Candidates proposed by the recent table.
    pub recent_candidates: u64,
    /// Candidates proposed by loaded manifests.
    pub manifest_candidates: u64,
    /// Lookups whose hooks named extents to load.
    pub hook_matches: u64,
    /// Manifests loaded.
    pub manifests_loaded: u64,
    /// Candidates the caller found equal (shared).
    pub verified: u64,
    /// Candidates the caller found different (a fingerprint-part collision or stale entry).
    pub rejected: u64,
    /// Hooks pushed out by newer ones (the window is full).
    pub hooks_evicted: u64,
    /// Hooks held now.
    pub hooks: u64,
    /// Sampling level now: one block in 2^level is a hook.
    pub hook_level: u32,
}

/// The index. Not thread-safe by itself: the engine keeps one per writer or behind a lock.
pub struct Index {
    recent_tags: Vec<u64>,
    recent_locs: Vec<Location>,
    hook_tags: Vec<u16>,
    hook_extents: Vec<u32>,
    // Looked up per block written: a fast hash (keys are fingerprint parts and extents).
    manifests: HashMap<u32, (Location, u32), foldhash::fast::RandomState>,
    manifest_order: VecDeque<(u32, Vec<u32>)>,
    manifest_extents: HashSet<u32, foldhash::fast::RandomState>,
    manifest_entries: u64,
    manifest_cap: u64,
    budget: u64,
    stats: IndexStats,
}

impl Index {
    /// An empty index that holds at most `budget` bytes of tables (at least [`INDEX_BYTES_MIN`]).
    pub fn new(budget: u64) -> Index {
        let budget = budget.max(INDEX_BYTES_MIN);
        let recent_sets = (budget / 8 / (16 * RECENT_WAYS as u64)).max(1) as usize;
        let manifest_cap = budget / 4 / MANIFEST_ENTRY_BYTES;
        let hook_bytes = budget - budget / 8 - budget / 4;
        let hook_buckets = (hook_bytes / (6 * HOOK_WAYS as u64)).max(1) as usize;
        Index {
            recent_tags: vec![0; recent_sets * RECENT_WAYS],
            recent_locs: vec![EMPTY_LOC; recent_sets * RECENT_WAYS],
            hook_tags: vec![0; hook_buckets * HOOK_WAYS],
            hook_extents: vec![EMPTY_EXTENT; hook_buckets * HOOK_WAYS],
            manifests: HashMap::default(),
            manifest_order: VecDeque::new(),
            manifest_extents: HashSet::default(),
            manifest_entries: 0,
            manifest_cap,
            budget,
            stats: IndexStats::default(),
        }
    }

    /// The budget the tables were sized for (their RAM, within a few bytes of rounding).
    pub fn budget(&self) -> u64 {
        self.budget
    }

    /// What the index did so far.
    pub fn stats(&self) -> IndexStats {
        self.stats
    }

    /// A candidate for a block with fingerprint `fp`: recent blocks first, then the loaded
    /// manifests, then (hooks only) the extents whose manifests may hold it.
    pub fn lookup(&mut self, fp: Fingerprint) -> Option<Candidate> {
        self.stats.lookups += 1;
        if let Some(c) = self.lookup_cached(fp) {
            return Some(c);
        }
        if !fp.is_hook_at(self.stats.hook_level) {
            return None;
        }
        let (b, tag) = self.hook_slot(fp);
        let extents: Vec<u32> = (b..b + HOOK_WAYS)
            .filter(|&i| self.hook_tags[i] == tag && self.hook_extents[i] != EMPTY_EXTENT)
            .map(|i| self.hook_extents[i])
            .filter(|e| !self.has_manifest(*e))
            .collect();
        if extents.is_empty() {
            return None;
        }
        self.stats.hook_matches += 1;
        Some(Candidate::Extents(extents))
    }

    /// A candidate from the recent table or the loaded manifests only (after loading manifests).
    pub fn lookup_cached(&mut self, fp: Fingerprint) -> Option<Candidate> {
        let set = self.recent_set(fp);
        let tag = fp.high();
        for i in set..set + RECENT_WAYS {
            if self.recent_locs[i] != EMPTY_LOC && self.recent_tags[i] == tag {
                self.stats.recent_candidates += 1;
                return Some(Candidate::Block(self.recent_locs[i]));
            }
        }
        let (loc, _) = *self.manifests.get(&fp.manifest_part())?;
        self.stats.manifest_candidates += 1;
        Some(Candidate::Block(loc))
    }

    /// A block was stored at `loc` in extent `extent`: remember it.
    pub fn insert(&mut self, fp: Fingerprint, loc: Location, extent: u32) {
        self.remember_recent(fp, loc);
        if !fp.is_hook_at(self.stats.hook_level) {
            return;
        }
        let (b, tag) = self.hook_slot(fp);
        let bucket = b..b + HOOK_WAYS;
        if bucket
            .clone()
            .any(|i| self.hook_tags[i] == tag && self.hook_extents[i] == extent)
        {
            return;
        }
        if self.hook_extents[b + HOOK_WAYS - 1] != EMPTY_EXTENT
            && self.stats.hook_level < HOOK_LEVEL_MAX
            && self.stats.hooks * 4 >= self.hook_tags.len() as u64 * 3
        {
            // Full: thin the sample rather than forget, then place this hook if it still is one.
            self.raise_level();
            return self.insert_hook(fp, extent);
        }
        self.insert_hook(fp, extent);
    }

    fn insert_hook(&mut self, fp: Fingerprint, extent: u32) {
        if !fp.is_hook_at(self.stats.hook_level) {
            return;
        }
        let (b, tag) = self.hook_slot(fp);
        let last = b + HOOK_WAYS - 1;
        if self.hook_extents[last] == EMPTY_EXTENT {
            self.stats.hooks += 1;
        } else {
            // A full bucket drops the hook that the next thinning would drop first (the lowest
            // rank), the oldest of those; at the last level all ranks are equal: the oldest.
            self.stats.hooks_evicted += 1;
            let victim = (b..=last)
                .rev()
                .min_by_key(|&i| rank(self.hook_tags[i]))
                .expect("a bucket has slots");
            if rank(tag) < rank(self.hook_tags[victim]) {
                return;
            }
            self.hook_tags[victim..=last].rotate_left(1);
            self.hook_extents[victim..=last].rotate_left(1);
        }
        // Newest first.
        self.hook_tags[b..=last].rotate_right(1);
        self.hook_extents[b..=last].rotate_right(1);
        self.hook_tags[b] = tag;
        self.hook_extents[b] = extent;
    }

    /// One level sparser: drops the hooks that no longer qualify (about half), keeping each
    /// bucket's survivors newest first.
    fn raise_level(&mut self) {
        self.stats.hook_level += 1;
        let level = self.stats.hook_level;
        let mut held = 0;
        for b in (0..self.hook_tags.len()).step_by(HOOK_WAYS) {
            let mut w = b;
            for r in b..b + HOOK_WAYS {
                if self.hook_extents[r] != EMPTY_EXTENT && rank(self.hook_tags[r]) >= level {
                    self.hook_tags[w] = self.hook_tags[r];
                    self.hook_extents[w] = self.hook_extents[r];
                    w += 1;
                }
            }
            held += (w - b) as u64;
            self.hook_extents[w..b + HOOK_WAYS].fill(EMPTY_EXTENT);
        }
        self.stats.hooks = held;
    }

    /// The caller found the candidate at `loc` equal to the block: count it and keep it recent,
    /// so that further copies of a popular block are found without hooks.
    pub fn verified(&mut self, fp: Fingerprint, loc: Location) {
        self.stats.verified += 1;
        self.remember_recent(fp, loc);
    }

    /// The caller found the candidate different.
    pub fn rejected(&mut self) {
        self.stats.rejected += 1;
    }

    /// Whether `extent`'s manifest is loaded.
    pub fn has_manifest(&self, extent: u32) -> bool {
        self.manifest_extents.contains(&extent)
    }

    /// Loads the manifest of `extent`: the [`Fingerprint::manifest_part`] and location of each
    /// block it holds. The oldest manifests are dropped to stay within the budget.
    pub fn add_manifest(
        &mut self,
        extent: u32,
        entries: impl IntoIterator<Item = (u32, Location)>,
    ) {
        if self.has_manifest(extent) {
            return;
        }
        let mut parts = Vec::new();
        for (part, loc) in entries {
            self.manifests.insert(part, (loc, extent));
            parts.push(part);
        }
        self.stats.manifests_loaded += 1;
        self.manifest_entries += parts.len() as u64;
        self.manifest_order.push_back((extent, parts));
        self.manifest_extents.insert(extent);
        while self.manifest_entries > self.manifest_cap && self.manifest_order.len() > 1 {
            let (old, parts) = self.manifest_order.pop_front().expect("non-empty");
            self.manifest_entries -= parts.len() as u64;
            self.manifest_extents.remove(&old);
            for p in parts {
                if self.manifests.get(&p).is_some_and(|(_, e)| *e == old) {
                    self.manifests.remove(&p);
                }
            }
        }
    }

    /// The recent and hook tables as bytes, for a restart of the same volume to begin where
    /// this one ends ([`Index::restore`]): `uuid` names the volume. The loaded manifests are
    /// left out (they are read again from the medium when a hook matches), and so are the
    /// counters but the hooks held and the sampling level. Little-endian, CRC32C at the end,
    /// in one zstd frame (docs/format.md, "The dedup index image").
    pub fn image(&self, uuid: &[u8; 16]) -> Vec<u8> {
        let mut b = Vec::with_capacity(
            IMAGE_HEADER_BYTES + self.recent_tags.len() * 16 + self.hook_tags.len() * 6 + 4,
        );
        b.extend_from_slice(IMAGE_MAGIC);
        b.extend_from_slice(uuid);
        b.extend_from_slice(&self.budget.to_le_bytes());
        b.extend_from_slice(&self.stats.hook_level.to_le_bytes());
        b.extend_from_slice(&self.stats.hooks.to_le_bytes());
        b.extend_from_slice(&(self.recent_tags.len() as u64).to_le_bytes());
        b.extend_from_slice(&(self.hook_tags.len() as u64).to_le_bytes());
        self.recent_tags
            .iter()
            .for_each(|t| b.extend_from_slice(&t.to_le_bytes()));
        self.recent_locs
            .iter()
            .for_each(|l| b.extend_from_slice(&l.to_le_bytes()));
        self.hook_tags
            .iter()
            .for_each(|t| b.extend_from_slice(&t.to_le_bytes()));
        self.hook_extents
            .iter()
            .for_each(|e| b.extend_from_slice(&e.to_le_bytes()));
        let crc = crc32c::crc32c(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        // One zstd frame: empty slots are runs that vanish, so a lightly used index costs
        // little beside its volume (the raw tables are 3/4 of the budget).
        zstd::bulk::compress(&b, 1).unwrap_or(b)
    }

    /// The index an [`Index::image`] of volume `uuid` holds, if it was made with the same
    /// budget (the tables' shape depends on it) and reads back intact; otherwise why not. What
    /// it proposes stays a hint: a restored entry that names blocks rewritten since costs a
    /// comparison that fails, never wrong data.
    pub fn restore(image: &[u8], uuid: &[u8; 16], budget: u64) -> Result<Index, String> {
        let fresh = Index::new(budget);
        let (recent, hooks) = (fresh.recent_tags.len(), fresh.hook_tags.len());
        let want = IMAGE_HEADER_BYTES + recent * 16 + hooks * 6 + 4;
        // Never more than this budget's tables: a larger frame is not ours.
        let image = &zstd::bulk::decompress(image, want).map_err(|_| {
            "it does not decompress to an image of this budget: damaged or cut short"
        })?;
        if image.len() < IMAGE_HEADER_BYTES || &image[..IMAGE_MAGIC.len()] != IMAGE_MAGIC {
            return Err("not a dedup index image".into());
        }
        let (body, crc) = image.split_at(image.len() - 4);
        if crc32c::crc32c(body).to_le_bytes() != crc {
            return Err("its checksum does not match (damaged or cut short)".into());
        }
        let u64_at = |o: usize| u64::from_le_bytes(image[o..o + 8].try_into().expect("8 bytes"));
        let o = IMAGE_MAGIC.len();
        if &image[o..o + 16] != uuid {
            return Err("it belongs to another volume".into());
        }
        if u64_at(o + 16) != fresh.budget {
            return Err(format!(
                "it was made with a {} KiB index, this open has {} KiB",
                u64_at(o + 16) >> 10,
                fresh.budget >> 10
            ));
        }
        let level = u32::from_le_bytes(image[o + 24..o + 28].try_into().expect("4 bytes"));
        let held = u64_at(o + 28);
        if u64_at(o + 36) != recent as u64
            || u64_at(o + 44) != hooks as u64
            || image.len() != want
            || level > HOOK_LEVEL_MAX
        {
            return Err("its tables do not have the shape of this budget's".into());
        }
        let mut at = IMAGE_HEADER_BYTES;
        let mut take = |n: usize| {
            let s = &image[at..at + n];
            at += n;
            s
        };
        let mut ix = fresh;
        ix.recent_tags = take(recent * 8)
            .chunks(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8")))
            .collect();
        ix.recent_locs = take(recent * 8)
            .chunks(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8")))
            .collect();
        ix.hook_tags = take(hooks * 2)
            .chunks(2)
            .map(|c| u16::from_le_bytes(c.try_into().expect("2")))
            .collect();
        ix.hook_extents = take(hooks * 4)
            .chunks(4)
            .map(|c| u32::from_le_bytes(c.try_into().expect("4")))
            .collect();
        let counted = ix
            .hook_extents
            .iter()
            .filter(|&&e| e != EMPTY_EXTENT)
            .count() as u64;
        if counted != held {
            return Err("its hook count does not match its hook table".into());
        }
        ix.stats.hook_level = level;
        ix.stats.hooks = held;
        Ok(ix)
    }

    fn remember_recent(&mut self, fp: Fingerprint, loc: Location) {
        let set = self.recent_set(fp);
        let tag = fp.high();
        let ways = set..set + RECENT_WAYS;
        // Move an existing entry of this tag (or the oldest) to the front.
        let at = ways
            .clone()
            .find(|&i| self.recent_tags[i] == tag && self.recent_locs[i] != EMPTY_LOC)
            .unwrap_or(set + RECENT_WAYS - 1);
        self.recent_tags[set..=at].rotate_right(1);
        self.recent_locs[set..=at].rotate_right(1);
        self.recent_tags[set] = tag;
        self.recent_locs[set] = loc;
    }

    fn recent_set(&self, fp: Fingerprint) -> usize {
        (fp.low() % (self.recent_tags.len() / RECENT_WAYS) as u64) as usize * RECENT_WAYS
    }

    /// First slot of the hook's bucket and its tag. The bucket comes from bits the tag does not
    /// use, so they are independent; the tag's top bits are the sampling level's (zero for
    /// every hook held), so at level k a tag tells apart 2^(16-k) blocks of a bucket.
    fn hook_slot(&self, fp: Fingerprint) -> (usize, u16) {
        let buckets = (self.hook_tags.len() / HOOK_WAYS) as u64;
        let b = ((fp.low() >> 16) % buckets) as usize * HOOK_WAYS;
        (b, (fp.high() >> 48) as u16)
    }
}

/// The highest sampling level at which a hook with this tag still qualifies, capped at the last.
fn rank(tag: u16) -> u32 {
    tag.leading_zeros().min(HOOK_LEVEL_MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fp(i: u64) -> Fingerprint {
        Fingerprint::of(&i.to_le_bytes())
    }

    fn hook(from: u64, level: u32) -> (u64, Fingerprint) {
        (from..)
            .map(|i| (i, fp(i)))
            .find(|(_, f)| f.is_hook_at(level))
            .expect("some block is a hook")
    }

    /// An image restores an index that proposes what the saved one proposed, and continues
    /// where it stopped; an image of another volume, another budget, or with any byte changed or
    /// cut off is refused with its reason.
    #[test]
    fn an_image_restores_what_the_index_proposed_and_refuses_anything_else() {
        let uuid = [7u8; 16];
        let budget = 256 << 10;
        let mut ix = Index::new(budget);
        for i in 0..50_000 {
            ix.insert(fp(i), i * 3, (i / 100) as u32);
        }
        assert!(ix.stats().hook_level > 0, "the sample thinned");
        let image = ix.image(&uuid);
        let mut back = Index::restore(&image, &uuid, budget).expect("restores");
        assert_eq!(
            (back.stats().hooks, back.stats().hook_level),
            (ix.stats().hooks, ix.stats().hook_level)
        );
        let mut proposed = 0;
        for i in 0..50_000 {
            let want = ix.lookup(fp(i));
            proposed += usize::from(want.is_some());
            assert_eq!(back.lookup(fp(i)), want, "block {i}");
        }
        assert!(proposed > 1000, "the index proposed {proposed}");
        // A fresh index proposes none of it: the restore is what finds them.
        let mut cold = Index::new(budget);
        assert!((0..50_000).all(|i| cold.lookup(fp(i)).is_none()));
        // It goes on as the saved index would.
        ix.insert(fp(1 << 40), 1, 1);
        back.insert(fp(1 << 40), 1, 1);
        assert_eq!(back.image(&uuid), ix.image(&uuid));

        let refused = |img: &[u8], u: &[u8; 16], b: u64| Index::restore(img, u, b).err();
        assert!(refused(&image, &[8; 16], budget)
            .expect("uuid")
            .contains("another volume"));
        assert!(refused(&image, &uuid, budget * 2)
            .expect("budget")
            .contains("KiB index"));
        assert!(refused(&image[..image.len() - 1], &uuid, budget).is_some());
        assert!(refused(&image[..10], &uuid, budget).is_some());
        assert!(refused(&[], &uuid, budget).is_some());
        for at in [0, 20, 40, 70, image.len() / 2, image.len() - 1] {
            let mut bad = image.clone();
            bad[at] ^= 0x10;
            assert!(refused(&bad, &uuid, budget).is_some(), "byte {at} flipped");
        }
    }

    #[test]
    fn a_recent_block_is_proposed_at_its_location() {
        let mut ix = Index::new(1 << 20);
        ix.insert(fp(1), 100, 0);
        assert_eq!(ix.lookup(fp(1)), Some(Candidate::Block(100)));
        assert_eq!(ix.lookup(fp(2)), None);
    }

    #[test]
    fn a_hook_names_its_extent_and_the_manifest_then_finds_the_run() {
        // A budget so small the recent table forgets, so the hook must do the work.
        let mut ix = Index::new(INDEX_BYTES_MIN);
        let (h, hook_fp) = hook(0, HOOK_LEVEL_MAX);
        ix.insert(hook_fp, 7 << 16, 7);
        for i in 0..100_000 {
            ix.insert(fp(1_000_000 + i), 8 << 16, 8);
        }
        assert!(ix.lookup_cached(hook_fp).is_none(), "recent forgot it");
        assert_eq!(ix.lookup(hook_fp), Some(Candidate::Extents(vec![7])));
        let manifest: Vec<(u32, Location)> = (h..h + 20)
            .enumerate()
            .map(|(k, i)| (fp(i).manifest_part(), (7 << 16) + k as u64))
            .collect();
        ix.add_manifest(7, manifest);
        assert_eq!(ix.lookup(hook_fp), Some(Candidate::Block(7 << 16)));
        assert_eq!(ix.lookup(fp(h + 5)), Some(Candidate::Block((7 << 16) + 5)));
    }

    #[test]
    fn a_full_index_thins_its_sample_then_forgets_the_oldest_and_keeps_its_size() {
        let mut ix = Index::new(INDEX_BYTES_MIN);
        let (_, first) = hook(0, HOOK_LEVEL_MAX);
        ix.insert(first, 0, 0);
        let capacity = ix.hook_tags.len() as u64;
        let mut n = 1u64;
        let mut i = 1u64 << 40;
        let mut levels = vec![0];
        // Evictions at the last level, where the oldest goes: 4 per slot on average, so the
        // first hook's bucket (8 slots) has surely turned over.
        let mut at_last_level = None;
        while at_last_level.is_none_or(|n| ix.stats().hooks_evicted < n + 4 * capacity) {
            if at_last_level.is_none() && ix.stats().hook_level == HOOK_LEVEL_MAX {
                at_last_level = Some(ix.stats().hooks_evicted);
            }
            let (j, f) = hook(i, ix.stats().hook_level);
            ix.insert(f, n, n as u32);
            n += 1;
            i = j + 1;
            if levels.last() != Some(&ix.stats().hook_level) {
                levels.push(ix.stats().hook_level);
            }
            assert!(ix.stats().hooks <= capacity);
        }
        assert_eq!(levels, (0..=HOOK_LEVEL_MAX).collect::<Vec<_>>());
        // Far more hooks were inserted than fit; the first one's bucket has since been refilled.
        assert!(n > capacity * 2, "{n} inserted, {capacity} slots");
        assert!(!matches!(ix.lookup(first), Some(Candidate::Extents(e)) if e.contains(&0)));
    }

    #[test]
    fn thinning_keeps_the_hooks_that_still_qualify() {
        let mut ix = Index::new(INDEX_BYTES_MIN);
        let kept: Vec<(u64, Fingerprint)> = (0..4u64).map(|k| hook(k << 32, 3)).collect();
        for (k, (_, f)) in kept.iter().enumerate() {
            ix.insert(*f, k as u64, k as u32);
        }
        // Unique blocks until the sample has thinned past level 3's hooks... but not beyond.
        let mut i = 1u64 << 50;
        while ix.stats().hook_level < 3 {
            ix.insert(fp(i), i, 1000);
            i += 1;
        }
        for (k, (_, f)) in kept.iter().enumerate() {
            ix.recent_locs.fill(EMPTY_LOC);
            assert_eq!(ix.lookup(*f), Some(Candidate::Extents(vec![k as u32])));
        }
    }

    #[test]
    fn a_candidate_is_only_a_hint_a_colliding_part_proposes_another_block() {
        // Two blocks whose 32-bit manifest parts agree and whose other bits differ: the index
        // cannot tell them apart, which is why every candidate is compared before it is shared.
        let stored = Fingerprint(0xdead_beef_u128 << 96 | 1);
        let other = Fingerprint(0xdead_beef_u128 << 96 | 2 << 64);
        let mut ix = Index::new(INDEX_BYTES_MIN);
        ix.add_manifest(3, [(stored.manifest_part(), 42)]);
        assert_eq!(ix.lookup(other), Some(Candidate::Block(42)));
    }

    #[test]
    fn manifests_stay_within_their_share_of_the_budget() {
        let mut ix = Index::new(INDEX_BYTES_MIN);
        for e in 0..1000u32 {
            let entries: Vec<(u32, Location)> = (0..64u64)
                .map(|k| (fp(u64::from(e) * 64 + k).manifest_part(), k))
                .collect();
            ix.add_manifest(e, entries);
        }
        assert!(ix.manifest_entries <= ix.manifest_cap);
        assert!(ix.manifests.len() as u64 <= ix.manifest_cap);
        assert!(ix.has_manifest(999) && !ix.has_manifest(0));
    }
}
