"""vLLM workers behind warmpath's router: the server process, its model directory, the
relay of ``/internal/generate`` onto vLLM's OpenAI API, load from its ``/metrics`` and its KV
events re-keyed for the router's index. Talks HTTP and ZeroMQ only: never imports vllm."""
