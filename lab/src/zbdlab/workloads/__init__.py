"""Workloads run with real tools (fio, postmark, cp/tar): render -> run -> parse."""
