from warmpath.engine.sequence import SamplingParams, Sequence
from warmpath.kv.hashing import KVNamespace

NS = KVNamespace("test", "r", "float32", 4)


def make_seq(rid: str, n: int, start: int = 0, max_tokens: int = 8, salt: str = "", priority: int = 0) -> Sequence:
    return Sequence(rid, list(range(start, start + n)), SamplingParams(max_tokens=max_tokens, temperature=0, priority=priority),
                    NS.with_salt(salt))
