"""Wire types shared by the router and the workers (pydantic models, no torch, no engine).

* ``openai``: the public OpenAI-compatible request models, every field typed and range-checked.
* ``internal``: router ↔ worker messages (``/internal/*``).
* ``errors``: the OpenAI error shape every 4xx/5xx uses.
* ``http``: bounded JSON bodies and the error handlers both FastAPI apps install.
"""
