"""Every fenced shell command in README.md and docs/*.md runs as written: its `python -m` module
imports, its scripts and repository paths exist, and each flag is one its entry point's argparse
parser accepts (tests/helpers/doc_commands.py says how each is checked)."""

from __future__ import annotations

import pytest

from tests.helpers.doc_commands import DocCommand, fenced_commands, problems, split_commands

COMMANDS = fenced_commands()


@pytest.mark.parametrize("command", COMMANDS, ids=[c.where for c in COMMANDS])
def test_the_command_runs_as_written(command: DocCommand) -> None:
    assert problems(command) == [], " ".join(command.argv)


def test_the_readme_commands_are_found() -> None:
    readme = [c.argv for c in COMMANDS if c.where.startswith("README.md")]
    assert ("bash", "scripts/setup.sh") in readme
    assert (".venv/bin/python", "-m", "deploy.launch", "--prefill", "1", "--decode", "3") in readme
    assert any(argv[0] == "curl" and "response_format" in argv[-1] for argv in readme)


def test_shell_splitting() -> None:
    text = "A=1 python -m x --a 'b\nc' # note\ncurl -d '{\n}' u \\\n  -s && ray up f | tee g; echo '#'"
    assert split_commands(text) == [
        ["A=1", "python", "-m", "x", "--a", "b\nc"],
        ["curl", "-d", "{\n}", "u", "-s"],
        ["ray", "up", "f"],
        ["tee", "g"],
        ["echo", "#"],
    ]


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        (
            ("python", "-m", "deploy.launch", "--prefill", "1", "--no-such-flag"),
            "does not accept --no-such-flag",
        ),
        (
            (".venv/bin/pdserve", "serve", "--decode=2", "--gpus-per-node", "1"),
            "does not accept --gpus-per-node",
        ),
        (("python", "-m", "deploy.no_such_module"), "no module named 'deploy.no_such_module'"),
        (("python", "benchmarks/no_such_script.py", "--x"), "benchmarks/no_such_script.py does not exist"),
        (("ray", "up", "deploy/no_such_cluster.yaml"), "deploy/no_such_cluster.yaml does not exist"),
        (("pdserve", "launch"), "pdserve has no command 'launch'"),
    ],
)
def test_a_wrong_command_is_named(argv, problem) -> None:
    found = problems(DocCommand("example", argv))
    assert any(problem in p for p in found), found


def test_right_commands_pass() -> None:
    for argv in [
        ("python", "-m", "deploy.launch", "--prefill", "1", "--request-timeout", "5", "--max-num-seqs=4"),
        ("pdserve", "chat", "--max-tokens", "8", "hi"),
        ("python", "-m", "pytest", "-q", "--whatever", "tests/unit"),  # pytest's flags are its own
        ("python", "-m", "deploy.launch", "--help"),
    ]:
        assert problems(DocCommand("example", argv)) == [], argv
