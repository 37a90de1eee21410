import numpy as np
import pytest

from warmpath.kv.block_codec import HEADER_SIZE, BlockFormatError, check_block, encode_header

SHAPE = (2, 2, 4, 1, 8)
H = b"h" * 16


def block():
    payload = np.arange(int(np.prod(SHAPE)), dtype=np.float32).view(np.uint8)
    buf = np.zeros(HEADER_SIZE + payload.nbytes, dtype=np.uint8)
    buf[HEADER_SIZE:] = payload
    encode_header(memoryview(buf), H, "float32", SHAPE, memoryview(buf[HEADER_SIZE:]))
    return buf


def test_roundtrip_ok():
    check_block(memoryview(block()), H, "float32", SHAPE)


@pytest.mark.parametrize("mutate,msg", [
    (lambda b: b.__setitem__(HEADER_SIZE + 5, b[HEADER_SIZE + 5] ^ 1), "checksum"),
    (lambda b: b.__setitem__(0, 0), "magic"),
])
def test_corruption_detected(mutate, msg):
    b = block()
    mutate(b)
    with pytest.raises(BlockFormatError, match=msg):
        check_block(memoryview(b), H, "float32", SHAPE)


def test_truncated_wrong_hash_wrong_layout():
    b = block()
    with pytest.raises(BlockFormatError, match="truncated"):
        check_block(memoryview(b[:-4]), H, "float32", SHAPE)
    with pytest.raises(BlockFormatError, match="hash"):
        check_block(memoryview(b), b"x" * 16, "float32", SHAPE)
    with pytest.raises(BlockFormatError, match="layout"):
        check_block(memoryview(b), H, "bfloat16", SHAPE)
