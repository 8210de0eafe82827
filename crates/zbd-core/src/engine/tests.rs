//! The extent buffer under the engine: LRU eviction after range records.

use super::*;
use crate::backend::sim::SimStorage;
use crate::buffer::Prepared;
use crate::codec;
use crate::format::RecordKind;
use crate::layout::{plan, CreateOptions};
use crate::map::VolumeMap;

fn raw_block(n: usize) -> Prepared {
    Prepared::Data {
        codec: codec::id::RAW,
        bytes: vec![0x5a; n],
        crc: 0,
        seeded: false,
        blocks: 1,
        dict: 0,
        fingerprints: [0; 16],
    }
}

/// A volume made with `opts` on a simulated disk of its size, opened with `open` without the
/// background cleaner.
fn sim_inner(opts: &CreateOptions, open: OpenOptions) -> Inner {
    let sb = plan(opts).expect("plan");
    let open = OpenOptions {
        background_cleaner: false,
        ..open
    };
    Inner::create_with(
        Box::new(SimStorage::new(sb.total_bytes() as usize)),
        opts,
        open,
    )
    .expect("create")
}

/// A volume keeps the pair-state list capacity it was created with across opens: one made
/// with the 4,096 of volumes created before 6349d060 (a test option) reopens with 4,096, one
/// made by default with the floor of 16,384.
#[test]
fn a_volume_reopens_with_the_list_capacity_it_was_created_with() {
    for (asked, want) in [(Some(4096), 4096), (None, 16_384)] {
        let opts = CreateOptions {
            list_capacity: asked,
            metadata_pages: true,
            capacity_bytes: Some(64 << 20),
            ..CreateOptions::new(256 << 20)
        };
        let sb = plan(&opts).expect("plan");
        let disk = std::sync::Arc::new(SimStorage::new(sb.total_bytes() as usize));
        let open = OpenOptions {
            background_cleaner: false,
            ..OpenOptions::default()
        };
        let capacity = |vol: &Inner| match &vol.state.lock().map {
            VolumeMap::Tree(t) => t.list_capacity(),
            VolumeMap::Pages(_) => panic!("created without metadata pages"),
        };
        let vol = Inner::create_with(Box::new(std::sync::Arc::clone(&disk)), &opts, open.clone())
            .expect("create");
        assert_eq!(capacity(&vol), want, "created with {asked:?}");
        vol.close().expect("close");
        let vol = Inner::open(Box::new(disk), open).expect("reopen");
        assert_eq!(capacity(&vol), want, "reopened, created with {asked:?}");
    }
}

/// The extent buffer evicts the least recently appended extent. Here extent X took a trim
/// record after Y took its last block: Y goes, X stays (`last_used` of a data append and of
/// a range record must count alike, or the two tie and the first in `open` goes).
#[test]
fn lru_eviction_keeps_the_extent_a_range_record_went_to_last() {
    let opts = CreateOptions {
        extent_bytes: 16 * 1024,
        codec: Codec::None,
        unit_bytes: Some(4096),
        dictionary: false,
        ..CreateOptions::new(4 << 20)
    };
    let vol = sim_inner(&opts, OpenOptions::default());
    let cx = vol.ctx();
    let mut st = vol.state.lock();
    st.buffer.config_mut().max_open = 2;
    // X (open[0]) is filled most of the way; Y (open[1]) takes a block X has no room for.
    st.put_block(&cx, 0, &raw_block(12_000)).expect("put X");
    st.put_block(&cx, 1, &raw_block(4_500)).expect("put Y");
    assert_eq!(st.buffer.len(), 2);
    let (x, y) = (st.buffer.get(0).extent, st.buffer.get(1).extent);
    // Best fit puts the trim record in X, the fuller: X is now the most recently used.
    st.put_range(&cx, RecordKind::Trim, 100, 1).expect("trim");
    assert_eq!(
        st.buffer.get(0).records.last().map(|r| r.kind),
        Some(RecordKind::Trim)
    );
    // Fits neither: the least recently used, Y, is closed for it.
    st.put_block(&cx, 2, &raw_block(12_000)).expect("put");
    let open: Vec<u32> = st.buffer.iter().map(|o| o.extent).collect();
    assert!(
        open.contains(&x) && !open.contains(&y),
        "evicted the extent used last: open {open:?}, x {x}, y {y}"
    );
}

/// Log-like text (what a dictionary pays on), `len` bytes, varied by `seed`.
fn log_text(seed: u64, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 100);
    let mut i = seed;
    while out.len() < len {
        i = i
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let line = format!(
            "2026-11-27T10:{:02}:{:02} host{} zbd[{}]: request {} served in {} us\n",
            (i >> 8) % 60,
            (i >> 16) % 60,
            (i >> 24) % 4,
            (i >> 32) % 1000,
            (i >> 40) % 100_000,
            (i >> 48) % 5000
        );
        out.extend_from_slice(line.as_bytes());
    }
    out.truncate(len);
    out
}

