"""How close the simulator is to the real cluster (and how fast it is), with the inputs its CPU
profile takes from real runs."""
