//! The extent buffer under the engine: LRU eviction after range records.

use super::*;
use crate::backend::sim::SimStorage;
use crate::buffer::Prepared;
use crate::codec;
use crate::format::RecordKind;
use crate::layout::{plan, CreateOptions};

fn raw_block(n: usize) -> Prepared {
    Prepared::Data {
        codec: codec::id::RAW,
        bytes: vec![0x5a; n],
        crc: 0,
        seeded: false,
        blocks: 1,
        dict: 0,
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
    let sb = plan(&opts).expect("plan");
    let open_opts = OpenOptions {
        background_cleaner: false,
        ..OpenOptions::default()
    };
    let vol = Inner::create_with(
        Box::new(SimStorage::new(sb.total_bytes() as usize)),
        &opts,
        open_opts,
    )
    .expect("create");
    let cx = vol.ctx();
    let mut st = vol.state.lock();
    st.buffer.config_mut().max_open = 2;
    // X (open[0]) is filled most of the way; Y (open[1]) takes a block X has no room for.
    st.put_block(&cx, 0, raw_block(12_000)).expect("put X");
    st.put_block(&cx, 1, raw_block(4_500)).expect("put Y");
    assert_eq!(st.buffer.len(), 2);
    let (x, y) = (st.buffer.get(0).extent, st.buffer.get(1).extent);
    // Best fit puts the trim record in X, the fuller: X is now the most recently used.
    st.put_range(&cx, RecordKind::Trim, 100, 1).expect("trim");
    assert_eq!(
        st.buffer.get(0).records.last().map(|r| r.kind),
        Some(RecordKind::Trim)
    );
    // Fits neither: the least recently used, Y, is closed for it.
    st.put_block(&cx, 2, raw_block(12_000)).expect("put");
    let open: Vec<u32> = st.buffer.iter().map(|o| o.extent).collect();
    assert!(
        open.contains(&x) && !open.contains(&y),
        "evicted the extent used last: open {open:?}, x {x}, y {y}"
    );
}
