"""Reading Prometheus text exposition (``/metrics``) with ``prometheus_client.parser``.

Sample names are the exposed ones: a counter ``foo`` is read as ``foo_total``, a histogram
``bar`` as ``bar_count`` / ``bar_sum`` / ``bar_bucket``.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample


def samples(text: str) -> Iterator[Sample]:
    """Every sample of an exposition, in order."""
    for family in text_string_to_metric_families(text):
        yield from family.samples


def sample_value(text: str, name: str, **labels) -> float | None:
    """The first sample named ``name`` whose labels include ``labels`` (values compared as
    strings); ``None`` when there is none."""
    want = {k: str(v) for k, v in labels.items()}
    for s in samples(text):
        if s.name == name and all(s.labels.get(k) == v for k, v in want.items()):
            return s.value
    return None


def warmpath_totals(text: str) -> dict[str, float]:
    """Every ``warmpath_*`` sample summed over its labels, keyed by sample name, except that a
    ``tier`` label keeps its own key ``name:tier`` (e.g. ``warmpath_kv_tier_loaded_tokens_total:L2``)."""
    out: dict[str, float] = {}
    for s in samples(text):
        if s.name.startswith("warmpath_"):
            key = s.name + (f":{s.labels['tier']}" if "tier" in s.labels else "")
            out[key] = out.get(key, 0.0) + s.value
    return out
