"""The command line: `python -m fp8lab doctor | lab | bench NAME | distributed ... | answers | measured | measured_fp4`.

The same commands run as `fp8lab ...` where pip installed the console script. doctor, lab and distributed are the
library's; bench, answers and the measured commands are the harness's (fp8lab.bench, fp8lab.harness).
"""

from __future__ import annotations

import importlib
import sys

# each command: (the module whose main(argv) runs it, what it does). A command imports its module when it runs, so
# that `fp8lab doctor` does not load the answer key's panels (measured: about 3 s of CPU) or the benchmarks.
COMMANDS = {
    "doctor": ("fp8lab.lab.doctor", "what this machine runs real and what it emulates, and why"),
    "lab": ("fp8lab.lab.launcher", "open the notebooks in JupyterLab (--help for its options)"),
    "bench": ("fp8lab.bench", "the benchmarks: quantize, gemm, gpu, train, widgets, notebooks, lessons, inspect, "
                              "load, room N, all"),
    "distributed": ("fp8lab.training.distributed", "the toy transformer on several processes under torchrun (FSDP2)"),
    "answers": ("fp8lab.harness.answers", "print the answer key (--write regenerates notebooks/ANSWERS.md)"),
    "measured": ("fp8lab.harness.measure", "print notebook 06's shipped training runs (--write measures them again)"),
    "measured_fp4": ("fp8lab.harness.measure_fp4", "print notebook 09's shipped runs (--write trains them again)"),
}


def usage() -> str:
    lines = ["usage: python -m fp8lab COMMAND [options]", "", "commands:"]
    lines += [f"  {name:<12} {what}" for name, (_, what) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd not in COMMANDS:
        print(f"unknown command {cmd!r}; valid: {', '.join(COMMANDS)}\n\n{usage()}", file=sys.stderr)
        return 2
    if cmd == "doctor":
        print(importlib.import_module(COMMANDS[cmd][0]).report())
        return 0
    return importlib.import_module(COMMANDS[cmd][0]).main(rest)


if __name__ == "__main__":
    sys.exit(main())
