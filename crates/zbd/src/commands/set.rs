//! `zbd set VOLUME KEY=VALUE...`: change what opens of a volume do by default (its settings in
//! the superblock), offline, as `zbd create` chose them: `dedup=on|off`, `dict=on|off`.

use crate::target::CephArgs;
use anyhow::{anyhow, bail, Result};
use std::path::PathBuf;
use std::process::ExitCode;
use zbd_core::format::{SB_SETTING_DEDUP, SB_SETTING_DICTIONARY};

/// Arguments of `zbd set`.
#[derive(clap::Args)]
pub struct Args {
    /// Volume file, block device or rados:POOL/NAME (not in use).
    path: PathBuf,
    /// Settings to change: dedup=on|off (inline deduplication; metadata pages only),
    /// dict=on|off (trained dictionaries). `zbd serve --dedup` / `--dict` still override them
    /// for one open.
    #[arg(required = true)]
    settings: Vec<String>,
    #[command(flatten)]
    ceph: CephArgs,
}

/// The settings word `settings` with each `KEY=VALUE` of `changes` applied.
fn apply(mut settings: u32, changes: &[String]) -> Result<u32> {
    for change in changes {
        let (key, value) = change
            .split_once('=')
            .ok_or_else(|| anyhow!("'{change}': expected KEY=VALUE, e.g. dedup=on"))?;
        let bit = match key {
            "dedup" => SB_SETTING_DEDUP,
            "dict" => SB_SETTING_DICTIONARY,
            _ => bail!("'{change}': unknown setting '{key}' (dedup, dict)"),
        };
        match value {
            "on" => settings |= bit,
            "off" => settings &= !bit,
            _ => bail!("'{change}': expected on or off"),
        }
    }
    Ok(settings)
}

pub fn run(a: Args) -> Result<ExitCode> {
    let (target, vol) = super::open_offline(&a.path, &a.ceph)?;
    let settings = apply(vol.superblock().settings, &a.settings)?;
    let sb = vol
        .close_with_settings(settings)
        .map_err(|e| anyhow!("{target}: {e}"))?;
    let on = |bit: u32| if sb.settings & bit != 0 { "on" } else { "off" };
    println!(
        "{target}: dedup {}, dict {} (what opens do unless zbd serve says otherwise)",
        on(SB_SETTING_DEDUP),
        on(SB_SETTING_DICTIONARY)
    );
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_apply_in_order_and_bad_ones_name_the_problem() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(
            apply(0, &s(&["dedup=on"])).expect("valid"),
            SB_SETTING_DEDUP
        );
        assert_eq!(
            apply(SB_SETTING_DEDUP | SB_SETTING_DICTIONARY, &s(&["dict=off"])).expect("valid"),
            SB_SETTING_DEDUP
        );
        for (bad, says) in [
            ("dedup", "expected KEY=VALUE"),
            ("compression=on", "unknown setting 'compression'"),
            ("dedup=yes", "expected on or off"),
        ] {
            let e = apply(0, &s(&[bad])).expect_err("refused").to_string();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
