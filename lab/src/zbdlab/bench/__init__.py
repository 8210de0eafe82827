"""`zbdlab bench` (`make bench`): every benchmark of zbd, one entry point.

The ratio groups measure median(A) / median(B) over rounds that each run A and B once (the order
rotates so no arm always goes first), with a bootstrap interval over rounds, checked against the
issues' targets: `engine` (in-process, `zbd bench engine`), `nbd-fast` / `nbd-slow` (fio's nbd
engine against zbd, `nbdkit file` and `qemu-nbd` on the same disk) and `fs` (filesystems, through the
lab's own study runner). The other groups run zbd's built-in benchmarks (`builtin`) or a script under
scripts/ (`scale`, `latency`, `savings`, `ceph`, `rados-ab`) and keep the summary it writes
(zbdlab.bench.scripts). Results: bench/results/<date>-<commit>-<groups>/ (summary.md, figures.json,
environment.json: committed); the tools' raw output: bench/raw/<same name>/ (ignored by git).
"""
