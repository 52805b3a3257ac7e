"""The `pdserve` console script: one entry point for the `python -m` forms.

    pdserve serve [launch options]   = python -m deploy.launch ...   (start a cluster, serve until Ctrl-C)
    pdserve chat [options] QUESTION  = python -m common.tools.chat ...     (answer one question offline)
    pdserve bench [options]          = python benchmarks/serving/serving.py ... (load an OpenAI endpoint)

Each command hands the rest of the command line, unchanged, to the module's own `main` (bench: to the
script's), so options and `--help` are the module's. `bench` runs the serving benchmark client of the
repository's `benchmarks/` folder, which is tool code, not part of the installed product: it needs a
source checkout (as `pip install -e .` gives), and it runs as a script in a child process, so no
product module imports benchmark code (tests/unit/test_import_contracts.py keeps it so).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
BENCH_CLIENT = "benchmarks/serving/serving.py"  # relative to a source checkout's root


def _serve(argv: list[str]) -> int:
    from deploy.launch import main

    return main(argv, prog="pdserve serve")


def _chat(argv: list[str]) -> int:
    from common.tools.chat import main

    return main(argv, prog="pdserve chat")


def _bench(argv: list[str]) -> int:
    script = REPO_ROOT / BENCH_CLIENT
    if not script.is_file():
        print(f"pdserve bench: needs a source checkout ({script} is missing)", file=sys.stderr)
        return 2
    child = subprocess.Popen([sys.executable, str(script), *argv])
    try:
        return child.wait()
    except KeyboardInterrupt:  # the child got the same Ctrl-C: let it print what it measured and end
        return child.wait()


COMMANDS: dict[str, tuple[Callable[[list[str]], int], str]] = {
    "serve": (_serve, "start a router and workers (python -m deploy.launch)"),
    "chat": (_chat, "answer one question with the offline engine (python -m common.tools.chat)"),
    "bench": (_bench, f"benchmark an OpenAI-compatible endpoint ({BENCH_CLIENT})"),
}


def usage() -> str:
    lines = ["usage: pdserve {serve,chat,bench} [options]  (pdserve COMMAND --help for its options)", ""]
    lines += [f"  {name:<6} {text}" for name, (_, text) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("-h", "--help"):
        print(usage())
        return 0
    if not args or args[0] not in COMMANDS:
        problem = "a command is required" if not args else f"unknown command {args[0]!r}"
        print(f"{usage()}\npdserve: error: {problem}", file=sys.stderr)
        return 2
    run, _ = COMMANDS[args[0]]
    return run(args[1:])


if __name__ == "__main__":
    sys.exit(main())
