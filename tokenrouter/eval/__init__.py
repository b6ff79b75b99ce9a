"""Is routing worth it? Evaluate a routing program against its own small and large model.

    tokenrouter eval FILE.route --out DIR [--prompts P.jsonl] [--set NAME=VALUE] [--sweep NAME=LO:HI:N]

Modules, in the order data flows:
- `tasks`: JSONL task files and the answer-matching rules (exact, number, regex);
- `configs`: which models are small and large, and each model alone as a program;
- `run`: one configuration through the offline API (greedy, timed);
- `reuse`: the small-alone and large-alone runs of an earlier evaluation (`--reuse`);
- `analysis`: per-prompt records, scores and the 2x2 diffs;
- `report`: the frontier plot and the static report page;
- `evaluate`: all of it, with inputs checked first and the report written all or nothing;
- `tables`: summary.json as Markdown tables (what the command prints);
- `show`: who wrote which token, on a terminal.
The shipped task set is `tasks.jsonl` next to this file (docs/eval.md).
"""
