"""Does a running cluster stay correct and bounded: faults under load, fuzzing, memory, soak."""
