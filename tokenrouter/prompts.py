"""Prompt sets: JSONL files, one object a line with a non-empty "prompt" string (other keys
are kept for the reader: "kind", "id"), read by `tokenrouter fit` and `tokenrouter bench
--prompts`. Every problem is a `PromptsError` naming the file, and the line where there is
one."""

from __future__ import annotations

import json
import os


class PromptsError(ValueError):
    """A prompts file that cannot be read as a prompt set: the message is meant for the user."""


def read_prompts(path: str) -> list[dict]:
    if not os.path.isfile(path):
        raise PromptsError(f"{path}: no such prompts file")
    rows = []
    with open(path, encoding="utf-8", errors="strict") as f:
        try:
            lines = f.read().splitlines()
        except UnicodeDecodeError as exc:
            raise PromptsError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise PromptsError(f"{path}:{n}: not valid JSON ({exc})") from None
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str) or not row["prompt"].strip():
            raise PromptsError(f'{path}:{n}: expected an object with a non-empty "prompt" string, got {line[:60]!r}')
        rows.append(row)
    if not rows:
        raise PromptsError(f"{path}: no prompts (the file is empty)")
    return rows
