//! The volume list, `/etc/zbd/volumes`: what `zbd@NAME.service` serves and
//! `zbd-attach@NAME.service` attaches at boot, in the manner of crypttab and rbdmap.
//!
//! One volume per line, fields separated by blanks, `#` starts a comment:
//!
//! ```text
//! # NAME  VOLUME                   OPTIONS (comma-separated, optional)
//! db      /srv/zbd/db.zbd          map-cache=128M,metrics=9310
//! backup  rados:zbd/backup         read-only,attach=no
//! ```
//!
//! NAME is `[A-Za-z0-9_.-]+` (it is a systemd instance name and a file name). OPTIONS are
//! `zbd serve` flags without their dashes (`key=value` or a bare `key`), plus `attach=yes|no`
//! (default yes: whether `zbd-attach@NAME` makes a block device; read by attach only). The
//! socket defaults to `/run/zbd/NAME.sock`, so the attach unit finds it by name alone.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

/// Where the units read the list unless `--list` says otherwise.
pub const DEFAULT_LIST: &str = "/etc/zbd/volumes";

/// Longest list file read: a list is a few lines, anything bigger is not one.
const LIST_BYTES_MAX: u64 = 1 << 20;

/// One line of the list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub name: String,
    pub volume: String,
    /// `(key, value)` in the order written; a bare key has no value.
    pub options: Vec<(String, Option<String>)>,
    /// Where it was read, `FILE:LINE`, for errors.
    pub origin: String,
}

impl Entry {
    pub fn option(&self, key: &str) -> Option<Option<&str>> {
        self.options
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_deref())
    }

    /// The NBD socket: `socket=` or `/run/zbd/NAME.sock`.
    pub fn socket(&self) -> PathBuf {
        match self.option("socket") {
            Some(Some(socket)) => PathBuf::from(socket),
            _ => Path::new(crate::commands::serve::RUN_DIR).join(format!("{}.sock", self.name)),
        }
    }

    /// Whether `zbd-attach@NAME` attaches it (`attach=no` opts out).
    pub fn attach(&self) -> Result<bool> {
        match self.option("attach") {
            None | Some(None) | Some(Some("yes")) => Ok(true),
            Some(Some("no")) => Ok(false),
            Some(Some(other)) => bail!("{}: attach={other}: expected yes or no", self.origin),
        }
    }

    /// `zbd serve` arguments for this entry (after the program name and `serve`).
    pub fn serve_args(&self) -> Vec<OsString> {
        let mut args = vec![OsString::from(&self.volume)];
        let has_address = self.option("socket").is_some() || self.option("listen").is_some();
        if !has_address {
            args.push("--socket".into());
            args.push(self.socket().into_os_string());
        }
        for (key, value) in &self.options {
            if key == "attach" {
                continue;
            }
            args.push(format!("--{key}").into());
            if let Some(value) = value {
                args.push(value.into());
            }
        }
        args
    }
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
        && name != "."
        && name != ".."
}

/// Parses the list's text; `file` names it in errors.
pub fn parse(text: &str, file: &Path) -> Result<Vec<Entry>> {
    let mut entries: Vec<Entry> = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let origin = format!("{}:{}", file.display(), index + 1);
        let line = line.split('#').next().unwrap_or_default().trim();
        if line.is_empty() {
            continue;
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (name, volume, options) = match fields.as_slice() {
            [name, volume] => (*name, *volume, ""),
            [name, volume, options] => (*name, *volume, *options),
            _ => bail!("{origin}: expected NAME VOLUME [OPTIONS], got {line:?}"),
        };
        if !valid_name(name) {
            bail!("{origin}: name {name:?}: use letters, digits, '_', '.' and '-'");
        }
        if entries.iter().any(|e| e.name == name) {
            bail!("{origin}: {name} is listed twice");
        }
        let options = options
            .split(',')
            .filter(|o| !o.is_empty())
            .map(|o| match o.split_once('=') {
                Some((k, v)) => (k.to_string(), Some(v.to_string())),
                None => (o.to_string(), None),
            })
            .collect();
        entries.push(Entry {
            name: name.to_string(),
            volume: volume.to_string(),
            options,
            origin,
        });
    }
    Ok(entries)
}

/// The entry `name` of the list in `file`.
pub fn find(file: &Path, name: &str) -> Result<Entry> {
    let meta = std::fs::metadata(file)
        .with_context(|| format!("cannot read volume list {}", file.display()))?;
    if meta.len() > LIST_BYTES_MAX {
        bail!("{}: larger than 1 MiB, not a volume list", file.display());
    }
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("cannot read volume list {}", file.display()))?;
    parse(&text, file)?
        .into_iter()
        .find(|e| e.name == name)
        .with_context(|| format!("{}: no volume named {name:?}", file.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_names_volumes_and_options() {
        let text = "# comment\n\ndb /srv/db.zbd map-cache=128M,read-only # why\n\
                    b2 rados:pool/b2\n";
        let entries = parse(text, Path::new("volumes")).expect("parse");
        assert_eq!(entries.len(), 2);
        let db = &entries[0];
        assert_eq!(db.origin, "volumes:3");
        assert_eq!(db.option("map-cache"), Some(Some("128M")));
        assert_eq!(db.option("read-only"), Some(None));
        assert_eq!(
            db.serve_args(),
            [
                "/srv/db.zbd",
                "--socket",
                "/run/zbd/db.sock",
                "--map-cache",
                "128M",
                "--read-only"
            ]
            .map(OsString::from)
        );
        assert!(entries[1].attach().expect("attach"));
    }

    #[test]
    fn refuses_bad_lines_naming_them() {
        for (text, said) in [
            ("db\n", "volumes:1: expected NAME VOLUME"),
            ("a/b v\n", "volumes:1: name \"a/b\""),
            ("a v\na w\n", "volumes:2: a is listed twice"),
            ("a v x y\n", "volumes:1: expected"),
        ] {
            let error = parse(text, Path::new("volumes")).expect_err(text);
            assert!(error.to_string().contains(said), "{error}");
        }
    }
}
