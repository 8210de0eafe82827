"""`zbdlab bench` (`make bench`): ratios measured in the same run, in alternating rounds.

Every figure is median(A) / median(B) over rounds that each run A and B once (the order rotates so
no arm always goes first), with a bootstrap interval over rounds, checked against the issue's
targets. Groups: `engine` (in-process, `zbd bench engine`), `nbd-fast` / `nbd-slow` (fio's nbd
engine against zbd, `nbdkit file` and `qemu-nbd` on the same disk) and `fs` (filesystems, through
the lab's own study runner). Results: bench/results/<date>-<commit>/ (summary.md, figures.json,
environment.json, raw/).
"""
