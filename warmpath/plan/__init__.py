"""``warmpath plan``: the capacity search — which topology serves a workload best on a GPU budget, found in the simulator."""
