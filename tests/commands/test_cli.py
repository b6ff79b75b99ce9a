"""`tokenrouter/cli.py`: every command module named in COMMANDS and SUBCOMMANDS exists and
builds its parser; a name with no module fails loudly instead of dropping the command
from `--help`; a UsageError a command lets out of `run` is one line and exit status 2."""

from __future__ import annotations

import pytest

from tokenrouter import cli


def test_every_command_and_subcommand_builds_its_parser(capsys):
    parser = cli.build_parser()
    (sub,) = [a for a in parser._actions if a.dest == "command"]
    assert list(sub.choices) == list(cli.COMMANDS)
    with pytest.raises(SystemExit):
        parser.parse_args(["--help"])
    out = capsys.readouterr().out
    assert all(name in out for name in cli.COMMANDS)
    for command, words in cli.SUBCOMMANDS.items():
        assert command in cli.COMMANDS
        for word in words:
            assert cli.build_subcommand_parser(command, word).prog == f"tokenrouter {command} {word}"


def test_a_command_without_its_module_fails_loudly(monkeypatch):
    monkeypatch.setitem(cli.COMMANDS, "chek", "chek")
    with pytest.raises(ImportError, match="names the command module 'chek', but tokenrouter/commands/chek.py "
                                          "does not exist"):
        cli.build_parser()
    with pytest.raises(ImportError, match="'chek'"):
        cli.main(["check", "--help"])  # any command line builds every command's parser


def test_a_subcommand_without_its_module_fails_loudly(monkeypatch):
    monkeypatch.setitem(cli.SUBCOMMANDS, "bench", {**cli.SUBCOMMANDS["bench"], "nope": "bench_nope"})
    with pytest.raises(ImportError, match="tokenrouter/commands/bench_nope.py does not exist"):
        cli.main(["bench", "nope"])


@pytest.mark.parametrize("command", ["check", "compile", "explain", "fit"])
def test_a_malformed_binding_is_a_usage_error_of_the_command(command, tmp_path, capsys):
    """`--set`/`--model` are read by one function; its error reaches the user the same way in
    every command that does not handle it itself: prefixed by the command, exit status 2,
    before the program is checked."""
    route = tmp_path / "p.route"
    route.write_text("tokenrouter 1\n")
    route = str(route)
    argv = {"check": ["check", route], "compile": ["compile", route, "--emit", "ir"],
            "explain": ["explain", route], "fit": ["fit", route, "--router", "r", "--prompts", "p.jsonl", "--out", "w.safetensors"]}[command]
    assert cli.main([*argv, "--set", "tau"]) == 2
    assert capsys.readouterr().err == f"tokenrouter {command}: error: --set takes NAME=VALUE, got 'tau'\n"
    assert cli.main([*argv, "--model", "llm="]) == 2
    assert capsys.readouterr().err == f"tokenrouter {command}: error: --model llm= needs a path\n"
