"""`tokenrouter serve` as a user runs it: a subprocess, the example file, the OpenAI client."""

import os
import signal
import subprocess

import pytest

from tests.helpers import tiny
from tests.helpers.ports import free_port
from tests.helpers.serving import CLI, stop, wait_until_healthy
from tokenrouter.runtime.engine.sampler import SamplingParams
from tokenrouter.runtime.reference import Reference

pytestmark = pytest.mark.slow  # every test here takes seconds: the fast tier (-m "not slow") skips them


def _children(pid):
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                if int(fields[1]) == pid and fields[0] != "Z":
                    out.append(int(d))
            except (OSError, IndexError):
                pass
    return out


def test_serve_cli_end_to_end(pair, tmp_path):
    program = tiny.example_program("demo", str(tmp_path), pair, dtype="float32")
    port = free_port()
    cmd = CLI + ["serve", str(tmp_path / "demo.route"), "--port", str(port), "--model", f"slm={pair['slm']}",
                 "--model", f"llm={pair['llm']}", "--num-blocks", "64", "--max-restarts", "0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(proc, url, timeout_s=120)
        import openai
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused")
        tok_prompt = "Hello from the command line"
        c = client.completions.create(model="demo", prompt=tok_prompt, max_tokens=16, temperature=0)
        ids = c.choices[0].model_extra["token_ids"]
        ref = Reference(program)
        from tokenrouter.runtime.loader import program_tokenizer
        tk = program_tokenizer(program)
        r = ref.generate(tk.encode(tok_prompt), SamplingParams(max_tokens=16, stop_token_ids=tk.eos_token_ids))
        assert ids == r.tokens
        assert c.model_extra["tokens_by_model"] == r.written_by

        # the subservers die and no restart is allowed: serve exits non-zero by itself, so a
        # supervisor can take over (restarts and errors in flight: test_liveness.py)
        subs = _children(proc.pid)
        assert len(subs) >= 2
        for p in subs:
            os.kill(p, signal.SIGKILL)
        assert proc.wait(30) == 3
        assert "giving up" in proc.stdout.read()
    finally:
        stop(proc, 30)
    assert not _children(proc.pid)


@pytest.mark.parametrize("args, message", [
    (["no/such/file.route"], "cannot read"),
    (["DEMO", "--batch", "llm=zero"], "not a valid value"),
    (["DEMO", "--batch", "nobody=2"], "not a writer"),
    (["DEMO", "--batch", "llm=0"], "at least 1"),
    (["DEMO", "--subserver", "llm"], "--bind"),
    (["DEMO", "--host", "0.0.0.0"], "--api-key"),
    (["DEMO", "--max-running", "0"], "at least 1"),
    (["DEMO", "--stall-window", "0"], "--stall-window must be positive"),
])
def test_serve_cli_bad_input_is_a_clear_error(pair, tmp_path, args, message):
    tiny.example_program("demo", str(tmp_path), pair)
    args = [str(tmp_path / "demo.route") if a == "DEMO" else a for a in args]
    models = ["--model", f"slm={pair['slm']}", "--model", f"llm={pair['llm']}"]
    r = subprocess.run(CLI + ["serve"] + args + models, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert message in r.stderr
    assert "Traceback" not in r.stderr


def test_serve_liveness_flags_default_to_the_runtime_defaults():
    """`--stall-window` and `--heartbeat-timeout` are read without importing the runtime: their
    defaults are the liveness module's, written twice, and must stay equal."""
    import argparse

    from tokenrouter.commands import serve
    from tokenrouter.runtime.frontend import liveness
    parser = argparse.ArgumentParser()
    serve.configure(parser)
    args = parser.parse_args(["x.route"])
    assert args.stall_window == liveness.STALL_WINDOW_S and args.heartbeat_timeout == liveness.HEARTBEAT_TIMEOUT_S
