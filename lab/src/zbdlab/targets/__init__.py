"""Targets: loop devices, filesystems, ZFS pools and zbd volumes that zbdlab creates and tears down."""

from zbdlab.targets.instance import TargetInstance, provision

__all__ = ["TargetInstance", "provision"]
