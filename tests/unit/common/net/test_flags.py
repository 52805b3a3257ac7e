"""The flag mechanism (common/net/flags.py): tables parse only what was given, hand it back as argv,
and refuse a field or option written twice."""

from __future__ import annotations

import argparse

import pytest

from common.net.flags import Flag, FlagTable


def _halve(value: float) -> float:
    return value / 2


TABLE = FlagTable(
    "demo",
    (
        Flag("name", str, "a name", required=True),
        Flag("mode", str, "a mode", ("fast", "slow")),
        Flag("seconds", float, "seconds", to_field=_halve),
        Flag("verbose", None, "talk more"),
        Flag("enable_cache", None, "no cache", option="--no-cache", switch_value=False),
        Flag("secret", str, "from the environment", env="DEMO_SECRET_FOR_TEST"),
    ),
)


def parse(argv: list[str], table: FlagTable = TABLE, prefix: str = "") -> argparse.Namespace:
    parser = argparse.ArgumentParser(exit_on_error=False)
    table.add_to(parser, prefix)
    return parser.parse_args(argv)


def test_only_given_flags_are_values_and_argv_gives_them_back(monkeypatch) -> None:
    monkeypatch.delenv("DEMO_SECRET_FOR_TEST", raising=False)
    args = parse(["--name", "n", "--seconds", "3", "--no-cache"])
    assert TABLE.given(args) == {"name": "n", "seconds": 3.0, "enable_cache": False}
    assert TABLE.config_values(args) == {"name": "n", "seconds": 1.5, "enable_cache": False}
    everything = {"name": "n", "mode": "slow", "seconds": 2.5, "verbose": True, "enable_cache": False}
    argv = TABLE.argv(everything)
    assert argv == ["--name", "n", "--mode", "slow", "--seconds", "2.5", "--verbose", "--no-cache"]
    assert TABLE.given(parse(argv)) == everything
    assert TABLE.argv({"name": "n", "verbose": False, "mode": None}) == ["--name", "n"]
    with pytest.raises(ValueError, match="not demo flags: bogus"):
        TABLE.argv({"bogus": 1})


def test_an_environment_variable_stands_in_for_a_flag_left_out(monkeypatch) -> None:
    monkeypatch.setenv("DEMO_SECRET_FOR_TEST", "")
    assert "secret" not in TABLE.given(parse(["--name", "n"]))  # empty: as unset
    monkeypatch.setenv("DEMO_SECRET_FOR_TEST", "s3")
    assert TABLE.given(parse(["--name", "n"]))["secret"] == "s3"
    assert TABLE.given(parse(["--name", "n", "--secret", "cli"]))["secret"] == "cli"


def test_argparse_still_checks_types_choices_and_required() -> None:
    for argv in (["--name", "n", "--mode", "medium"], ["--name", "n", "--seconds", "x"], ["--mode", "fast"]):
        with pytest.raises((argparse.ArgumentError, SystemExit)):
            parse(argv)


def test_help_carries_the_prefix() -> None:
    parser = argparse.ArgumentParser()
    TABLE.only(["mode", "verbose"]).add_to(parser, "router: ")
    text = parser.format_help()
    assert "router: a mode" in text and "router: talk more" in text and "--name" not in text


def test_tables_refuse_a_field_or_option_twice_and_unknown_selections() -> None:
    with pytest.raises(ValueError, match="field once; twice: a"):
        FlagTable("t", (Flag("a"), Flag("a", option="--b")))
    with pytest.raises(ValueError, match="name once; twice: --a"):
        FlagTable("t", (Flag("a"), Flag("b", option="--a")))
    with pytest.raises(KeyError, match="not demo flags: nope"):
        TABLE.only(["mode", "nope"])
    with pytest.raises(KeyError, match="nope"):
        TABLE.without(["nope"])
    assert TABLE.without(["name", "secret"]).fields == ("mode", "seconds", "verbose", "enable_cache")
    with pytest.raises(ValueError, match="option"):
        Flag("a", option="-a")
