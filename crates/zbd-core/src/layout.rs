//! Volume geometry: how a logical size, an extent size and a capacity become a superblock.

use crate::codec::Codec;
use crate::error::{Error, Result};
use crate::format::{
    align_up, checkpoint_slot_bytes, SegmentForm, Superblock, BLOCK_BYTES, CKPT_FLAG_V3_SEGMENTS,
    EXTENT_BYTES_MAX, EXTENT_BYTES_MIN, EXTENT_TABLE_ENTRIES_PER_PAGE, FORMAT_VERSION,
    MAP_ENTRIES_PER_PAGE, MAP_PAGE_BYTES, SECTOR_BYTES, SUPERBLOCK_BYTES, UNIT_BLOCKS_MAX,
};
use crate::meta::geometry::bit10_slot_bytes;
use crate::meta::{ListBounds, MetaGeometry};

/// Default extent size of the library (paper: 32 KiB; 16–64 KiB performed best): the geometry
/// the engine's tests are written for.
pub const EXTENT_BYTES_DEFAULT: u32 = 32 * 1024;
/// Extent size `zbd create` gives a volume on a file or block device. An extent is the unit of
/// device writes (one segment per extent as it fills), so on a disk bound by operations more
/// than bytes its size sets the request count: 128 KiB wrote lz4 1.35x faster than 32 KiB
/// (docs/benchmarks-history.md, "Stop 23"), and 512 KiB brought PostMark on XFS from 0.63x to
/// 0.86x native with lz4 (native's write request count) and `none` from 0.57x to 0.71x, with
/// no loss on the throttled-disk NBD group (random 4 KiB reads and writes at queue depth 1 and
/// 16, 1 MiB sequential; issue 30, docs/benchmarks.md). Flushes still write only the pending
/// segment, so "4 KiB write + flush" costs the same; recovery still reads at most
/// `RECOVERY_BYTES_MAX` (the queue holds 64 such extents).
pub const FILE_EXTENT_BYTES_DEFAULT: u32 = 512 * 1024;
/// Extent size `zbd create` gives a RADOS volume: each extent write is one OSD operation, and 32
/// KiB extents made sequential writes OSD-bound (8x the operations of 256 KiB, half the
/// throughput in the same run; docs/ceph.md).
pub const RADOS_EXTENT_BYTES_DEFAULT: u32 = 256 * 1024;
/// Recovery reads at most this many bytes of extents (sets the allocation queue length).
pub const RECOVERY_BYTES_MAX: u64 = 32 * 1024 * 1024;
/// Allocation queue length bounds.
pub const QUEUE_LEN_MIN: u32 = 16;
/// Upper bound on the allocation queue length.
pub const QUEUE_LEN_MAX: u32 = 1024;
/// Default cleaner watermarks (% of extents free).
pub const CLEAN_LOW_PCT_DEFAULT: u8 = 10;
/// Default high watermark.
pub const CLEAN_HIGH_PCT_DEFAULT: u8 = 25;

/// Whether new volumes train and use dictionaries unless told otherwise (docs/savings.md).
pub const DICTIONARY_DEFAULT: bool = false;

