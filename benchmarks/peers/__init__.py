"""How warmpath compares with other serving stacks on the same machine: llama.cpp's
``llama-server`` and the SGLang / vLLM routers in front of warmpath workers."""
