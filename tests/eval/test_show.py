"""The terminal view of who wrote which token (scripts/demo.sh)."""

from tokenrouter.eval.show import coloured


def test_plain_output_brackets_each_token_with_its_writer():
    assert coloured(["The", " answer", "", "\n"], ["slm", "llm", "llm", "slm"], ["slm", "llm"], tty=False) == \
        "[slm:The][llm: answer][slm:\n]"


def test_a_terminal_gets_one_background_per_writer_and_never_across_a_newline():
    out = coloured(["a", "b\nc"], ["slm", "llm"], ["slm", "llm"], tty=True)
    small, large = "\x1b[48;5;153m", "\x1b[48;5;216m"
    assert out == f"{small}\x1b[30ma\x1b[0m{large}\x1b[30mb\x1b[0m\n{large}\x1b[30mc\x1b[0m"
