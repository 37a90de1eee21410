"""Do we reproduce the published results: the PPD paper and the CPD blog's figure 4 (in the
simulator), and which assumptions explain the gaps."""
