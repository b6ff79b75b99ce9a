"""`SamplingParams`, the one sampling type from HTTP to the sampler and the wire: strict and
bounded, immutable, the one end-of-sequence rule, the one end-of-request rule; and the route
seed a request without one gets."""

import pytest
from pydantic import ValidationError

from tokenrouter.protocol.sampling import (DEFAULT_MAX_TOKENS, MAX_STOP_IDS, SamplingParams, end_reason,
                                           invalid_because)
from tokenrouter.protocol import handoff
from tokenrouter.protocol.state import PeerMessage, RouteState, route_seed_of


def test_defaults_and_greedy():
    p = SamplingParams()
    assert (p.temperature, p.top_k, p.top_p, p.seed, p.max_tokens, p.stop_token_ids) == \
        (0.0, 0, 1.0, None, DEFAULT_MAX_TOKENS, ())
    assert p.greedy and SamplingParams(temperature=1.0, top_k=1).greedy
    assert not SamplingParams(temperature=0.7).greedy
    assert SamplingParams(temperature=1).temperature == 1.0  # an int is a number


@pytest.mark.parametrize("bad", [
    {"max_tokens": "5"}, {"temperature": "0.5"}, {"seed": "3"}, {"stop_token_ids": ["2"]},  # never coerced
    {"max_tokens": 5.0}, {"max_tokens": True}, {"stop_token_ids": [True]},
    {"temperature": -1.0}, {"temperature": 101.0}, {"temperature": float("nan")}, {"top_p": 0.0}, {"top_p": 1.5},
    {"top_k": -2}, {"max_tokens": 0}, {"max_tokens": (1 << 20) + 1}, {"seed": 1 << 63}, {"seed": -(1 << 63) - 1},
    {"stop_token_ids": [-1]}, {"stop_token_ids": [1 << 31]}, {"stop_token_ids": [1] * (MAX_STOP_IDS + 1)},
    {"evil": 1},
])
def test_strict_and_bounded(bad):
    with pytest.raises(ValidationError):
        SamplingParams(**bad)


def test_immutable_and_replace_validates():
    p = SamplingParams(max_tokens=5, stop_token_ids=[2, 3])
    assert p.stop_token_ids == (2, 3) and hash(p) == hash(SamplingParams(max_tokens=5, stop_token_ids=(2, 3)))
    with pytest.raises(ValidationError):
        p.max_tokens = 6  # type: ignore[misc]
    assert p.replace(max_tokens=6) == SamplingParams(max_tokens=6, stop_token_ids=(2, 3))
    with pytest.raises(ValidationError):
        p.replace(max_tokens="6")


def test_the_end_of_sequence_rule():
    p = SamplingParams(stop_token_ids=[7, 2, 7])
    assert p.with_eos((2, 9, 1)).stop_token_ids == (7, 2, 7, 9, 1)  # the eos ids not there already, after
    assert p.with_eos((2, 9), ignore_eos=True).stop_token_ids == (7, 2, 7)
    assert SamplingParams().with_eos([5]).stop_token_ids == (5,)
    with pytest.raises(ValidationError):  # the bound holds with the eos ids added too
        SamplingParams(stop_token_ids=[1] * MAX_STOP_IDS).with_eos([2])


def test_one_type_everywhere():
    from tokenrouter.runtime.engine import sampler
    from tokenrouter.runtime.offline import SamplingParams as offline_params
    from tokenrouter.runtime.transport import wire
    assert offline_params is sampler.SamplingParams is SamplingParams
    assert not hasattr(wire, "Sampling")
    assert wire.Submit.model_fields["sampling"].annotation is SamplingParams
    assert PeerMessage.model_fields["sampling"].annotation is SamplingParams
    p = SamplingParams(temperature=0.5, seed=3, stop_token_ids=[4])
    back = wire.decode(wire.encode(wire.Submit(to=1, rid="r", prompt=[1], sampling=p, route_seed=9)))
    assert back.sampling == p and back.route_seed == 9


def test_a_handoff_carries_the_sampling_params_and_the_route_seed():
    p = SamplingParams(temperature=0.5, stop_token_ids=[3])
    st = RouteState(rid="r", tokens=[1, 2], prompt_len=1, writer="b", route_seed=-7, sampling=p)
    msg = PeerMessage.model_validate_json(handoff.send(st, "b", "a", ("a", "b")).model_dump_json())
    assert msg.sampling == p and msg.route_seed == -7
    got = handoff.receive(msg, None, ("a", "b"))
    assert got.sampling == p and got.route_seed == -7
    assert RouteState(rid="r", tokens=[1], prompt_len=1, writer="a").sampling == SamplingParams()
    with pytest.raises(ValidationError):  # a frame's parameters are held to the same bounds
        PeerMessage.model_validate({"rid": "r", "suffix": [1], "start": 0, "prompt_len": 1, "writer": "a",
                                    "sampling": {"max_tokens": "4"}})


def test_a_refusal_in_one_line():
    with pytest.raises(ValidationError) as exc:
        SamplingParams(temperature=-1.0)
    assert invalid_because(exc.value) == ("temperature", "temperature: Input should be greater than or equal "
                                                         "to 0, got -1.0")


def test_a_request_without_a_route_seed_gets_a_stable_one_from_its_id():
    seeds = {route_seed_of(f"cmpl-{i}") for i in range(1000)}
    assert len(seeds) == 1000 and all(0 <= s < 1 << 63 for s in seeds)
    assert route_seed_of("cmpl-0") == 0x49D93934F43ED963  # the same on every host, in every run


def test_the_end_of_request_rule():
    p = SamplingParams(max_tokens=4, stop_token_ids=(7, 9))
    assert end_reason(9, 1, 10, p, 100) == "stop"  # a stop token ends it, before any length
    assert end_reason(9, 4, 100, p, 100) == "stop"
    assert end_reason(3, 4, 10, p, 100) == "length"  # max_tokens
    assert end_reason(3, 2, 100, p, 100) == "length"  # the context limit
    assert end_reason(3, 3, 99, p, 100) is None
    assert end_reason(None, 0, 5, p, 100) is None  # no token yet (the frontend's recovery asks so)
    assert end_reason(None, 4, 5, p, 100) == "length"
    assert end_reason(7, 1, 10, p, 100, stop=frozenset({3})) is None  # the caller's own stop set
    assert end_reason(3, 1, 10, p, 100, stop=frozenset({3})) == "stop"
