"""Exits with the code given as its first argument, on every rank (no process group needed)."""

import sys

print(f"exiting with {sys.argv[1]}", flush=True)
sys.exit(int(sys.argv[1]))
