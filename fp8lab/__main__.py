"""The command line: `python -m fp8lab doctor | lab | bench NAME | distributed ... | answers | measured`.

The same commands run as `fp8lab ...` where pip installed the console script.
"""

from __future__ import annotations

import sys

COMMANDS = {
    "doctor": "what this machine runs real and what it emulates, and why",
    "lab": "open the notebooks in JupyterLab (--help for its options)",
    "bench": "the benchmarks: quantize, gemm, gpu, train, widgets, notebooks, lessons, inspect, load, room N, all",
    "distributed": "the toy transformer on several processes under torchrun (FSDP2)",
    "answers": "print the answer key (--write regenerates notebooks/ANSWERS.md)",
    "measured": "print the shipped training runs (--write measures them again)",
}


def usage() -> str:
    lines = ["usage: python -m fp8lab COMMAND [options]", "", "commands:"]
    lines += [f"  {name:<12} {what}" for name, what in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "doctor":
        from fp8lab.lab.doctor import report

        print(report())
        return 0
    if cmd == "lab":
        from fp8lab.lab.launcher import main as run
    elif cmd == "bench":
        from fp8lab.bench import main as run
    elif cmd == "distributed":
        from fp8lab.training.distributed import main as run
    elif cmd == "answers":
        from fp8lab.lab.answers import main as run
    elif cmd == "measured":
        from fp8lab.training.measured import main as run
    else:
        print(f"unknown command {cmd!r}; valid: {', '.join(COMMANDS)}\n\n{usage()}", file=sys.stderr)
        return 2
    return run(rest)


if __name__ == "__main__":
    sys.exit(main())