/// Parameters of `Volume::create`.
#[derive(Clone, Debug)]
pub struct CreateOptions {
    /// Logical size in bytes (multiple of 4 KiB).
    pub logical_bytes: u64,
    /// Extent size (power of two, 8 KiB..1 MiB).
    pub extent_bytes: u32,
    /// Codec for new writes.
    pub codec: Codec,
    /// Data area size in bytes; default: enough for the whole logical size incompressible.
    pub capacity_bytes: Option<u64>,
    /// Cleaner low watermark.
    pub clean_low_pct: u8,
    /// Cleaner high watermark.
    pub clean_high_pct: u8,
    /// Allocation queue length (extents recovery may have to read); default from
    /// `RECOVERY_BYTES_MAX`. Small values make checkpoints frequent (tests).
    pub queue_len: Option<u32>,
    /// Compression unit size for new writes (4K = every block on its own .. 64K); default
    /// `UNIT_BYTES_DEFAULT`, or the largest unit the extent size holds if that is smaller.
    pub unit_bytes: Option<u32>,
    /// Whether opens train and use dictionaries unless `OpenOptions::dictionary` says
    /// otherwise (stored in the superblock).
    pub dictionary: bool,
    /// Format version to write: the current one, or 2 for a volume that older builds must open
    /// (without seeded item checksums; `zbd upgrade` turns it into the current one later).
    pub format_version: u32,
    /// Largest logical size `zbd grow --size` may reach later (format 3): the map region is
    /// laid out for it (16 KiB per MiB of it; never written until used, so a sparse file or a
    /// RADOS pool pays nothing for the room). `None`: no room beyond the size.
    pub max_logical_bytes: Option<u64>,
    /// Largest data area `zbd grow --capacity` may reach later (format 3), likewise for the
    /// extent table (32 bytes per extent). `None`: no room beyond the capacity.
    pub max_capacity_bytes: Option<u64>,
    /// Keep maps in metadata pages (checkpoint flag bit 10; docs/format.md). Hidden: it
    /// carves a fixed stock of metadata extents until the carver (design step 1b.5) takes
    /// them as needed.
    pub metadata_pages: bool,
    /// Whether opens deduplicate inline unless `OpenOptions::dedup` says otherwise (needs
    /// `metadata_pages`).
    pub dedup: bool,
    /// Metadata extents (copy 0) create carves for the stock, in place of
    /// `MetaGeometry::stock_extents` (tests: a small stock makes the carver supply the rest).
    #[doc(hidden)]
    pub metadata_stock_extents: Option<u32>,
    /// Pair-state list capacity `C` in place of `ListBounds::created_capacity` (tests: volumes
    /// created before the floor of 16,384 have 4,096, and must keep working at that bound).
    #[doc(hidden)]
    pub list_capacity: Option<u32>,
}

impl CreateOptions {
    /// Defaults for a logical size.
    pub fn new(logical_bytes: u64) -> Self {
        CreateOptions {
            logical_bytes,
            extent_bytes: EXTENT_BYTES_DEFAULT,
            codec: Codec::default(),
            capacity_bytes: None,
            clean_low_pct: CLEAN_LOW_PCT_DEFAULT,
            clean_high_pct: CLEAN_HIGH_PCT_DEFAULT,
            queue_len: None,
            unit_bytes: None,
            dictionary: DICTIONARY_DEFAULT,
            format_version: FORMAT_VERSION,
            max_logical_bytes: None,
            max_capacity_bytes: None,
            metadata_pages: false,
            dedup: false,
            metadata_stock_extents: None,
            list_capacity: None,
        }
    }
}

/// Default compression unit (docs/savings.md, "Engine with units": 8 KiB met the space targets
/// and kept 4 KiB random reads >= 0.8x of single blocks; 16 KiB saved more but read at 0.54x on
/// the corpus).
pub const UNIT_BYTES_DEFAULT: u32 = 8 * 1024;

/// Largest unit (in blocks, a power of two) whose worst stored form (compressed, one sector
/// short of raw, with one record per block) fits an empty extent of `extent_bytes` in segments
/// of `form` (the widest a volume may write: `SegmentForm::widest`).
pub fn unit_blocks_max(extent_bytes: u32, form: SegmentForm) -> u8 {
    let mut n = UNIT_BLOCKS_MAX;
    while n > 1
        && form.padded_len(usize::from(n) * BLOCK_BYTES - SECTOR_BYTES, usize::from(n))
            > u64::from(extent_bytes)
    {
        n /= 2;
    }
    n
}

/// The widest segment form a volume made with `opts` may write (bit 11 comes with metadata
/// pages).
fn widest_form(opts: &CreateOptions) -> SegmentForm {
    let flags = if opts.metadata_pages {
        CKPT_FLAG_V3_SEGMENTS
    } else {
        0
    };
    SegmentForm::widest(opts.format_version, flags, opts.extent_bytes)
}

/// Unit size in blocks for `opts`, checked against its extent size.
fn unit_blocks(opts: &CreateOptions) -> Result<u8> {
    let fit = unit_blocks_max(opts.extent_bytes, widest_form(opts));
    let Some(u) = opts.unit_bytes else {
        return Ok(((UNIT_BYTES_DEFAULT as usize / BLOCK_BYTES) as u8).min(fit));
    };
    let max = u32::from(UNIT_BLOCKS_MAX) * BLOCK_BYTES as u32;
    if !u.is_power_of_two() || !(BLOCK_BYTES as u32..=max).contains(&u) {
        return Err(Error::Invalid(format!(
            "unit size {u}: must be a power of two from 4K to 64K"
        )));
    }
    let n = (u as usize / BLOCK_BYTES) as u8;
    if n > fit {
        return Err(Error::Invalid(format!(
            "unit size {}K does not fit extents of {}K (largest unit: {}K); use a larger \
             --extent-size or a smaller --unit-size",
            u / 1024,
            opts.extent_bytes / 1024,
            u32::from(fit) * 4
        )));
    }
    Ok(n)
}

