"""Command line: `python -m fp8lab doctor | lab | bench NAME`."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    usage = "usage: python -m fp8lab {doctor | lab | bench {quantize,gemm,gpu,train,widgets,lessons,inspect,all}}"
    if not argv or argv[0] in ("-h", "--help"):
        print(usage)
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "doctor":
        from fp8lab.doctor import report

        print(report())
        return 0
    if cmd == "lab":
        from fp8lab.lab import main as lab_main

        return lab_main(rest)
    if cmd == "bench":
        from fp8lab.bench import main as bench_main

        return bench_main(rest)
    print(f"unknown command {cmd!r}\n{usage}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
