"""A writer served by vLLM is profiled on vLLM: `tokenrouter profile` on a tiny program whose
large writer has `engine = vllm` times that writer's steps through its `VllmWriter` (as its
subserver steps it), co-located with the small writer and as the small writer's co-located
peer, and `tokenrouter tune` reads the profile. The steps themselves (`runtime.vllm.steps.VllmSteps`)
are checked in a process of their own: an extend of k tokens per request is a returning
chunk vLLM computes k tokens of, and decodes run requests vLLM keeps stepping.
"""

import multiprocessing as mp
from concurrent.futures import ProcessPoolExecutor

import pytest

from tests.helpers import vllm as vh
from tokenrouter.cli import main
from tokenrouter.compiler.pipeline import load_program
from tokenrouter.runtime.loader import model_facts
from tokenrouter.tuner.profile import Profile
from tokenrouter.tuner.steps import open_steps

pytestmark = [vh.needs_vllm, pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def route(pair, tmp_path_factory):
    """The small writer on our engine, the large one on vLLM; the large model stays for a
    few tokens (a seeded coin sends it back), so its decodes are vLLM decodes."""
    tmp = tmp_path_factory.mktemp("vllm-profile")
    llm = vh.write_model(str(tmp / "llm"), seed=5)
    path = tmp / "pair.route"
    path.write_text(f'''tokenrouter 1
model slm = "{pair['slm']}"
model llm = "{llm}" {{ engine = vllm  dtype = float32 }}
route {{
  start slm
  slm -> llm when bernoulli(0.2, 7) rewrite
  llm -> slm when bernoulli(0.3, 3) keep
}}
serve {{
  batch llm = auto
}}
''')
    return str(path)


def test_profile_times_the_vllm_writer_on_vllm(route, tmp_path, capsys):
    out = tmp_path / "p.json"
    assert main(["profile", route, "--out", str(out), "--batch-sizes", "1,4", "--extend", "4,16",
                 "--repeats", "3", "--no-progress"]) == 0
    prof = Profile.load(out)
    assert {n: m.engine for n, m in prof.models.items()} == {"slm": "native", "llm": "vllm"}
    llm = prof["llm"]
    assert llm.alone.batch_sizes == (1, 4) and sorted(llm.extend) == [4, 16]
    curves = [llm.alone, *llm.extend.values(), llm.co_located, prof["slm"].co_located]
    assert all(v > 0 for c in curves for v in c.ms)
    # more tokens per step is not much faster: 64 tokens (4 requests x 16) against one; the
    # tiny model's steps are mostly vLLM's overhead, so they need not grow much either
    assert llm.extend[16].ms[-1] > 0.5 * llm.alone.ms[0], llm
    with capsys.disabled():  # the figures, under -s
        print(f"\nllm on vLLM: decode {llm.alone.ms}, extend 4 {llm.extend[4].ms}, extend 16 {llm.extend[16].ms}, "
              f"co-located {llm.co_located.ms}; slm with llm beside it x{prof['slm'].slowdown(1):.2f}")
    assert main(["tune", route, "-n", "4", "--profile", str(out), "--out", str(tmp_path / "t")]) == 0
    assert "B* =" in capsys.readouterr().out


def _step_facts(route: str) -> dict:
    """What vLLM computed for the profile's steps of three requests (run in a process of its
    own: an in-process vLLM engine is one per process)."""
    program = load_program(route, model_facts=model_facts)
    steps, _ = open_steps(program, program.model("llm"), 1, 128, 4)
    ids = ["a", "b", "c"]

    def computed(batch) -> int:
        before = steps.engine.computed_tokens
        steps.step(batch)
        return steps.engine.computed_tokens - before

    facts = {"prompt": computed([(s, [5] * 16) for s in ids]),
             "extends": [computed([(s, [7, 8, 9, 10]) for s in ids]) for _ in range(3)],
             "after_extends": [steps.seq_len(s) for s in ids], "decodes": [], "running": []}
    for _ in range(6):
        facts["decodes"].append(computed([(s, [11]) for s in ids]))
        facts["running"].append(len(steps.running))
    for s in ids:
        steps.free(s)
    facts["blocks_used"] = steps.engine.kv_usage()[0]
    return facts


def test_vllm_steps_feed_returning_chunks_and_decodes(route):
    with ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as pool:
        facts = pool.submit(_step_facts, route).result(timeout=600)
    assert facts["prompt"] == 3 * 16
    assert facts["extends"] == [3 * 4] * 3  # each a returning chunk of 4: no prefix computed again
    assert facts["after_extends"] == [16 + 3 * 4] * 3
    assert facts["decodes"] == [3] * 6
    assert max(facts["running"]) == 3, facts  # requests vLLM kept stepping: true decodes
    assert facts["blocks_used"] == 0
