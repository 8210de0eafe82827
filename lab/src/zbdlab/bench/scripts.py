"""The groups that are not same-run ratios: zbd's built-in benchmarks and the scripts under scripts/.

Each runs its tool with the raw directory as its output directory (bench/raw/<run>/<group>/, ignored
by git) and hands back what a reader needs: Markdown lines for summary.md and the small summary the
tool itself writes (JSON, or tab-separated tables turned into rows) for figures.json. Which file is
the summary is each tool's own convention, named below; the rest of what it wrote stays raw.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from zbdlab.app import HostError
from zbdlab.bench.settings import Settings

Result = tuple[list[str], dict[str, Any]]  # summary lines, data for figures.json
TERMINATE_WAIT_S = 120  # for a script's cleanup (servers, mounts, a Ceph cluster) after SIGTERM
LOG_TAIL_LINES = 3  # of a failed tool's log, quoted in the error


def run_tool(
    argv: list[str],
    log: Path,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    progress: Callable[[str], None] | None = None,
) -> str:
    """Runs `argv`, its stdout line by line into `log` (and `progress`), its stderr into `log` too;
    returns its stdout. A failure names the log and quotes its last lines."""
    kept: list[str] = []
    with log.open("w") as sink:
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=sink, text=True, env={**os.environ, **(env or {})}, cwd=cwd
        )
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                sink.write(line)
                sink.flush()
                kept.append(line)
                if progress:
                    progress(line.rstrip())
            code = proc.wait()
        except BaseException:  # interrupted: the script's own EXIT trap undoes what it set up
            proc.terminate()
            proc.wait(timeout=TERMINATE_WAIT_S)
            raise
    if code != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-LOG_TAIL_LINES:]
        raise HostError(f"{' '.join(argv[:3])} exited {code} (log: {log}): " + " / ".join(tail))
    return "".join(kept)


def fenced(title: str, text: str) -> list[str]:
    return [f"### {title}", "", "```", *text.rstrip().splitlines(), "```", ""]


def demoted(markdown: str) -> list[str]:
    """A tool's own Markdown summary under a group heading: its title dropped, headings one level down."""
    lines = markdown.rstrip().splitlines()
    if lines and lines[0].startswith("# "):
        lines = lines[1:]
    return ["#" + line if line.startswith("#") else line for line in lines]


def tsv_rows(path: Path) -> list[dict[str, str]]:
    if not path.exists():
        return []
    with path.open() as f:
        return list(csv.DictReader(f, delimiter="\t"))


def builtin(zbd: str, repo: Path, settings: Settings, raw: Path) -> Result:
    """`zbd bench codec` (the built-in mixed sample), `engine` (write amplification of 4 KiB write +
    flush) and `cleaner` (random overwrites at 50/75/90 % live)."""
    runs = [
        ("codec", "codec cost on 4 KiB blocks (`zbd bench codec`)", ["codec"]),
        ("engine", "write amplification (`zbd bench engine --size 256M`)", ["engine", "--size", "256M"]),
        (
            "cleaner",
            "cleaner (`zbd bench cleaner --capacity 64M --factor 4`)",
            ["cleaner", "--capacity", "64M", "--factor", "4", "--csv", str(raw / "cleaner-series.csv")],
        ),
    ]
    lines: list[str] = []
    data: dict[str, Any] = {}
    for name, title, args in runs:
        text = run_tool([zbd, "bench", *args], raw / f"{name}.txt", progress=settings.progress)
        lines += fenced(title, text)
        data[name] = text.rstrip().splitlines()
    return lines, data


def scale(zbd: str, repo: Path, settings: Settings, raw: Path) -> Result:
    """scripts/bench-scale.sh: its log, scale.txt, is the summary (one line per measurement)."""
    env = {"ZBD_BIN": zbd, **({"QUICK": "1"} if settings.short else {})}
    run_tool(
        ["bash", str(repo / "scripts" / "bench-scale.sh"), str(raw)],
        raw / "log.txt",
        env,
        repo,
        settings.progress,
    )
    measured = (raw / "scale.txt").read_text().strip().splitlines()
    return [f"- {line}" for line in measured] + [""], {"lines": measured}


