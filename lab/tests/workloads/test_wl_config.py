"""Study-file tables: good ones build workloads, bad ones raise WorkloadConfigError naming the key."""

from __future__ import annotations

import pytest

from zbdlab.workloads import WorkloadConfigError, from_config
from zbdlab.workloads.config import parse_size


@pytest.mark.parametrize(
    ("text", "expected"),
    [("4K", 4096), ("64M", 64 << 20), ("1.5G", 3 << 29), ("512", 512), (8192, 8192), ("16KiB", 16384)],
)
def test_wl_sizes_parse_in_binary_units(text: object, expected: int) -> None:
    assert parse_size(text, "k") == expected


@pytest.mark.parametrize(
    ("name", "table", "key", "words"),
    [
        ("iozone", {"file_sizes": ["64Q"]}, "file_sizes[0]", "size"),
        ("iozone", {"file_sizes": "64M"}, "file_sizes", "list"),
        ("iozone", {"record_sizes": ["4K", 0]}, "record_sizes[1]", "positive"),
        ("iozone", {"operations": ["write", "fly"]}, "operations[1]", "must be one of"),
        ("iozone", {"file_sizes": ["4K"], "record_sizes": ["64K"]}, "record_sizes", "larger"),
        ("iozone", {"file_sizes": ["100K"], "record_sizes": ["64K"]}, "file_sizes[0]", "multiple"),
        ("iozone", {"threads": [0]}, "threads[0]", "integer"),
        ("iozone", {"direct": "yes"}, "direct", "true or false"),
        ("iozone", {"file_size": "64M"}, "file_size", "unknown key"),
        ("throughput", {"min_threads": 4, "max_threads": 2}, "max_threads", ">= min_threads"),
        ("postmark", {"size_low": "10K", "size_high": "1K"}, "size_high", ">= size_low"),
        ("postmark", {"transactions": -5}, "transactions", "between"),
        ("fileserver", {"scale": "big"}, "scale", "number"),
        ("oltp", {"scale": 0.001}, "scale", "256K"),
        ("copy", {"tree_source": "relative/dir"}, "tree_source", "absolute"),
        ("copy", {"operations": ["dd", "dd"]}, "operations", "twice"),
        ("mystery", {}, "(name)", "unknown workload type"),
        ("any", {"type": "iozon"}, "type", "unknown workload type"),
    ],
)
def test_wl_bad_config_names_the_key(name: str, table: dict[str, object], key: str, words: str) -> None:
    with pytest.raises(WorkloadConfigError) as caught:
        from_config(name, table)
    assert caught.value.key == key
    assert str(caught.value).startswith(f"{key}: ")
    assert words in caught.value.problem


def test_wl_good_configs_build_every_type() -> None:
    tables = {
        "iozone": {"file_sizes": ["1M", "4M"], "record_sizes": ["4K", "2M"], "threads": [1, 2]},
        "throughput": {"file_size": "1M", "record_size": "64K", "max_threads": 3},
        "postmark": {"number": 10, "transactions": 10},
        "fileserver": {"scale": 0.01},
        "varmail": {},
        "webserver": {"threads": 4},
        "oltp": {"scale": 0.5},
        "copy": {"dd_size": "1M"},
    }
    for name, table in tables.items():
        workload = from_config(name, table)
        assert workload.name == name
        assert workload.cells(), name
    matrix = from_config("iozone", tables["iozone"]).cells()
    # 2M records are skipped for the 1M file: 2 threads x (1M: 4K) + (4M: 4K, 2M)
    assert [(c.threads, c.file_size_bytes, c.record_size_bytes) for c in matrix] == [
        (t, fs, rs) for t in (1, 2) for fs, rs in ((1 << 20, 4096), (4 << 20, 4096), (4 << 20, 2 << 20))
    ]
    assert [c.threads for c in from_config("throughput", tables["throughput"]).cells()] == [1, 2, 3]
    named = from_config("mail", {"type": "varmail", "threads": 2})
    assert named.name == "mail" and named.cells()[0].threads == 2


def test_wl_runner_keys_are_left_to_the_runner() -> None:
    table = {"file_sizes": ["1M"], "record_sizes": ["4K"], "repetitions": 3}
    with pytest.raises(WorkloadConfigError) as caught:
        from_config("iozone", table)
    assert caught.value.key == "repetitions"
    assert from_config("iozone", table, runner_keys={"repetitions"}).cells()