/// Incompressible 4 KiB blocks one extent holds in the worst case: one block per segment (a flush
/// after every write), each segment paying its header, one record and 512-byte sector padding,
/// and never more than one segment of `form` (the widest the volume may write) holds. (The 4 KiB
/// padding of a 4 KiB device is not counted for single-block segments: 8 to 12 KiB a block
/// would double the capacity of every volume for a workload that flushes after every block.)
pub fn raw_blocks_per_extent(extent_bytes: u32, form: SegmentForm) -> u64 {
    let per_block = SegmentForm::plain(FORMAT_VERSION).padded_len(BLOCK_BYTES, 1);
    let one_each = u64::from(extent_bytes) / per_block;
    one_each.min(form.raw_blocks_fitting(extent_bytes)).max(1)
}

/// Extents the default capacity provides for `logical_blocks`: the incompressible worst case plus
/// a reserve for partly filled extents and the cleaner (5 %, at least 16 extents).
pub fn default_extent_count(logical_blocks: u64, extent_bytes: u32, form: SegmentForm) -> u64 {
    let needed = logical_blocks.div_ceil(raw_blocks_per_extent(extent_bytes, form));
    needed + (needed / 20).max(16)
}

/// Metadata extents (copy 0) the data area of a volume of `extent_count` extents created
/// with `opts` is sized for: 0 without metadata pages, else the default stock
/// (`MetaGeometry::stock_extents`, which covers the carver's high watermark) or the stock
/// `opts` asks for if larger (the partners double it).
fn stock_extents(opts: &CreateOptions, logical_blocks: u64, extent_count: u64) -> Result<u32> {
    if !opts.metadata_pages {
        return Ok(0);
    }
    let pages = logical_blocks.div_ceil(MAP_ENTRIES_PER_PAGE as u64);
    let count = u32::try_from(extent_count).unwrap_or(u32::MAX);
    let g = MetaGeometry::new(
        u32::try_from(pages).unwrap_or(u32::MAX),
        opts.extent_bytes,
        count,
    )?;
    // Room for the default stock even when a test asks for less: what the carver takes up
    // to its high watermark then comes from it, not from the data's room.
    Ok(stock_extents_for(opts, &g, logical_blocks).max(g.stock_extents(logical_blocks)))
}

/// The stock create carves on geometry `g`: `MetaGeometry::stock_extents`, or what `opts` asks
/// for (at least one extent, at most `H`).
pub fn stock_extents_for(opts: &CreateOptions, g: &MetaGeometry, logical_blocks: u64) -> u32 {
    opts.metadata_stock_extents
        .map_or_else(|| g.stock_extents(logical_blocks), |k| k.clamp(1, g.h))
}

/// The pair-state list capacity create gives a volume of `extent_count` extents:
/// `ListBounds::created_capacity`, or what `opts` asks for, within what builds have created
/// (4,096 before 6349d060 .. 65,536).
pub fn created_list_capacity(opts: &CreateOptions, extent_count: u32) -> u32 {
    opts.list_capacity.map_or_else(
        || ListBounds::created_capacity(extent_count),
        |c| c.clamp(4096, crate::meta::geometry::LIST_CAPACITY_MAX),
    )
}

