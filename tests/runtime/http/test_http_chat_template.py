"""A model folder without a chat template, served: a chat request gets a 400 that says what
to add to the folder, a plain completion is served, and so is the next request."""

import httpx

from tests.helpers import tiny
from tests.helpers.serving import served
from tokenrouter.runtime.launch import LaunchOptions


def test_chat_without_a_template_names_what_to_add_to_the_model_folder(pair, tmp_path):
    plain = tiny.pair_with_tokenizer_config(pair, tmp_path, None)
    with served(tiny.rstitch(plain, 0.3), LaunchOptions(mode="thread"), name="plain") as srv:
        chat = {"model": "plain", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
        r = httpx.post(srv.url + "/v1/chat/completions", json=chat, timeout=60)
        assert r.status_code == 400
        message = r.json()["error"]["message"]
        assert "no chat template" in message and "tokenizer_config.json" in message
        assert "chat_template.jinja" in message and "--chat" not in message
        r = httpx.post(srv.url + "/v1/completions", json={"model": "plain", "prompt": "hi", "max_tokens": 3},
                       timeout=60)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