/// Issue 26: a writer checks that the dictionary its block was compressed with is still
/// listed (`Inner::listed`), then places the block; placing it may open an extent, and opening
/// one may write a checkpoint (the allocation queue ran dry, or `make_space`). That checkpoint
/// must not retire the dictionary: no mapped block names it yet (the block's last version
/// moved to the newer one), but the block about to be mapped does. Retired, the next
/// checkpoint unloaded it and the block read as corrupt for ever.
#[test]
fn a_checkpoint_while_a_block_is_placed_keeps_the_dictionary_it_names() {
    let opts = CreateOptions {
        extent_bytes: 16 * 1024,
        codec: Codec::Lz4,
        unit_bytes: Some(4096),
        dictionary: true,
        ..CreateOptions::new(32 << 20)
    };
    let open_opts = OpenOptions {
        dictionary: Some(true),
        ..OpenOptions::default()
    };
    let vol = sim_inner(&opts, open_opts);
    assert!(vol
        .install_dictionary(log_text(1, 4096))
        .expect("install A"));
    let block = log_text(2, BLOCK_BYTES);
    // Compressed with A outside the lock, as a writer does.
    let p = vol.prepare(&block);
    let a = match &p {
        Prepared::Data { dict, .. } => *dict,
        Prepared::Zero => 0,
    };
    assert_ne!(a, 0, "the block was compressed with A");
    // B serves new blocks now; A is listed, and no block names it.
    assert!(vol
        .install_dictionary(log_text(3, 4096))
        .expect("install B"));
    let cx = vol.ctx();
    {
        let mut st = vol.state.lock();
        assert!(
            st.lists_dict(a),
            "A is still listed: the writer keeps its block"
        );
        // No open extent and an empty allocation queue: placing the block opens an extent,
        // and taking one writes a checkpoint (`State::alloc`).
        for i in (0..st.buffer.len()).rev() {
            st.close_open(&cx, i).expect("close");
        }
        while let Some(q) = st.queue.pop_front() {
            st.free.push_back(q.extent);
        }
        st.put_block(&cx, 0, &p).expect("put");
        // The checkpoints after it would unload a dictionary retired under the block.
        st.checkpoint(&cx).expect("checkpoint");
        st.checkpoint(&cx).expect("checkpoint");
    }
    let mut got = vec![0u8; BLOCK_BYTES];
    vol.read(crate::format::DEFAULT_DEVICE, 0, &mut got)
        .expect("the block reads");
    assert!(got == block, "the block reads back its data");
}

/// Review 4: after every operation, the free list, the allocation queue and the open
/// extents are disjoint, hold no duplicate, every free or queued extent is Free in the
/// extent table, and together they are every Free extent.
fn review4_invariants(vol: &Inner, ctx: &str) {
    use crate::extents::ExtentState;
    let st = vol.state.lock();
    let mut seen = std::collections::HashMap::new();
    for e in st.free.iter() {
        assert!(
            seen.insert(e, "free").is_none(),
            "{ctx}: {e} twice in the free list"
        );
        assert_eq!(
            st.extents.get(e).state(),
            ExtentState::Free,
            "{ctx}: free {e}"
        );
    }
    for q in st.queue.iter() {
        if let Some(w) = seen.insert(q.extent, "queue") {
            panic!("{ctx}: queued extent {} also in {w}", q.extent);
        }
        assert_eq!(
            st.extents.get(q.extent).state(),
            ExtentState::Free,
            "{ctx}: queued {}",
            q.extent
        );
    }
    for o in st.buffer.iter() {
        if let Some(w) = seen.insert(o.extent, "open") {
            panic!("{ctx}: open extent {} also in {w}", o.extent);
        }
    }
    assert_eq!(
        st.free.len() + st.queue.len(),
        st.extents.count(ExtentState::Free),
        "{ctx}: free list + queue vs table"
    );
}

fn review4_run(queue_len: u32, extent: u32, capacity_factor: u64, stock: Option<u32>, seed: u64) {
    use rand::{Rng, SeedableRng};
    const SIZE: u64 = 8 << 20;
    let opts = CreateOptions {
        extent_bytes: extent,
        codec: Codec::Lz4,
        capacity_bytes: Some(SIZE * capacity_factor),
        queue_len: Some(queue_len),
        metadata_pages: true,
        metadata_stock_extents: stock,
        format_version: crate::format::FORMAT_VERSION,
        ..CreateOptions::new(SIZE)
    };
    let vol = sim_inner(&opts, OpenOptions::default());
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    let dev = crate::format::DEFAULT_DEVICE;
    let mut snaps = 0;
    for step in 0..3000 {
        let ctx = format!("q{queue_len} step {step}");
        let r: u32 = rng.random_range(0..100);
        let res = if r < 80 {
            let blocks = rng.random_range(1..64u64);
            let at = rng.random_range(0..SIZE / 4096 - blocks);
            let mut data = vec![0u8; (blocks * 4096) as usize];
            for c in data.chunks_mut(4096) {
                rng.fill(&mut c[..1500]);
            }
            vol.write(dev, at * 4096, &data, false)
        } else if r < 90 {
            let blocks = rng.random_range(1..512u64);
            let at = rng.random_range(0..SIZE / 4096 - blocks);
            vol.trim(dev, at * 4096, blocks * 4096)
        } else if r < 93 && snaps < 6 {
            snaps += 1;
            vol.snapshot("default", &format!("s{snaps}")).map(|_| ())
        } else {
            vol.flush()
        };
        match res {
            Ok(()) | Err(Error::NoSpace) => {}
            Err(e) => panic!("{ctx}: {e}"),
        }
        review4_invariants(&vol, &ctx);
    }
    let r = vol.check(&|_, _| {});
    assert!(r.metadata_problems.is_empty(), "{:?}", r.metadata_problems);
}

#[test]
fn review4_free_list_queue_and_table_agree() {
    for (q, ext, cap, stock, seed) in [
        (6, 65536, 2, None, 1),
        (64, 65536, 2, Some(1), 2),
        (3, 16384, 3, Some(1), 3),
        (200, 16384, 3, None, 4),
    ] {
        review4_run(q, ext, cap, stock, seed);
    }
}
