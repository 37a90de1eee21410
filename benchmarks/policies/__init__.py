"""Which routing policy sustains the most load: CPD vs PD vs KV-aware pools vs replicas, on the
real engine and in the simulator, and how long the router takes to decide."""
