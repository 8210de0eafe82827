"""A SIGTERM that lands while zbdlab starts a tool must not strand the tool.

`subprocess.Popen` forks and execs before it returns; an exception raised in between once left a
`mount` running on its own, which mounted the filesystem just after cleanup had checked for it.
"""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import os, random, signal, threading
from zbdlab import signals
from zbdlab.targets.commands import Commands

class Interrupted(BaseException):
    pass

cmds, rng = Commands(), random.Random(7)
interrupted = stranded = 0
for _ in range(300):
    # SIGTERM at a random moment in the first few ms: often while Popen is between fork and return
    timer = threading.Timer(rng.uniform(0, 0.004), os.kill, (os.getpid(), signal.SIGTERM))
    try:
        with signals.raising(Interrupted):
            timer.start()
            try:
                cmds.run(["sleep", "0.05"])
            finally:
                timer.join()
    except Interrupted:
        interrupted += 1
    try:
        os.waitpid(-1, os.WNOHANG)  # returns only if some child was neither killed nor waited for
        stranded += 1
        os.waitpid(-1, 0)
    except ChildProcessError:
        pass
print(interrupted, stranded)
"""


def test_an_interrupted_command_is_killed_and_waited_for() -> None:
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    interrupted, stranded = map(int, proc.stdout.split())
    assert interrupted == 300, "every SIGTERM became the exception cleanup unwinds on"
    assert stranded == 0, f"{stranded} of 300 interrupted commands were left running or unreaped"
