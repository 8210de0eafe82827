"""Review: a SIGTERM that lands while bench's Server.start spawns its NBD server must not strand it.

`Commands.spawn` holds the signal until `adopt(proc)` ran, then raises it: only an `adopt` that
records the process lets cleanup stop it. `bench/nbd.py` passes `lambda p: None` (and sets
`self.proc` from spawn's return, which never comes), so the server, in its own session, is left
running whenever the signal lands inside Popen.
"""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import os, random, signal, tempfile, threading
from pathlib import Path
from zbdlab import signals
from zbdlab.bench.nbd import Server
from zbdlab.targets.cleanup import CleanupStack
from zbdlab.targets.commands import Commands

class Interrupted(BaseException):
    pass

class Sleeper(Server):
    def argv(self):
        return ["sleep", "0.3"]  # stands in for nbdkit/qemu-nbd/zbd serve (never ready)

cmds, rng = Commands(), random.Random(7)
disk = Path(tempfile.mkdtemp())
interrupted = stranded = 0
for _ in range(200):
    stack = CleanupStack()
    timer = threading.Timer(rng.uniform(0, 0.006), os.kill, (os.getpid(), signal.SIGTERM))
    try:
        with signals.raising(Interrupted):
            timer.start()
            try:
                Sleeper("nbdkit", "zbd", disk, 1 << 20, cmds, stack).start()
            finally:
                timer.join()
    except Interrupted:
        interrupted += 1
    stack.close()  # what the bench's cleanup does
    try:
        if os.waitpid(-1, os.WNOHANG) == (0, 0):
            stranded += 1  # a server cleanup did not stop
        os.waitpid(-1, 0)
    except ChildProcessError:
        pass
print(interrupted, stranded)
"""


def test_a_server_interrupted_while_spawned_is_stopped_by_cleanup() -> None:
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    interrupted, stranded = map(int, proc.stdout.split())
    assert interrupted == 200
    assert stranded == 0, f"{stranded} of 200 interrupted servers were left running after cleanup"