def latency(zbd: str, repo: Path, settings: Settings, raw: Path) -> Result:
    """scripts/bench-latency.sh (this binary, and --base-zbd if given): latency.md and latency.json."""
    argv = ["bash", str(repo / "scripts" / "bench-latency.sh"), str(raw)]
    argv += [settings.base_zbd] if settings.base_zbd else []
    env = {"ZBD_BIN": zbd, "LAT_DIR": str(settings.work_dir)}
    run_tool(argv, raw / "log.txt", env, repo, settings.progress)
    return demoted((raw / "latency.md").read_text()) + [""], json.loads((raw / "latency.json").read_text())


def metrics(zbd: str, repo: Path, settings: Settings, raw: Path) -> Result:
    """scripts/bench-metrics.sh: metrics.md and metrics.json (IOPS with and without the endpoint)."""
    env = {
        "ZBD_BIN": zbd,
        "MET_DIR": str(settings.work_dir),
        **({"MET_ROUNDS": "3"} if settings.short else {}),
    }
    run_tool(
        ["bash", str(repo / "scripts" / "bench-metrics.sh"), str(raw)],
        raw / "log.txt",
        env,
        repo,
        settings.progress,
    )
    return demoted((raw / "metrics.md").read_text()) + [""], json.loads((raw / "metrics.json").read_text())


def savings(zbd: str, repo: Path, settings: Settings, raw: Path) -> Result:
    """scripts/bench-savings.sh: summary.md (scripts/savings_project.py), space.tsv and read.tsv."""
    env = {
        "ZBD_BIN": zbd,
        "SAVINGS_ZFS": os.environ.get("SAVINGS_ZFS", "1"),
        "SAVINGS_UNITS": os.environ.get("SAVINGS_UNITS", "4K 8K 16K"),
    }
    run_tool(
        ["bash", str(repo / "scripts" / "bench-savings.sh"), str(raw)],
        raw / "log.txt",
        env,
        repo,
        settings.progress,
    )
    data = {"space": tsv_rows(raw / "space.tsv"), "read": tsv_rows(raw / "read.tsv")}
    return demoted((raw / "summary.md").read_text()) + [""], data


def dedup_index(zbd: str, repo: Path, settings: Settings, raw: Path) -> Result:
    """scripts/bench-dedup-index.py: summary.md and index.tsv (share of duplicates found per budget)."""
    env = {"ZBD_BIN": zbd, "DEDUP_DIR": str(settings.work_dir)}
    if settings.short:
        env |= {"DEDUP_BASE_MB": "64", "DEDUP_TREE_MB": "100"}
    argv = ["/usr/bin/python3", str(repo / "scripts" / "bench-dedup-index.py"), str(raw)]
    run_tool(argv, raw / "log.txt", env, repo, settings.progress)
    return demoted((raw / "summary.md").read_text()) + [""], {"index": tsv_rows(raw / "index.tsv")}


def dedup_space(zbd: str, repo: Path, settings: Settings, raw: Path) -> Result:
    """scripts/bench-dedup-space.py: dedup-space.json (stored bytes per data set and system), rendered
    here as one table (`dedup_space_table`)."""
    env = {"ZBD_BIN": zbd, "DEDUP_DIR": str(settings.work_dir)}
    if settings.short:
        env |= {"DEDUP_BASE_MB": "32", "DEDUP_TREE_MB": "50", "DEDUP_SEED_MB": "80"}
    argv = ["/usr/bin/python3", str(repo / "scripts" / "bench-dedup-space.py"), str(raw)]
    run_tool(argv, raw / "log.txt", env, repo, settings.progress)
    doc = json.loads((raw / "dedup-space.json").read_text())
    return dedup_space_table(doc), doc


MIB = 2**20