/// Computes the superblock for `opts` (uuid and time left for the caller to fill).
pub fn plan(opts: &CreateOptions) -> Result<Superblock> {
    if opts.dedup && !opts.metadata_pages {
        return Err(Error::Invalid(
            "deduplication needs metadata pages (create with --metadata-pages)".into(),
        ));
    }
    let e = opts.extent_bytes;
    if !e.is_power_of_two() || !(EXTENT_BYTES_MIN..=EXTENT_BYTES_MAX).contains(&e) {
        return Err(Error::Invalid(format!(
            "extent size {e}: must be a power of two from 8K to 1M"
        )));
    }
    if opts.logical_bytes == 0 || !opts.logical_bytes.is_multiple_of(BLOCK_BYTES as u64) {
        return Err(Error::Invalid(format!(
            "size {}: must be a non-zero multiple of 4K",
            opts.logical_bytes
        )));
    }
    if opts.clean_low_pct >= opts.clean_high_pct || opts.clean_high_pct > 90 {
        return Err(Error::Invalid(
            "cleaner watermarks: need low < high <= 90 (%)".into(),
        ));
    }
    if !(2..=FORMAT_VERSION).contains(&opts.format_version) {
        return Err(Error::Invalid(format!(
            "format version {}: this zbd creates 2 to {FORMAT_VERSION}",
            opts.format_version
        )));
    }
    if opts.metadata_pages && opts.format_version < 3 {
        return Err(Error::Invalid("metadata pages need format 3".into()));
    }
    let logical_blocks = opts.logical_bytes / BLOCK_BYTES as u64;
    let extent_count = match opts.capacity_bytes {
        Some(c) => c / u64::from(e),
        // The carved stock of metadata extents comes on top of the data's room.
        None => {
            let n = default_extent_count(logical_blocks, e, widest_form(opts));
            n + 2 * u64::from(stock_extents(opts, logical_blocks, n)?)
        }
    };
    if extent_count < 4 {
        return Err(Error::Invalid(format!(
            "capacity: at least 4 extents ({} bytes) are needed",
            4 * u64::from(e)
        )));
    }
    let extent_count = u32::try_from(extent_count).map_err(|_| {
        Error::Invalid("capacity: more than 2^32 extents; use a larger extent size".into())
    })?;
    let queue_default =
        ((RECOVERY_BYTES_MAX / u64::from(e)) as u32).clamp(QUEUE_LEN_MIN, QUEUE_LEN_MAX);
    let queue_len = opts
        .queue_len
        .unwrap_or(queue_default)
        .clamp(2, QUEUE_LEN_MAX)
        .min(extent_count - 2 * stock_extents(opts, logical_blocks, extent_count.into())?)
        .max(2);
    let map_pages = u32::try_from(logical_blocks.div_ceil(MAP_ENTRIES_PER_PAGE as u64))
        .map_err(|_| Error::Invalid("size: volume too large".into()))?;
    let extent_table_pages = extent_count.div_ceil(EXTENT_TABLE_ENTRIES_PER_PAGE as u32);
    let (map_pages_room, extent_table_pages_room) =
        growth_room(opts, e, map_pages, extent_table_pages)?;
    let mut slot = checkpoint_slot_bytes(queue_len, map_pages_room, extent_table_pages_room);
    if opts.metadata_pages {
        // Bit 10's extension can need more room than v2's page table (its list, below
        // ~64 GiB); the slot holds either, so a later `zbd enable` never needs to move it.
        let g = MetaGeometry::new(map_pages.max(map_pages_room), e, extent_count)?;
        let capacity = created_list_capacity(opts, extent_count);
        let bit10 = bit10_slot_bytes(&g, queue_len, extent_table_pages_room, capacity);
        slot = slot.max(
            u32::try_from(bit10).map_err(|_| Error::Invalid("checkpoint slot too large".into()))?,
        );
    }
    let dict_bytes = dictionary_region_bytes(opts.logical_bytes);
    // Copy 0 of every metadata region, then copy 1: the two copies of anything lie a whole
    // metadata half apart, so no single bad sector (or small run of them) holds both.
    let page = MAP_PAGE_BYTES as u64;
    let half = 2 * u64::from(slot)
        + 2 * u64::from(map_pages_room) * page
        + 2 * u64::from(extent_table_pages_room) * page
        + u64::from(dict_bytes);
    let checkpoint_offset = 2 * SUPERBLOCK_BYTES as u64;
    let starts = |base: u64| {
        let map = base + 2 * u64::from(slot);
        let et = map + 2 * u64::from(map_pages_room) * page;
        let dict = et + 2 * u64::from(extent_table_pages_room) * page;
        (base, map, et, dict)
    };
    let (ck0, map0, et0, dict0) = starts(checkpoint_offset);
    let (ck1, map1, et1, dict1) = starts(checkpoint_offset + half);
    let data_offset = align_up(checkpoint_offset + 2 * half, u64::from(e));
    Ok(Superblock {
        version: opts.format_version,
        checkpoint_offset1: ck1,
        map_offset1: map1,
        extent_table_pages,
        extent_table_offset: [et0, et1],
        dict_bytes,
        dict_offset: [dict0, dict1],
        uuid: [0; 16],
        logical_blocks,
        extent_bytes: e,
        extent_count,
        codec_id: opts.codec.id(),
        codec_level: opts.codec.level(),
        queue_len,
        map_pages,
        checkpoint_offset: ck0,
        checkpoint_slot_bytes: slot,
        map_offset: map0,
        data_offset,
        clean_low_pct: opts.clean_low_pct,
        clean_high_pct: opts.clean_high_pct,
        created_unix: 0,
        unit_blocks: unit_blocks(opts)?,
        settings: if opts.dictionary {
            crate::format::SB_SETTING_DICTIONARY
        } else {
            0
        } | if opts.dedup {
            crate::format::SB_SETTING_DEDUP
        } else {
            0
        },
        map_pages_room,
        extent_table_pages_room,
    })
}

