"""``warmpath calibrate``: measure this machine's engine (isolated steps, then the served topology) for the router's PPD table and the simulator's CPU profile."""
