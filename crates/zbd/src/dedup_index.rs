//! The inline dedup index across opens: a clean close of a volume file served or written with
//! dedup on leaves its index beside it (`VOLUME.dedup-index`), and the next open with the same
//! `--dedup-index` budget starts from it, so copies of data written before a restart are found
//! as copies of data written since are (issue 27). The index holds hints only: every candidate
//! is compared byte for byte before a block is shared, so a stale, lost or refused image costs
//! missed duplicates, never data. Hence every failure here is a warning, never an error.
//!
//! Only volume files have one: a block device has no place beside it that is ours, and a RADOS
//! volume's index starts empty at each open.

use std::path::{Path, PathBuf};
use zbd_core::Volume;

/// Where the index of the volume at `file` is kept, if it can have one (a regular file; `None`:
/// not a file, e.g. a RADOS volume).
pub fn path(file: Option<&Path>) -> Option<PathBuf> {
    let file = file?;
    if !std::fs::metadata(file).is_ok_and(|m| m.is_file()) {
        return None;
    }
    let mut name = file.as_os_str().to_owned();
    name.push(".dedup-index");
    Some(PathBuf::from(name))
}

/// Starts `volume`'s dedup index from the image beside it, if there is one and dedup is on in
/// this open; says what it did in the log.
pub fn restore(volume: &Volume, file: Option<&Path>) {
    let Some(path) = path(file) else { return };
    if volume.stats().dedup_index.is_none() {
        return;
    }
    let image = match std::fs::read(&path) {
        Ok(image) => image,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
        Err(e) => {
            crate::log::line(format!(
                "zbd: warning: cannot read {} ({e}): the dedup index starts empty",
                path.display()
            ));
            return;
        }
    };
    match volume.restore_dedup_index(&image) {
        Ok(hooks) => crate::log::line(format!(
            "zbd: dedup index restored from {} ({hooks} hooks)",
            path.display()
        )),
        Err(why) => crate::log::line(format!(
            "zbd: warning: {} not used ({why}): the dedup index starts empty",
            path.display()
        )),
    }
}

/// Keeps `volume`'s dedup index beside it for the next open (after a clean close; dedup on).
/// Written to a temporary name and renamed, so a crash leaves the old image or the new one.
pub fn save(volume: &Volume, file: Option<&Path>) {
    let Some(path) = path(file) else { return };
    let Some(image) = volume.dedup_index_image() else {
        return;
    };
    let mut tmp = path.clone().into_os_string();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let written = std::fs::write(&tmp, &image).and_then(|()| std::fs::rename(&tmp, &path));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        crate::log::line(format!(
            "zbd: warning: cannot keep the dedup index in {} ({e}): the next open starts \
             with an empty one",
            path.display()
        ));
    }
}