/// Map and extent-table pages the regions of a new volume have room for: those its
/// `max_logical_bytes` and `max_capacity_bytes` need (format 3), at least those in use.
fn growth_room(
    opts: &CreateOptions,
    extent_bytes: u32,
    map_pages: u32,
    extent_table_pages: u32,
) -> Result<(u32, u32)> {
    let asked = opts.max_logical_bytes.is_some() || opts.max_capacity_bytes.is_some();
    if asked && opts.format_version < 3 {
        return Err(Error::Invalid(
            "room to grow (--max-size, --max-capacity) needs format 3".into(),
        ));
    }
    let map = match opts.max_logical_bytes {
        Some(max) if max < opts.logical_bytes => {
            return Err(Error::Invalid(format!(
                "max size {max}: smaller than the size {}",
                opts.logical_bytes
            )))
        }
        Some(max) => {
            u32::try_from((max / BLOCK_BYTES as u64).div_ceil(MAP_ENTRIES_PER_PAGE as u64))
                .map_err(|_| Error::Invalid(format!("max size {max}: too large")))?
        }
        None => map_pages,
    };
    let et = match opts.max_capacity_bytes {
        Some(max) => {
            let extents = max / u64::from(extent_bytes);
            u32::try_from(extents.div_ceil(EXTENT_TABLE_ENTRIES_PER_PAGE as u64))
                .ok()
                .filter(|_| extents <= u64::from(u32::MAX))
                .ok_or_else(|| {
                    Error::Invalid(format!("max capacity {max}: more than 2^32 extents"))
                })?
        }
        None => extent_table_pages,
    };
    Ok((map.max(map_pages), et.max(extent_table_pages)))
}

/// Largest logical size, in bytes, the map region of `sb` holds: its pages are laid out at
/// create time, and the regions after them leave no room to add any, so a volume grows in place
/// only into the room its region was made with (format 3, `max_logical_bytes`) and the unused
/// entries of its last map page.
pub fn logical_bytes_max(sb: &Superblock) -> u64 {
    u64::from(sb.map_pages_room) * MAP_ENTRIES_PER_PAGE as u64 * BLOCK_BYTES as u64
}

/// Largest data area, in extents, the extent table of `sb` holds: like the map, its pages are
/// laid out at create time (before the data area), so only the room it was made with and the
/// unused entries of its last page can take new extents.
pub fn extent_count_max(sb: &Superblock) -> u64 {
    u64::from(sb.extent_table_pages_room) * EXTENT_TABLE_ENTRIES_PER_PAGE as u64
}

