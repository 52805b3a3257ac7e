"""The shell commands written in README.md and docs/*.md, and what makes one fail to run as written.

`fenced_commands` reads every fenced block that is shell (labelled bash/sh/shell/console, or unlabelled
and starting with a known command) and splits it into simple commands, as a shell would: line
continuations joined, quotes spanning lines kept, comments dropped, `&&` `||` `;` `|` and newlines
separating. `problems` says what in one command would not run: a `python -m X` whose module does not
import, a script or repository path that does not exist, a flag that the entry point's own argparse
parser does not accept, a `pdserve` command that does not exist.

An entry point's parser is taken from the entry point itself: it is run as `__main__` with
`ArgumentParser.parse_args` replaced by a call that hands the parser back before anything is parsed
or started (an entry point that calls `parse_known_args` itself passes the flags it does not know on,
e.g. benchmarks/chaos/chaos.py to the launcher: those are not checked). Only this repository's entry
points are run so, and only when their source builds an argparse parser (anything else could start
work); other programs (curl, ray, pytest, ...) are checked for the repository paths they are given.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import re
import runpy
import shlex
import warnings
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
# The dated log keeps each command as it ran at its commit (paths of that day), so it is history, not
# instructions; every current figure's command is on docs/benchmarks.md, which is checked.
HISTORY = ("benchmarks-log.md",)
DOCS = (
    REPO_ROOT / "README.md",
    *sorted(p for p in (REPO_ROOT / "docs").glob("*.md") if p.name not in HISTORY),
)
SHELL_LABELS = {"bash", "sh", "shell", "console", "zsh"}
# What an unlabelled block must start with to be read as shell (diagrams and output are not).
KNOWN_COMMANDS = {"python", "python3", "pdserve", "bash", "curl", "ray", "pip", "cd", "guidellm"}
SEPARATORS = {";", "&&", "||", "|", "&", "(", ")", "\n"}
PREFIXES = {"sudo", "time", "exec", "nohup", "env"}
_FENCE = re.compile(r"^```(\S*)\s*$")
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_FLAG = re.compile(r"^--?[A-Za-z][\w-]*")


@dataclass(frozen=True)
class DocCommand:
    where: str  # "docs/cluster.md:42": the file and the line its block starts on
    argv: tuple[str, ...]


@dataclass(frozen=True)
class EntryParser:
    parser: argparse.ArgumentParser
    passes_unknown_flags_on: bool  # it called parse_known_args: flags it lacks go elsewhere


class _ParserCaptured(Exception):
    def __init__(self, entry: EntryParser) -> None:
        self.entry = entry


def fenced_commands(paths=DOCS) -> list[DocCommand]:
    found = []
    for path in paths:
        for line_no, block in _shell_blocks(path.read_text()):
            where = f"{path.relative_to(REPO_ROOT)}:{line_no}"
            found += [DocCommand(where, tuple(argv)) for argv in split_commands(block)]
    return found


def _shell_blocks(text: str):
    label, start, lines = None, 0, []
    for i, line in enumerate(text.splitlines(), 1):
        fence = _FENCE.match(line)
        if fence is None:
            if label is not None:
                lines.append(line)
        elif label is None:
            label, start, lines = fence.group(1), i, []
        else:
            block = "\n".join(lines)
            if label in SHELL_LABELS or (label == "" and _starts_like_shell(block)):
                yield start, block
            label = None


def _starts_like_shell(block: str) -> bool:
    commands = split_commands(block)
    return bool(commands) and _program(commands[0]) in KNOWN_COMMANDS


def split_commands(block: str) -> list[list[str]]:
    """The simple commands of a shell text (env assignments and `sudo`-like prefixes kept)."""
    commands, pending = [], ""
    for line in block.splitlines():
        pending += line + "\n"
        if line.endswith("\\"):
            continue
        try:
            tokens = _tokens(pending)
        except ValueError:  # a quote still open: the command goes on on the next line
            continue
        pending = ""
        current: list[str] = []
        for token in [*tokens, "\n"]:
            if token in SEPARATORS or set(token) <= set(";&|()"):
                if current:
                    commands.append(current)
                current = []
            else:
                current.append(token)
    return commands


def _tokens(text: str) -> list[str]:
    lexer = shlex.shlex(text.replace("\\\n", " "), posix=True, punctuation_chars=";&|()<>")
    lexer.whitespace_split = True
    return list(lexer)


def _program(argv: list[str]) -> str:
    words = _without_prefixes(argv)
    return Path(words[0]).name if words else ""


def _without_prefixes(argv: list[str] | tuple[str, ...]) -> list[str]:
    words = list(argv)
    while words and (_ASSIGNMENT.match(words[0]) or words[0] in PREFIXES):
        words.pop(0)
    return words


def problems(command: DocCommand) -> list[str]:
    """What would keep `command` from running as written (empty: nothing found)."""
    words = _without_prefixes(command.argv)
    if not words:
        return []
    found = _missing_paths(words)
    program = Path(words[0]).name
    if program.startswith("python"):
        found += _python_problems(words[1:])
    elif program == "pdserve":
        found += _pdserve_problems(words[1:])
    elif program in ("bash", "sh", "source", ".") and len(words) > 1:
        found += _script_problems(words[1])
    return found


def _python_problems(args: list[str]) -> list[str]:
    if not args or args[0] == "-c":
        return []
    if args[0] == "-m":
        if len(args) < 2:
            return ["python -m without a module"]
        module = args[1]
        try:
            spec = importlib.util.find_spec(module)
        except ModuleNotFoundError:
            spec = None
        if spec is None or spec.origin is None:
            return [f"no module named {module!r}"]
        if not _is_ours(Path(spec.origin)):
            return []  # a third-party tool (pytest, pip, ...): its own business
        return _flag_problems(f"python -m {module}", module_parser(module), args[2:])
    return _script_problems(args[0]) or _flag_problems(args[0], script_parser(args[0]), args[1:])


def _pdserve_problems(args: list[str]) -> list[str]:
    from deploy.cli import COMMANDS

    if not args or args[0] not in COMMANDS:
        return [f"pdserve has no command {args[0] if args else ''!r} (it has {', '.join(COMMANDS)})"]
    return _flag_problems(f"pdserve {args[0]}", pdserve_parser(args[0]), args[1:])


def _script_problems(path: str) -> list[str]:
    return [] if (REPO_ROOT / path).exists() else [f"{path} does not exist"]


def _missing_paths(words: list[str]) -> list[str]:
    """Repository paths among the arguments (not flag values: those may be outputs) must exist."""
    top = {p.name for p in REPO_ROOT.iterdir() if not p.name.startswith(".")}
    missing = []
    for before, word in zip(["", *words], words, strict=False):
        if before.startswith("-") and "=" not in before:
            continue
        is_repo_path = word.split("/")[0] in top and not re.search(r"[$*?<>{}\[\]]", word)
        if is_repo_path and not (REPO_ROOT / word).exists():
            missing.append(f"{word} does not exist")
    return missing


def _flag_problems(entry: str, captured: EntryParser | None, args: list[str]) -> list[str]:
    flags = [a for a in args if _FLAG.match(a)]
    if captured is None:
        return [f"{entry} takes no flags (no argparse parser), given {flags}"] if flags else []
    if captured.passes_unknown_flags_on:
        return []
    parser = _subcommand_parser(captured.parser, args)
    known = set(parser._option_string_actions)
    found = []
    for arg in args:
        if arg == "--":
            break
        if _FLAG.match(arg) and arg.split("=", 1)[0] not in known:
            found.append(f"{entry} does not accept {arg.split('=', 1)[0]}")
    return found


def _subcommand_parser(parser: argparse.ArgumentParser, args: list[str]) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            chosen = next((a for a in args if a in action.choices), None)
            if chosen is not None:
                return action.choices[chosen]
    return parser


@functools.cache
def module_parser(module: str) -> EntryParser | None:
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None
    source = Path(spec.origin)
    if source.name == "__init__.py":  # `python -m package` runs its __main__
        source = source.parent / "__main__.py"
    return _captured(lambda: runpy.run_module(module, run_name="__main__"), source)


@functools.cache
def script_parser(path: str) -> EntryParser | None:
    source = REPO_ROOT / path
    return _captured(lambda: runpy.run_path(str(source), run_name="__main__"), source)


@functools.cache
def pdserve_parser(command: str) -> EntryParser | None:
    from deploy.cli import COMMANDS

    run, _ = COMMANDS[command]
    return _captured(lambda: run([]), None)


def _captured(run, source: Path | None) -> EntryParser | None:
    """The parser `run` builds, taken from its first parse_args / parse_known_args call; None when the
    source neither builds an argparse parser nor calls a parse_args built elsewhere (it is then not
    run at all)."""
    if source is not None and not re.search(r"ArgumentParser|parse_args", source.read_text()):
        return None

    def parse_args(self, *args, **kwargs):
        raise _ParserCaptured(EntryParser(self, passes_unknown_flags_on=False))

    def parse_known_args(self, *args, **kwargs):
        raise _ParserCaptured(EntryParser(self, passes_unknown_flags_on=True))

    saved = argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args
    argparse.ArgumentParser.parse_args = parse_args  # type: ignore[method-assign]
    argparse.ArgumentParser.parse_known_args = parse_known_args  # type: ignore[method-assign]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # runpy: "found in sys.modules"
            run()
    except _ParserCaptured as captured:
        return captured.entry
    finally:
        argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args = saved  # type: ignore[method-assign]
    raise AssertionError(f"{source} returned without parsing its arguments")


def _is_ours(path: Path) -> bool:
    return path.resolve().is_relative_to(REPO_ROOT) and ".venv" not in path.parts
