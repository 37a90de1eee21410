"""The fit every calibration is written through (``warmpath calibrate``, ``--engine vllm``):
timed steps → ``StepProfile.fit`` → the step model, the PPD table filled from it and what the
calibration file keeps of them (torch-free)."""

from __future__ import annotations


def fitted(prof, kv_bytes_per_token: int, l3_gbps: float, network_gbps: float) -> tuple:
    """``prof`` fitted (``StepProfile.fit``) and what a calibration file holds of it: the step
    model, the PPD table filled from it, the KV bytes per token and the timed steps (for
    ``--refit``). Every engine's calibration (``--engine vllm`` too) is written through here."""
    from warmpath.routing.ppd import table_from_model

    model = prof.fit()
    table = table_from_model(model, kv_bytes_per_token, l3_gbps * 1e9, network_gbps * 1e9)
    return model, {"kv_bytes_per_token": kv_bytes_per_token, "step_model": model.to_json(),
                   "ppd_table": table.to_json(),
                   "profile": {"prefill": prof.prefill, "decode": prof.decode, "mixed": prof.mixed}}


def print_fit(model) -> None:
    """The fitted step model's lines, in words."""
    a0, a1, a2 = model.prefill_coef
    d0, d1, d2 = model.decode_coef
    print(f"prefill: {a0 * 1e3:.2f} ms + {a1 * 1e3:.3f} ms/token + {a2 * 1e6:.4f} us/token/ctx-token")
    print(f"decode:  {d0 * 1e3:.2f} ms + {d1 * 1e3:.3f} ms/seq + {d2 * 1e6:.4f} us/seq/ctx-token")
    print(f"mixed:   {model.mixed_form}" + (
        " ({:.2f} ms + {:.3f} ms/token + {:.4f} us/token/ctx-token + {:.3f} ms/seq + {:.4f} us/seq/ctx-token)"
        .format(*(k * f for k, f in zip(model.mixed_coef, (1e3, 1e3, 1e6, 1e3, 1e6)))) if model.mixed_coef else ""))
