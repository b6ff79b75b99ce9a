"""Task files and the answer-matching rules, on crafted outputs."""

import pytest

from tokenrouter.eval.tasks import SHIPPED_TASKS, Task, TaskError, is_correct, load_tasks


def t(answer, match="exact"):
    return Task("x", "q", answer, match)


@pytest.mark.parametrize("out,ok", [
    ("Paris", True), ("Paris.", True), ("The capital of France is Paris.", True), ("  \n paris!\nLyon", True),
    ("Parisian food", False), ("Lyon.\nParis", False), ("", False), ("It is Par is", False)])
def test_exact_is_a_whole_word_on_the_first_line(out, ok):
    assert is_correct(t("Paris"), out) is ok


def test_exact_phrases_span_any_whitespace():
    assert is_correct(t("New Delhi"), "It is New  Delhi.")
    assert not is_correct(t("New Delhi"), "It is NewDelhi.")


@pytest.mark.parametrize("out,ok", [
    ("12", True), ("The answer is 12.", True), ("7 + 5 = 12", True), ("12 apples", True), ("12.0", True),
    ("1,2", False), ("7 + 5 = 13", False), ("twelve", False), ("12, since 7 + 5", False), ("\n\n12\n5", True)])
def test_number_is_the_last_number_on_the_first_line(out, ok):
    assert is_correct(t("12", "number"), out) is ok


def test_number_understands_signs_decimals_and_thousands():
    assert is_correct(t("-3", "number"), "x = -3")
    assert is_correct(t("2.5", "number"), "about 2.50 litres")
    assert is_correct(t("1000", "number"), "It is 1,000 metres")
    assert not is_correct(t("3", "number"), "x = -3")


def test_regex_searches_the_whole_output_ignoring_case():
    assert is_correct(t(r"\b(1969|nineteen sixty-nine)\b", "regex"), "First line.\nIt was in 1969.")
    assert is_correct(t(r"^yes\b", "regex"), "YES it is")
    assert not is_correct(t(r"^yes\b", "regex"), "no, yes")


def test_no_answer_means_no_score():
    assert is_correct(Task("x", "q"), "anything") is None


def _write(tmp_path, lines):
    p = tmp_path / "t.jsonl"
    p.write_text("\n".join(lines) + "\n")
    return str(p)


@pytest.mark.parametrize("line,message", [
    ('{"prompt": "q", "answer": "1"', "t.jsonl:2: not a JSON object"),
    ('["q"]', "t.jsonl:2: expected a JSON object"),
    ('{"answer": "1"}', "t.jsonl:2: 'prompt' must be a non-empty string"),
    ('{"prompt": "q", "answer": "1", "match": "fuzzy"}', "'match' must be one of exact, number, regex"),
    ('{"prompt": "q", "answer": "ten", "match": "number"}', "is not a number"),
    ('{"prompt": "q", "answer": "(", "match": "regex"}', "not a valid regular expression"),
    ('{"prompt": "q", "answer": 3}', "'answer' must be a string"),
    ('{"prompt": "q", "anwser": "3"}', "unknown field 'anwser'"),
    ('{"id": "a", "prompt": "again"}', "id 'a' already used on line 1"),
])
def test_malformed_task_lines_name_the_file_and_line(tmp_path, line, message):
    path = _write(tmp_path, ['{"id": "a", "prompt": "fine"}', line])
    with pytest.raises(TaskError, match=message.replace("(", r"\(").replace("[", r"\[")):
        load_tasks(path)


def test_the_fitting_prompts_format_loads_as_prompts_without_answers(tmp_path):
    path = _write(tmp_path, ['{"id": "question-005", "kind": "question", "prompt": "Why do cats purr?"}'])
    (t,) = load_tasks(path)
    assert t.id == "question-005" and t.category == "question" and t.answer is None


def test_comments_blank_lines_and_default_ids(tmp_path):
    path = _write(tmp_path, ["# header", "", '{"prompt": "one"}', '{"prompt": "two", "answer": "2", "match": "number"}'])
    tasks = load_tasks(path)
    assert [x.id for x in tasks] == ["t-3", "t-4"] and tasks[1].match == "number" and tasks[0].answer is None


def test_the_shipped_task_set_loads_and_every_answer_matches_itself():
    tasks = load_tasks(SHIPPED_TASKS)
    assert len(tasks) >= 200 and all(x.answer for x in tasks)
    assert len({x.id for x in tasks}) == len(tasks)
    assert len({x.prompt for x in tasks}) == len(tasks)
    for x in tasks:  # the answer itself is right, an unrelated output is wrong
        if x.match != "regex":
            assert is_correct(x, x.answer) and is_correct(x, f"The answer is {x.answer}."), x
        assert is_correct(x, "zzz qqq") is False, x
