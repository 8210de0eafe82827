//! A volume's devices over NBD (design.md, "Devices"): `zbd device create` adds one, `zbd serve`
//! offers it by name beside the default export, each export keeps its own bytes through a
//! restart, and `zbd device delete` removes it.

use crate::nbd_support::*;
use std::process::Command;
use zbd_testkit::nbd::Client;

fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

fn device_names(volume: &std::path::Path) -> Vec<String> {
    let out = stdout(&run(Command::new(ZBD)
        .args(["device", "list", "--json"])
        .arg(volume)));
    let list: serde_json::Value = serde_json::from_str(&out).expect("json");
    list.as_array()
        .expect("a list")
        .iter()
        .map(|d| d["name"].as_str().expect("name").to_owned())
        .collect()
}

#[test]
fn devices_are_served_by_name_and_keep_their_own_bytes() {
    if tools(&["nbdinfo", "nbdcopy"]).is_none() {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let volume = dir.path().join("vol.zbd");
    run(Command::new(ZBD)
        .arg("create")
        .arg(&volume)
        .args(["--size", "16M", "--metadata-pages"]));
    run(Command::new(ZBD)
        .args(["device", "create"])
        .arg(&volume)
        .args(["vm1", "--size", "8M"]));
    assert_eq!(device_names(&volume), ["default", "vm1"]);

    let default_data = bytes(1, 4 << 20);
    let vm1_data = bytes(2, 8 << 20);
    let (in_default, in_vm1) = (dir.path().join("default.in"), dir.path().join("vm1.in"));
    std::fs::write(&in_default, &default_data).expect("write");
    std::fs::write(&in_vm1, &vm1_data).expect("write");
    let uri = |served: &Served, name: &str| {
        format!("nbd+unix:///{name}?socket={}", served.socket.display())
    };
    let mut served = Served::start(&volume, dir.path());
    let listed = stdout(&run(Command::new("nbdinfo")
        .arg("--list")
        .arg(served.uri())));
    assert!(listed.contains("export=\"vm1\""), "{listed}");
    assert_eq!(
        stdout(&run(Command::new("nbdinfo")
            .arg("--size")
            .arg(uri(&served, "vm1"))))
        .trim(),
        (8u64 << 20).to_string()
    );
    run(Command::new("nbdcopy")
        .arg(&in_default)
        .arg(uri(&served, "")));
    run(Command::new("nbdcopy")
        .arg(&in_vm1)
        .arg(uri(&served, "vm1")));
    assert!(served.stop(), "zbd serve exits 0 on SIGTERM");

    // After a restart each export reads its own bytes.
    let served = Served::start(&volume, dir.path());
    let out = dir.path().join("out");
    run(Command::new("nbdcopy").arg(uri(&served, "vm1")).arg(&out));
    assert!(
        std::fs::read(&out).expect("read") == vm1_data,
        "vm1 reads its bytes"
    );
    run(Command::new("nbdcopy").arg(uri(&served, "")).arg(&out));
    let got = std::fs::read(&out).expect("read");
    assert!(
        got[..default_data.len()] == default_data[..],
        "default reads its bytes"
    );
    let missing = Command::new("nbdinfo")
        .arg(uri(&served, "nobody"))
        .output()
        .expect("nbdinfo");
    assert!(!missing.status.success(), "no export named nobody");

    // On the served volume, through its control socket: a new device is served at once, and
    // one a client has open is not deleted until the client goes.
    run(Command::new(ZBD)
        .args(["device", "create"])
        .arg(&volume)
        .args(["vm2", "--size", "4M"]));
    assert_eq!(device_names(&volume), ["default", "vm1", "vm2"]);
    let mut client = Client::connect_to(&served.socket, "vm2").expect("connect to vm2");
    assert_eq!(client.size, 4 << 20);
    client.write(0, &bytes(3, 64 << 10), false).expect("write");
    client.flush().expect("flush");
    let refused = Command::new(ZBD)
        .args(["device", "delete"])
        .arg(&volume)
        .arg("vm2")
        .output()
        .expect("zbd device delete");
    assert!(!refused.status.success(), "deleted under a client");
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(said.contains("open by 1 NBD connection"), "{said}");
    drop(client);
    wait_until("the delete once the client is gone", || {
        Command::new(ZBD)
            .args(["device", "delete"])
            .arg(&volume)
            .arg("vm2")
            .output()
            .expect("zbd device delete")
            .status
            .success()
    });
    assert_eq!(device_names(&volume), ["default", "vm1"]);
    drop(served);

    run(Command::new(ZBD).arg("check").arg(&volume));
    let stat: serde_json::Value = serde_json::from_str(&stdout(&run(Command::new(ZBD)
        .arg("stat")
        .arg(&volume)
        .arg("--json"))))
    .expect("json");
    assert_eq!(stat["devices"][1]["name"], "vm1", "{stat}");
    run(Command::new(ZBD)
        .args(["device", "delete"])
        .arg(&volume)
        .arg("vm1"));
    assert_eq!(device_names(&volume), ["default"]);
    run(Command::new(ZBD).arg("check").arg(&volume));
}
