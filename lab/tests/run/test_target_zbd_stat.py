"""Reading `zbd stat --json` (zbd-core's Stats): volume size is not space in use."""

from zbdlab.targets.zbd import stat_numbers


def test_in_use_and_allocated_not_volume_size() -> None:
    stat = {
        "logical_bytes": 1 << 30,
        "logical_bytes_in_use": 8 << 20,
        "physical_bytes_live": 4 << 20,
        "physical_bytes_allocated": 5 << 20,
        "compression_ratio": 2.0,
        "data_blocks": 1536,  # 6 MiB of data; the other 2 MiB in use are zero blocks
        "counters": {"host_bytes_written": 9 << 20},
    }
    assert stat_numbers(stat) == (8 << 20, 5 << 20, 1.5), "ratio of stored data, zero blocks left out"
    del stat["data_blocks"]
    assert stat_numbers(stat)[2] == 2.0, "zbd's own ratio when the block counts are missing"


def test_ratio_derived_when_absent() -> None:
    assert stat_numbers({"logical_bytes_in_use": 300, "physical_bytes_used": 100}) == (300, 100, 3.0)


def test_unknown_shape_gives_nothing() -> None:
    assert stat_numbers({"something": "else"}) == (None, None, None)
