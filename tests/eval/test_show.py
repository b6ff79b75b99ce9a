"""The terminal view of who wrote which token (scripts/demo.sh)."""

from tokenrouter.eval.show import coloured, legend
from tokenrouter.eval.tables import markdown


def test_plain_output_brackets_each_writers_stretch_of_tokens():
    assert coloured(["The", " capital", " answer", "", "\n", " is"], ["slm", "slm", "llm", "llm", "slm", "slm"],
                    ["slm", "llm"], tty=False) == "[slm:The capital][llm: answer][slm:\n is]"


def test_a_terminal_gets_one_background_per_writer_and_never_across_a_newline():
    out = coloured(["a", "b\nc"], ["slm", "llm"], ["slm", "llm"], tty=True)
    small, large = "\x1b[48;5;153m", "\x1b[48;5;216m"
    assert out == f"{small}\x1b[30ma\x1b[0m{large}\x1b[30mb\x1b[0m\n{large}\x1b[30mc\x1b[0m"


def test_the_legend_off_a_terminal_shows_the_bracket_form_and_what_each_writer_is():
    assert legend(["slm", "llm"], tty=False, what={"slm": "the small model", "llm": "the large model"}) == \
        "[slm:...] the small model,  [llm:...] the large model"
    assert "\x1b[48;5;216m\x1b[30m llm \x1b[0m" in legend(["slm", "llm"], tty=True)


def test_the_markdown_tables_carry_the_summary_figures():
    cfg = {"accuracy": 0.5, "correct": 1, "answered": 2, "exact_match_with_large": 0.25, "large_share": 0.125,
           "tokens_per_s": 10.0, "tokens_per_s_at": {"8": 10.0, "1": 4.0}}
    d = {"both_right": 1, "fixed": 2, "broken": 3, "both_wrong": 4}
    s = {"meta": {"small": "slm", "large": "llm", "concurrency": 8, "concurrencies": [8, 1]},
         "configs": {"small": cfg, "large": cfg, "routed": cfg}, "diff": {"vs_large": d, "vs_small": d},
         "sweep": {"param": "tau", "points": [{"value": 0.5, **cfg}]}}
    md = markdown(s).splitlines()
    assert md[0] == "| configuration | accuracy | exact match with large | large share | tokens/s at 8 | tokens/s at 1 |"
    assert md[4] == "| routed | 50.0% (1/2) | 25.0% | 12.5% | 10.0 | 4.0 |"
    assert "| large alone | 1 | 2 | 3 | 4 |" in md and "| 0.5 | 50.0% | 25.0% | 12.5% | 10.0 |" in md
