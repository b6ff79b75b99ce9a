"""The benchmark suite behind `tokenrouter bench`.

Every configuration (this runtime with tuned B_i, its ablations, the baselines and the
single-model bounds) is started once, kept running, and measured in interleaved rounds on
the same prompts, so machine noise hits all of them alike and ratios come from one run.

- `workload.py`: the prompts and sampling parameters (greedy, fixed length);
- `configs.py`: the configurations and how each is deployed;
- `deploy.py`: a running deployment (runtime subservers, or lockstep in-process) that
  runs one measured batch of requests and reports tokens, latencies and step counters;
- `llamacpp.py`, `llamacpp_server.py`: the stock llama.cpp peers (`llamacpp_std`, the per-token
  dispatcher over one server per model; `llamacpp_large`), serving the weights our engine runs (the GGUF file itself for `quant = native`, else a float32 export);
- `official.py`: CITER's own serving loop in `transformers` (`official`);
- `tuning.py`: the profile, the tuned B_i and the tuner's predictions;
- `runner.py`: the interleaved rounds, with a progress bar; `state.py`: the run's setup and
  what its levels measured, which the steps pass each other; `documents.py`: details.json's contents;
- `results.py`: statistics, the bound, peer agreement, `summary.json`, and writing both JSON files;
- `plots.py`: the PNG plots;
- `runlengths.py`, `runlength_check.py`: `tokenrouter bench runlength-check`, the run lengths
  of a real routing program and the tuner's predictions from them against the runtime.
"""
