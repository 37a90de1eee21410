"""A fleet of two engines' KV namespaces (routing/namespaces.py), hand-worked: the registration
rules, hits counted in the request's blocks, and the same prompt's keys per namespace in one
real GlobalKVIndex (never confused)."""

import pytest

from warmpath.kv.events import BlockStored
from warmpath.kv.hashing import KVNamespace, hash_prefix_blocks
from warmpath.routing.index import GlobalKVIndex
from warmpath.routing.namespaces import FleetNamespaces, in_request_blocks, same_model
from warmpath.routing.views import PrefixHit

OURS = KVNamespace("SmolLM2", "abc123", "float32", 16, "tok")
VLLM = KVNamespace("SmolLM2", "vllm:smollm2", "vllm-auto", 32, "tok")
OTHER = KVNamespace("Llama", "r", "float32", 16, "tok2")


def test_hits_are_counted_in_the_requests_blocks():
    assert in_request_blocks(PrefixHit(3, 1), 32, 16) == PrefixHit(6, 2)    # 96 + 32 tokens
    assert in_request_blocks(PrefixHit(3, 1), 16, 32) == PrefixHit(1, 1)    # 48 -> 1 block; 64 -> 2
    assert in_request_blocks(PrefixHit(5, 0), 16, 16) == PrefixHit(5, 0)
    assert same_model(OURS, VLLM) and not same_model(OURS, OTHER)


def test_registration_rules():
    f = FleetNamespaces()
    f.admit("p0", "prefill", OURS, None)
    f.admit("d0", "decode", OURS, OURS)
    f.admit("v0", "replica", VLLM, OURS)                    # another engine: as a replica
    with pytest.raises(ValueError, match="a handoff never crosses namespaces"):
        f.admit("v1", "decode", VLLM, OURS)
    with pytest.raises(ValueError, match="different model"):
        f.admit("x", "replica", OTHER, OURS)
    assert f.others(OURS) == [VLLM] and f.others(VLLM) == [OURS]
    f.drop("p0")
    f.drop("d0")                                            # no P/D worker left: any namespace may hold them
    f.admit("v1", "decode", VLLM, OURS)
    assert f.pd == {"v0": False, "v1": True} and "v1" not in f.others(VLLM) and f.others(OURS) == [VLLM]


def test_the_pd_roles_are_held_by_one_engine():
    f = FleetNamespaces()
    f.admit("p0", "prefill", OURS, None)                    # warmpath's P/D: a vLLM decode worker is refused
    with pytest.raises(ValueError, match=r"worker v1 \(vllm\): the P/D roles are held by warmpath workers; "
                                         "a hand-off never crosses engines"):
        f.admit("v1", "decode", VLLM, OURS, "vllm")
    f.admit("v0", "replica", VLLM, OURS, "vllm")            # as a replica it serves
    assert (f.engine_of("p0"), f.engine_of("v0"), f.engine_of("v1")) == ("warmpath", "vllm", "warmpath")
    g = FleetNamespaces()                                   # vLLM's P/D: a warmpath prefill worker is refused
    g.admit("vp", "prefill", VLLM, None, "vllm")
    g.admit("vd", "decode", VLLM, VLLM, "vllm")
    with pytest.raises(ValueError, match=r"worker p0 \(warmpath\): the P/D roles are held by vllm workers"):
        g.admit("p0", "prefill", OURS, VLLM)
    g.drop("vp")
    assert g.engine == {"vd": "vllm"} and g.pd == {"vd": True}


def test_one_index_holds_both_namespaces_keys_apart():
    tokens = list(range(1000, 1100))                        # 6 blocks of 16, 3 of 32
    ours, theirs = hash_prefix_blocks(OURS, tokens), hash_prefix_blocks(VLLM, tokens)
    assert (len(ours), len(theirs)) == (6, 3) and not set(ours) & set(theirs)
    idx = GlobalKVIndex()
    idx.apply("w0", [BlockStored(ours[:2], None, tokens[:32], 16, "L1")], 0.0)
    idx.apply("v0", [BlockStored(theirs, None, tokens[:96], 32, "L1")], 0.0)
    # each looked up with its own namespace's keys: w0 holds 32 tokens, v0 96 (6 request blocks)
    assert idx.lookup("w0", ours, 0.0) == PrefixHit(2, 0)
    assert in_request_blocks(idx.lookup("v0", theirs, 0.0), 32, 16) == PrefixHit(6, 0)
    # and with the other's keys, nothing
    assert idx.lookup("v0", ours, 0.0) == PrefixHit(0, 0) and idx.lookup("w0", theirs, 0.0) == PrefixHit(0, 0)