/// The superblock of `sb` grown to `logical_bytes` and/or a data area of `capacity_bytes`
/// (rounded down to whole extents), or an error naming the limit. Growing changes nothing but
/// these two counts: every region keeps its place, the new map entries and extents are those
/// the last map and extent-table pages hold unused (unmapped, free), so any checkpoint of the
/// volume reads the same under either superblock (docs/format.md, "Growing a volume").
pub fn grow(
    sb: &Superblock,
    logical_bytes: Option<u64>,
    capacity_bytes: Option<u64>,
) -> Result<Superblock> {
    if sb.version < 2 {
        return Err(Error::Invalid(format!(
            "format {} volumes cannot grow (no extent table); copy the data to a new volume",
            sb.version
        )));
    }
    let mut grown = sb.clone();
    if let Some(bytes) = logical_bytes {
        let current = sb.logical_blocks * BLOCK_BYTES as u64;
        let max = logical_bytes_max(sb);
        if !bytes.is_multiple_of(BLOCK_BYTES as u64) {
            return Err(Error::Invalid(format!(
                "size {bytes}: must be a multiple of 4K"
            )));
        }
        if bytes < current {
            return Err(Error::Invalid(format!(
                "size {bytes}: smaller than the volume ({current} bytes); shrinking is not supported"
            )));
        }
        if bytes > max {
            return Err(Error::Invalid(format!(
                "size {bytes}: the map region holds at most {max} bytes ({} pages of {} blocks, \
                 laid out at create time); more needs a volume created with more room \
                 (--max-size; docs/format.md, \"Growing a volume\")",
                sb.map_pages_room, MAP_ENTRIES_PER_PAGE
            )));
        }
        grown.logical_blocks = bytes / BLOCK_BYTES as u64;
        grown.map_pages = grown.logical_blocks.div_ceil(MAP_ENTRIES_PER_PAGE as u64) as u32;
    }
    if let Some(bytes) = capacity_bytes {
        let extents = bytes / u64::from(sb.extent_bytes);
        let max = extent_count_max(sb);
        if extents < u64::from(sb.extent_count) {
            return Err(Error::Invalid(format!(
                "capacity {bytes}: smaller than the data area ({} bytes); shrinking is not \
                 supported",
                u64::from(sb.extent_count) * u64::from(sb.extent_bytes)
            )));
        }
        if extents > max {
            return Err(Error::Invalid(format!(
                "capacity {bytes}: the extent table holds at most {max} extents ({} bytes; {} \
                 pages of {} entries, laid out at create time); more needs a volume created \
                 with more room (--max-capacity; docs/format.md, \"Growing a volume\")",
                max * u64::from(sb.extent_bytes),
                sb.extent_table_pages_room,
                EXTENT_TABLE_ENTRIES_PER_PAGE
            )));
        }
        grown.extent_count = extents as u32;
        grown.extent_table_pages = grown
            .extent_count
            .div_ceil(EXTENT_TABLE_ENTRIES_PER_PAGE as u32);
    }
    // The same checks an open makes: whatever passes here decodes.
    let encoded = grown.encode();
    Superblock::decode(&encoded)?;
    Ok(grown)
}

/// Writes superblock `grown` (a [`grow`]n or [`upgrade`]d one) over `old` on `storage`, which
/// must already be long enough (a file extended and synced first). Crash safety, by the order
/// of the writes:
/// - before copy A is durable, the volume opens as it was (copy A decides, `read_superblock`;
///   the longer file is allowed and unused);
/// - copy A is written and synced alone: torn, its checksum fails and the open falls back to
///   copy B, the old superblock; whole, it is the new one, which the storage already holds;
/// - copy B last: until it is written, a writable open finds it unequal to copy A and rewrites
///   it from A (`recovery::rewrite_superblock`) before writing anything else, so the two never disagree
///   for long and never both break.
///
/// Nothing else changes, and either superblock reads every checkpoint (see [`grow`] and
/// [`upgrade`]): no data is written, so none can be lost.
pub fn write_superblock_update(
    storage: &dyn crate::backend::Storage,
    old: &Superblock,
    grown: &Superblock,
) -> Result<()> {
    let len = storage.len_bytes()?;
    if len < grown.total_bytes() {
        return Err(Error::Invalid(format!(
            "storage has {len} bytes, the grown volume needs {}",
            grown.total_bytes()
        )));
    }
    if crate::recovery::read_superblock(storage)? != *old {
        return Err(Error::Invalid(
            "the volume changed meanwhile (another zbd?); run the command again".into(),
        ));
    }
    let bytes = grown.encode();
    storage.write_at(0, &bytes)?;
    storage.sync()?;
    storage.write_at(SUPERBLOCK_BYTES as u64, &bytes)?;
    storage.sync()?;
    Ok(())
}

/// The superblock of `sb` upgraded to the current format (v2 -> v3: the version alone; v3's
/// layout is v2's and every v2 structure reads as v3), or an error naming why not. Written like
/// a grown one (`write_superblock_update`: copy A, then B) after a clean close; a v2 build that
/// meets the v3 copy A falls back to copy B until B is written, and a v3 build's writable open
/// rewrites B from A before it writes anything (`recovery::rewrite_superblock`), so no seeded
/// item exists while a v2 copy remains.
pub fn upgrade(sb: &Superblock) -> Result<Superblock> {
    match sb.version {
        v if v == FORMAT_VERSION => {
            Err(Error::Invalid(format!("the volume is already format {v}")))
        }
        2 => Ok(Superblock {
            version: FORMAT_VERSION,
            ..sb.clone()
        }),
        v => Err(Error::Invalid(format!(
            "format {v} is not upgraded in place: create a new volume and copy the data \
             (e.g. nbdcopy between the two served volumes)"
        ))),
    }
}