def dedup_space_table(doc: dict[str, Any]) -> list[str]:
    """Per data set: what it is, its exact duplicates, then one row per system: logical and stored
    bytes, logical : stored, stored against btrfs compress=zstd:1 (the row marked "base") of the same
    set, and for a set with a declared dedup ratio the achieved one against it. `zbd estimate`'s
    projection of dedup + zstd:1 closes each set, marked as such (no filesystem metadata)."""
    lines = [
        "Stored: btrfs and zbd, bytes the image (backing file) holds after sync + fstrim; ZFS, the "
        "pool's ALLOC after export/import (zfs-fuse has no TRIM). Metadata included everywhere.",
        "",
        "| set | system | logical MiB | stored MiB | logical : stored | x btrfs zstd:1 | note |",
        "|---|---|---|---|---|---|---|",
    ]
    facts: list[str] = []
    for data in doc.get("sets", []):
        name, logical = data["name"], data["logical_bytes"]
        rows = [r for r in doc.get("rows", []) if r["set"] == name]
        base = next((r["stored_bytes"] for r in rows if r.get("base")), None)
        declared = data.get("declared_ratio")
        for r in rows:
            note = row_note(r, logical, declared)
            lines.append(space_row(name, r["system"], logical, r["stored_bytes"], base, note))
        estimate = data.get("facts", {}).get("estimate") or {}
        if estimate.get("stored_bytes"):
            system = f"*zbd estimate: dedup 4 KiB + {estimate.get('codec')} (projection)*"
            note = "data only, no filesystem metadata"
            lines.append(space_row(name, system, logical, estimate["stored_bytes"], base, note))
        facts.append(set_fact(data))
    notes = [f"- {note}" for note in doc.get("notes", [])]
    return [*lines, "", *facts, *notes, ""]


def space_row(set_name: str, system: str, logical: int, stored: int, base: int | None, note: str) -> str:
    versus = f"{stored / base:.2f}" if base else "-"
    ratio = f"{logical / stored:.2f}:1" if stored else "-"
    return (
        f"| {set_name} | {system} | {logical / MIB:.0f} | {stored / MIB:.0f} | {ratio} | {versus} | {note} |"
    )


def row_note(row: dict[str, Any], logical: int, declared: float | None) -> str:
    """What each system itself reports beside the bytes (ZFS's ratios, what duperemove shared)."""
    extra = row.get("extra", {})
    parts: list[str] = []
    if "dedupratio" in extra:
        parts.append(f"dedupratio {extra['dedupratio']}, compressratio {extra.get('compressratio')}")
    compsize = extra.get("compsize") or {}
    if "duperemove_s" in extra and compsize:
        shared = compsize["referenced"] - compsize["uncompressed"]
        parts.append(f"duperemove shared {shared / MIB:.0f} MiB in {extra['duperemove_s']:.0f} s")
    if "empty_bytes" in extra:
        parts.append(f"empty {extra['empty_bytes'] / MIB:.0f} MiB")
    if "zbd_dedup_s" in extra:
        ratio = (extra.get("zbd_stat") or {}).get("dedup_ratio")
        shown = f", dedup ratio {ratio:.2f}:1" if isinstance(ratio, int | float) else ""
        before = extra.get("before_dedup_bytes", 0)
        parts.append(f"zbd dedup {extra['zbd_dedup_s']:.0f} s{shown}, {before / MIB:.0f} MiB before")
    served = extra.get("served") or {}
    if served:  # inline dedup: what the server said after the copy
        ratio = served.get("dedup_ratio")
        index = served.get("dedup_index") or {}
        hit = index.get("hit_rate")
        written = served.get("data_bytes_written")
        parts.append(
            "inline"
            + (f", dedup ratio {ratio:.2f}:1" if isinstance(ratio, int | float) else "")
            + (f", index hit rate {hit:.1%}" if isinstance(hit, int | float) else "")
            + (f", {written / MIB:.0f} MiB data written" if isinstance(written, int | float) else "")
        )
    if "zbd_compact_s" in extra:
        before = extra.get("before_compact_bytes", 0)
        parts.append(f"zbd compact {extra['zbd_compact_s']:.0f} s, {before / MIB:.0f} MiB before")
    if "copy_s" in extra:
        parts.append(f"copy {extra['copy_s']:.0f} s")
    if declared and row["stored_bytes"]:
        achieved = logical / row["stored_bytes"]
        parts.append(
            f"achieved {achieved:.2f}:1 vs declared {declared:.2f}:1 ({achieved / declared - 1:+.0%})"
        )
    return "; ".join(parts)


