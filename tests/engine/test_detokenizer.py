from warmpath.engine.detokenizer import IncrementalDetokenizer


class CharTok:
    """Token id = unicode code point; 0xFFFD-ending partials simulated by id -1."""

    def decode(self, ids, skip_special=True):
        return "".join("\ufffd" if i < 0 else chr(i) for i in ids)


def feed(det, text):
    out, ids = [], []
    for ch in text:
        ids.append(ord(ch))
        out.append(det.update(ids))
    return out


def test_plain_deltas():
    det = IncrementalDetokenizer(CharTok(), ())
    assert feed(det, "abc") == ["a", "b", "c"]


def test_stop_string_is_held_back_then_cut():
    det = IncrementalDetokenizer(CharTok(), ("END",))
    out = feed(det, "xyENDzz")
    assert out[:5] == ["x", "y", "", "", ""]
    assert det.stopped and det.text == "xy"
    assert "".join(out) == "xy"


def test_partial_stop_released_when_it_diverges():
    det = IncrementalDetokenizer(CharTok(), ("END",))
    out = feed(det, "aENx")
    assert out == ["a", "", "", "ENx"] and not det.stopped


def test_final_flushes_held_text():
    det = IncrementalDetokenizer(CharTok(), ("END",))
    ids = [ord(c) for c in "aE"]
    assert det.update(ids[:1]) == "a"
    assert det.update(ids) == ""
    assert det.update(ids, final=True) == "E"


def test_incomplete_utf8_waits():
    det = IncrementalDetokenizer(CharTok(), ())
    assert det.update([ord("a"), -1]) == ""
    assert det.update([ord("a"), ord("b")]) == "ab"


def test_no_tokenizer_gives_no_text():
    assert IncrementalDetokenizer(None, ()).update([1, 2]) == ""