/// Bytes of each dictionary region copy (reserved for trained dictionaries, issue 10): 1/1024
/// of the logical size, at most 1 MiB, in whole 4 KiB pages (none below 4 MiB).
pub fn dictionary_region_bytes(logical_bytes: u64) -> u32 {
    let b = (logical_bytes / 1024).min(1 << 20);
    (b - b % BLOCK_BYTES as u64) as u32
}

/// Parses a size with an optional K/M/G/T suffix (binary units), e.g. `32K`, `1G`, `4096`.
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().last()? {
        (i, c) if c.is_ascii_alphabetic() => {
            let m: u64 = match c.to_ascii_uppercase() {
                'K' => 1 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'T' => 1 << 40,
                _ => return None,
            };
            (&s[..i], m)
        }
        _ => (s, 1),
    };
    let num = num.strip_suffix(['i', 'I']).unwrap_or(num);
    num.parse::<u64>().ok()?.checked_mul(mult)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("32K"), Some(32768));
        assert_eq!(parse_size("1g"), Some(1 << 30));
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("12Q"), None);
        assert_eq!(parse_size("-1"), None);
    }

    /// Whatever device a volume is opened on, one raw block and the largest unit its create
    /// accepts fit an empty extent in the widest form it may write (review 14: 8 KiB extents
    /// in the 4 KiB form held no raw block, and the write panicked).
    #[test]
    fn a_raw_block_and_the_largest_unit_fit_an_empty_extent_in_every_form() {
        for flags in [0, CKPT_FLAG_V3_SEGMENTS] {
            for e in (13..=20).map(|s| 1u32 << s) {
                for align in [SECTOR_BYTES, 4096] {
                    let form = SegmentForm::for_volume(FORMAT_VERSION, flags, align, e);
                    let n = usize::from(unit_blocks_max(e, SegmentForm::widest(3, flags, e)));
                    for (payload, records) in
                        [(BLOCK_BYTES, 1), (n * BLOCK_BYTES - SECTOR_BYTES, n)]
                    {
                        assert!(
                            form.padded_len(payload, records) <= u64::from(e),
                            "{form:?}, extent {e}: {payload} bytes in {records} records"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn default_capacity_holds_incompressible_data() {
        // With bit 11, in the 4 KiB form a 16 KiB extent holds 2 raw blocks, not 3 (review 14).
        for metadata_pages in [false, true] {
            for e in [8192u32, 16384, 32768, 1 << 20] {
                let opts = CreateOptions {
                    extent_bytes: e,
                    metadata_pages,
                    ..CreateOptions::new(64 << 20)
                };
                let sb = plan(&opts).expect("plan");
                let raw = u64::from(sb.extent_count) * raw_blocks_per_extent(e, widest_form(&opts));
                assert!(
                    raw >= sb.logical_blocks,
                    "extent {e}, bit 11 {metadata_pages}"
                );
            }
        }
        assert!(plan(&CreateOptions {
            extent_bytes: 3000,
            ..CreateOptions::new(1 << 20)
        })
        .is_err());
    }

    #[test]
    fn unit_size_defaults_to_8k_and_must_fit_the_extent() {
        let unit = |e: u32, u: Option<u32>| {
            plan(&CreateOptions {
                extent_bytes: e,
                unit_bytes: u,
                ..CreateOptions::new(4 << 20)
            })
            .map(|sb| sb.unit_blocks)
        };
        assert_eq!(unit(32768, None).ok(), Some(2));
        assert_eq!(unit(8192, None).ok(), Some(2));
        assert_eq!(unit(32768, Some(16384)).ok(), Some(4));
        assert_eq!(unit(131072, Some(65536)).ok(), Some(16));
        assert_eq!(unit(32768, Some(4096)).ok(), Some(1));
        let e = unit(32768, Some(65536)).expect_err("64K units in 32K extents");
        assert!(e.to_string().contains("does not fit"), "{e}");
        assert!(unit(32768, Some(12288)).is_err());
        assert!(unit(1 << 20, Some(128 << 10)).is_err());
    }
}