def set_fact(data: dict[str, Any]) -> str:
    """One line per set: what it is and the duplicates it holds."""
    facts = data.get("facts", {})
    estimate = facts.get("estimate") or {}
    line = f"- {data['name']}: {data['description']}."
    if estimate.get("dedup_ratio"):
        line += (
            f" Exact 4 KiB duplicates (`zbd estimate`): {estimate['dedup_ratio']:.2f}:1; "
            f"{estimate.get('codec')} on the unique blocks: {estimate.get('compression_ratio', 0):.2f}:1."
        )
    if "exact_dedup_128k" in facts:
        line += f" The fio data holds {facts['exact_dedup_128k']:.2f}:1 at 128 KiB (SHA-256 of each unit)."
    return line


def snapshots(zbd: str, repo: Path, settings: Settings, raw: Path) -> Result:
    """scripts/bench-snapshots.py: summary.md and summary.json (snapshots under load, the first write
    after a snapshot, clones, retained snapshots, a delete under load); `--quick` shrinks every part.
    SNAP_PARTS and the script's other settings pass through from the environment
    (`SNAP_PARTS=clones zbdlab bench --only snapshots`). The clone set's bar chart (zbd beside
    btrfs, bytes and time) is drawn here into raw/snapshot-clones.png (`FIGURE_FILES`)."""
    env = {"ZBD_BIN": zbd, "DEDUP_DIR": str(settings.work_dir)}
    if settings.short:
        env |= {
            "SNAP_SIZE": "1G",
            "SNAP_CAPACITY": "8G",
            "SNAP_FILL_MB": "256",
            "SNAP_LOAD_S": "20",
            "SNAP_EVERY_S": "2",
            "SNAP_IMAGE_SIZE": "1G",
            "SNAP_IMAGE_FILL_MB": "512",
            "SNAP_READ_ROUNDS": "1",
            "SNAP_HOLD_SIZE": "8G",
            "SNAP_HOLD_MB": "1024",
            "SNAP_RETAINED": "20",
            "SNAP_READ_MB": "64",
            "SNAP_DEL_MB": "256",
            "SNAP_DEL_S": "12",
            "SNAP_FW_SIZE": "1G",
            "SNAP_FW_MB": "256",
            "SNAP_HOT_MB": "64",
            "SNAP_HOT_ERAS": "10",
        }
    argv = ["/usr/bin/python3", str(repo / "scripts" / "bench-snapshots.py"), str(raw)]
    run_tool(argv, raw / "log.txt", env, repo, settings.progress)
    doc = json.loads((raw / "summary.json").read_text())
    lines = demoted((raw / "summary.md").read_text())
    if clones_plot(doc, raw / "snapshot-clones.png"):
        lines += ["", "![clone set: bytes stored and time, zbd and btrfs](snapshot-clones.png)"]
    return [*lines, ""], doc


