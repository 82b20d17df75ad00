import os
import time


def t(label):
    p = os.environ.get("MGPU_TRACE")
    if p:
        with open(p, "a") as f:
            f.write(f"{time.time():.3f} {os.getpid()} {label}\n")
