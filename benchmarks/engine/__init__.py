"""How fast is the engine itself: prefill and decode against transformers, where a decode
step's time goes, and time to first token from each KV tier."""