def clones_plot(doc: dict[str, Any], path: Path) -> bool:
    """The clone set, one bar pair per system: MiB stored for the image alone and with its clones
    (x one image above), and the seconds taken (import, clone commands, new data, stacked); False
    when the run has no clone set (SNAP_PARTS without clones, or an older summary)."""
    clones = doc.get("clones") or {}
    if "zbd" not in clones or "image" not in clones:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    z = clones["zbd"]
    rows = [("zbd lz4\nzbd clone", z["one"]["physical_bytes_live"], z["stored"]["physical_bytes_live"], z)]
    for b in clones.get("btrfs", []):
        codec = "btrfs" if b["compress"] == "none" else f"btrfs {b['compress']}"
        rows.append((f"{codec}\n{b['method']}", b["one"]["data"], b["stored"]["data"], b))
    n = clones["clones"]
    fig, (space, spent) = plt.subplots(1, 2, figsize=(9.6, 3.8))
    xs = range(len(rows))
    width = 0.38
    space.bar(
        [x - width / 2 for x in xs], [r[1] / MIB for r in rows], width, color="#7f8c8d", label="one image"
    )
    space.bar(
        [x + width / 2 for x in xs],
        [r[2] / MIB for r in rows],
        width,
        color="#1f4e79",
        label=f"image + {n} clones",
    )
    for x, r in zip(xs, rows, strict=True):
        space.annotate(
            f"{r[2] / r[1]:.2f}x", (x + width / 2, r[2] / MIB), ha="center", va="bottom", fontsize=7
        )
    bottom = [0.0] * len(rows)
    for key, label, color in (
        ("import_s", "import", "#bdc3c7"),
        ("clone_s", f"{n} clones", "#e67e22"),
        ("write_s", "new data", "#1f4e79"),
    ):
        vals = [sum(r[3][key]) if isinstance(r[3][key], list) else r[3][key] for r in rows]
        spent.bar(list(xs), vals, 0.6, bottom=bottom, color=color, label=label)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    space.set_ylim(top=space.get_ylim()[1] * 1.1)  # room for the ratios
    for ax, unit, title in (
        (space, "MiB", "stored (zbd live, btrfs data used); x one image above"),
        (spent, "s", "time"),
    ):
        ax.set_xticks(list(xs), [r[0] for r in rows], fontsize=7)
        ax.set_ylabel(unit, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7, frameon=False, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.2))
    gib = clones["image"]["size_bytes"] / (1 << 30)
    fig.suptitle(
        f"{n} clones of one {gib:g} GiB ext4 image, {clones['new_bytes_each'] / MIB:.0f} MiB of new "
        "files each",
        fontsize=10,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return True


def dedup_write(zbd: str, repo: Path, settings: Settings, raw: Path) -> Result:
    """scripts/bench-dedup-write.py: summary.md and summary.json (MiB/s and stored bytes, dedup off and
    on); the bar chart of its medians is drawn here (`dedup_write_plot`) into raw/dedup-write.png,
    which the results directory gets a copy of (`FIGURE_FILES`)."""
    env = {"ZBD_BIN": zbd, "DEDUP_DIR": str(settings.work_dir)}
    if settings.short:
        env |= {"DEDUP_WRITE_MB": "128"}
    argv = ["/usr/bin/python3", str(repo / "scripts" / "bench-dedup-write.py"), str(raw)]
    run_tool(argv, raw / "log.txt", env, repo, settings.progress)
    doc = json.loads((raw / "summary.json").read_text())
    lines = demoted((raw / "summary.md").read_text())
    if dedup_write_plot(doc, raw / "dedup-write.png"):
        lines += ["", "![MiB/s, dedup off and on](dedup-write.png)"]
    return [*lines, ""], doc


def dedup_write_plot(doc: dict[str, Any], path: Path) -> bool:
    """Two panels per case and data set, dedup off beside on: median MiB/s with the runs' range as
    error bars (on / off above each pair), and the bytes stored; False when there is nothing to draw."""
    entries = [e for e in doc.get("summary", []) if e.get("off") or e.get("on")]
    if not entries:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{e['case']}\n{e['data']}" for e in entries]
    fig, (speed, space) = plt.subplots(1, 2, figsize=(9.6, 3.2))
    width = 0.38
    for k, (dedup, color) in enumerate((("off", "#7f8c8d"), ("on", "#1f4e79"))):
        xs, medians, low, high, stored = [], [], [], [], []
        for x, e in enumerate(entries):
            arm = e.get(dedup)
            if not arm or arm.get("mib_s_median") is None:
                continue
            m = arm["mib_s_median"]
            xs.append(x + (k - 0.5) * width)
            medians.append(m)
            low.append(max(0.0, m - min(arm["mib_s"])))  # the runs' values are rounded
            high.append(max(0.0, max(arm["mib_s"]) - m))
            stored.append((arm.get("live_bytes") or 0) / MIB)
        if xs:
            speed.bar(xs, medians, width, yerr=[low, high], capsize=3, color=color, label=f"dedup {dedup}")
            space.bar(xs, stored, width, color=color, label=f"dedup {dedup}")
    for x, e in enumerate(entries):
        if "throughput_on_over_off" in e:
            top = max(max(e[d]["mib_s"]) for d in ("off", "on"))  # above the error bars
            speed.annotate(
                f"{e['throughput_on_over_off']:.2f}x", (x, top), ha="center", va="bottom", fontsize=7
            )
    speed.set_ylim(top=speed.get_ylim()[1] * 1.08)  # room for the ratios under the title
    for ax, unit, title in (
        (speed, "MiB/s (median)", "write throughput (on / off above)"),
        (space, "MiB", "stored after the flush (physical live)"),
    ):
        ax.set_xticks(range(len(entries)), labels, fontsize=7)
        ax.set_ylabel(unit, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.set_title(title, fontsize=9)
    handles, names = speed.get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=2, fontsize=7, frameon=False)
    fig.suptitle("zbd over NBD (fio), inline dedup off and on", fontsize=10)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return True


def ceph(zbd: str, repo: Path, settings: Settings, raw: Path) -> Result:
    """scripts/bench-ceph.sh (a throwaway cluster): its JSON, as a table zbd / RBD."""
    result = raw / "ceph.json"
    env = {"ZBD_BIN": zbd, "BENCH_CEPH_OUT": str(result)}
    run_tool(["bash", str(repo / "scripts" / "bench-ceph.sh")], raw / "log.txt", env, repo, settings.progress)
    doc = json.loads(result.read_text())
    return ceph_table(doc), doc


def ceph_table(doc: dict[str, Any]) -> list[str]:
    rows = [
        ("bytes the pool stores after the tree copy", "stored_bytes", 1e-6, "MB"),
        ("1 MiB seq write", "seq_write_mbps", 1, "MB/s"),
        ("1 MiB seq read", "seq_read_mbps", 1, "MB/s"),
        ("4 KiB rand write QD16", "rand_write_4k_iops", 1e-3, "k IOPS"),
        ("4 KiB rand read QD16", "rand_read_4k_iops", 1e-3, "k IOPS"),
    ]
    ratios = doc.get("ratios_zbd_over_rbd", {})
    lines = [
        f"Device {doc.get('size')}, tree of {doc.get('tree_bytes', 0) / 1e6:.1f} MB; "
        f"load {doc.get('loadavg', {}).get('start')} -> {doc.get('loadavg', {}).get('end')}.",
        "",
        "| measure | zbd | RBD | zbd / RBD |",
        "|---|---|---|---|",
    ]
    for label, key, scale_by, unit in rows:
        pair = doc.get(key, {})
        ratio = ratios.get(key)
        zbd, rbd = (f"{pair.get(side, 0) * scale_by:.1f} {unit}" for side in ("zbd", "rbd"))
        lines.append(f"| {label} | {zbd} | {rbd} | {'-' if ratio is None else f'{ratio:.3f}'} |")
    return [*lines, ""]


def rados_ab(zbd: str, repo: Path, settings: Settings, raw: Path) -> Result:
    """scripts/bench-rados-ab.sh write and read, base (A) against this binary (B), 3 rounds."""
    if not settings.base_zbd:
        raise HostError("group rados-ab compares two binaries: pass --base-zbd")
    lines: list[str] = []
    data: dict[str, Any] = {}
    for mode in ("write", "read"):
        argv = ["bash", str(repo / "scripts" / "bench-rados-ab.sh"), mode, settings.base_zbd, zbd, "3"]
        text = run_tool(argv, raw / f"{mode}.txt", {"ZBD_BIN": zbd}, repo, settings.progress)
        lines += fenced(f"{mode}: A = base {settings.base_zbd}, B = {zbd}", text)
        data[mode] = text.rstrip().splitlines()
    return lines, data


# Figures a script group draws into its raw directory, copied beside summary.md in the results one
FIGURE_FILES: dict[str, tuple[str, ...]] = {
    "dedup-write": ("dedup-write.png",),
    "snapshots": ("snapshot-clones.png",),
}

SCRIPT_RUNNERS: dict[str, Callable[[str, Path, Settings, Path], Result]] = {
    "builtin": builtin,
    "scale": scale,
    "latency": latency,
    "metrics": metrics,
    "savings": savings,
    "dedup-index": dedup_index,
    "dedup-space": dedup_space,
    "dedup-write": dedup_write,
    "snapshots": snapshots,
    "ceph": ceph,
    "rados-ab": rados_ab,
}
