"""Run a command while busy processes hold the CPU's cores: the suite judges no wall-clock time, so it
must pass on a loaded machine (a laptop with a browser open, a shared CI runner).

    python tools/under_load.py --busy 2 -- make test

Starts `--busy` processes that spin (one per core of a 2-core machine saturates it), runs the command,
stops them, and prints the command's exit status, its wall time and the load average it ran under.
Exits with the command's status.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

SPIN = "import time\nwhile True:\n    sum(i * i for i in range(10_000))\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--busy", type=int, default=2, help="spinning processes to start (default 2)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the command to run, after --")
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("give the command to run after --, e.g. -- make test")
    if args.busy < 1:
        p.error("--busy must be at least 1")
    busy = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(args.busy)]
    start = time.monotonic()
    try:
        status = subprocess.run(command).returncode
    finally:
        load = os.getloadavg()
        for proc in busy:
            proc.kill()
        for proc in busy:
            proc.wait()
    minutes = (time.monotonic() - start) / 60
    print(f"under_load: `{' '.join(command)}` exited {status} after {minutes:.1f} min beside {args.busy} busy "
          f"processes (load average {load[0]:.1f}, {load[1]:.1f}, {load[2]:.1f})")
    return status


if __name__ == "__main__":
    sys.exit(main())
