"""Is routing worth it? Evaluate routing programs against their own small and large model.

    tokenrouter eval FILE.route [FILE.route ...] --out DIR [--tasks shipped|humaneval] [--prompts P.jsonl]
                     [--set NAME=VALUE] [--sweep NAME=LO:HI:N ...]
    tokenrouter eval --combine DIR [DIR ...] --out DIR

Modules, in the order data flows:
- `taskset`: what a task set is (its tasks, how each is asked, how an answer is judged);
- `tasks`: JSONL answer-task files, the answer-matching rules (exact, number, regex), and
  `AnswerTaskSet`;
- `humaneval`: HumanEval's problems, the prompt, the code taken from an answer, and the
  program that judges it;
- `sandbox` (with `sandbox_child`, the first process inside): untrusted programs run confined;
- `configs`: which models are small and large, and each model alone as a program;
- `run`: one configuration through the offline API (greedy, timed);
- `reuse`: the small-alone and large-alone runs of an earlier evaluation (`--reuse`);
- `analysis`: per-prompt records, scores and the 2x2 diffs;
- `frontier`: every configuration as a row, and the plot of the metric against cost;
- `report`: one program's report page, and writing a report all or nothing;
- `compare`: several programs' configurations on one page (one run, or `--combine`);
- `evaluate`: all of it, with inputs checked first;
- `tables`: summary.json as Markdown tables (what the command prints);
- `show`: who wrote which token, on a terminal.
The shipped task set is `tasks.jsonl` next to this file (docs/eval.md).
"""
