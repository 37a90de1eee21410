"""The routing decision and its bookkeeping, pure (no FastAPI, httpx, torch or sockets): the
router process (``warmpath/router/``) and the simulator (``warmpath/sim/``) both drive it."""
