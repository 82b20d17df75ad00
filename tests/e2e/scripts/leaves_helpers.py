"""A script that starts helpers meant to outlive it, as users' scripts do (a TensorBoard, a data server, a tracker's
service): one in a session of its own, one a double-forked daemon (fork, setsid, fork), and a plain child it never
waits for. Each carries the marker given as the first argument on its command line. Then the script waits to be
stopped (``--wait``) or ends with an exit code (``--exit N``).

    python leaves_helpers.py MARKER --wait | --exit N
"""

import os
import subprocess
import sys
import time

SLEEP = "import time; time.sleep(600)"
# fork; the child leaves the session and forks again; both parents exit: the grandchild is a daemon whose parent died
DAEMON = ("import os, time\n"
          "if os.fork() == 0:\n"
          "    os.setsid()\n"
          "    if os.fork() == 0:\n"
          "        time.sleep(600)\n"
          "    os._exit(0)\n")

marker, how = sys.argv[1], sys.argv[2]
rank = os.environ.get("RANK", "0")
subprocess.Popen([sys.executable, "-c", SLEEP, f"{marker}-session-{rank}"], start_new_session=True,
                 stdin=subprocess.DEVNULL)
subprocess.run([sys.executable, "-c", DAEMON, f"{marker}-daemon-{rank}"], check=True, stdin=subprocess.DEVNULL)
subprocess.Popen([sys.executable, "-c", SLEEP, f"{marker}-plain-{rank}"], stdin=subprocess.DEVNULL)  # never waited
print(f"rank {rank}: helpers started", flush=True)
if how == "--wait":
    while True:
        time.sleep(1)
# Every rank has started its helpers before any ends (a file barrier in the working directory): a rank that fails
# first would have torch's agent stop the others before theirs start.
open(f"{marker}-ready-{rank}", "w").close()
deadline = time.monotonic() + 60
world = int(os.environ.get("WORLD_SIZE", "1"))
while time.monotonic() < deadline and not all(os.path.exists(f"{marker}-ready-{r}") for r in range(world)):
    time.sleep(0.05)
sys.exit(int(sys.argv[3]))
