"""The compiled parts, each optional (where no C compiler exists the install still succeeds
and a Python path runs; a test fails there, so CI notices):

* ``warmpath.kv._blockhash``: the block hash chain in C (native/blockhash.c) and a set of
  block keys (native/keyset.c, native/keyruns.c); without it ``kv/hashing.py`` hashes in
  Python (same keys, ~10x slower; tests/kv/test_native_hashing.py fails).
* ``warmpath.models._paged``: decode attention over the paged KV cache, read in place
  (native/paged_decode.c on native/taskpool.c: torch's own OpenMP team); without it
  ``models/paged_decode_op.py`` runs torch code (tests/models/test_paged_decode_op.py fails).
* ``warmpath.models._qlinear``: the weight-only grouped int8 / int4 linears of
  ``--quantization int8w | int4w`` (native/qlinear.c on the same team); without it
  ``models/qlinear_op.py`` runs torch code (tests/models/test_qlinear_op.py fails).
* ``warmpath.models._qlinear_a8``: the same weights times int8 activations with integer dot
  products (``--quantization int8a8 | int4a8``, native/qlinear_a8.c; AVX-512 VNNI, else portable
  C); without it ``models/qlinear_a8_op.py`` runs torch code (tests/models/test_qlinear_a8_op.py fails).
* ``warmpath.models._fused``: a decoder layer's residual add + RMSNorm and SiLU × up in one call
  each, for the int8-activation modes (native/fused.c); without it ``models/fused_op.py`` leaves
  them to torch (tests/models/test_fused_op.py fails).
* ``warmpath.models._rope``: rotary embedding of a step's queries and keys in one call, bit for
  bit the torch formulation (native/rope.c); without it ``models/rope_op.py`` leaves it to torch
  (tests/models/test_rope_op.py fails).

Everything else is in pyproject.toml.
"""

from setuptools import Extension, setup

setup(ext_modules=[
    Extension("warmpath.kv._blockhash", sources=["native/blockhash.c", "native/keyset.c", "native/keyruns.c"], include_dirs=["native"],
              depends=["native/xxhash.h", "native/keyset.h"], extra_compile_args=["-O3"], optional=True),
    Extension("warmpath.models._paged", sources=["native/paged_decode.c", "native/taskpool.c"], include_dirs=["native"],
              depends=["native/taskpool.h", "native/vecmath.h"], extra_compile_args=["-O3", "-pthread", "-fopenmp", "-Wno-psabi"], extra_link_args=["-pthread", "-fopenmp"],
              optional=True),
    Extension("warmpath.models._qlinear", sources=["native/qlinear.c", "native/taskpool.c"], include_dirs=["native"],
              depends=["native/qlinear_call.h", "native/taskpool.h", "native/vecmath.h"], extra_compile_args=["-O3", "-pthread", "-fopenmp", "-ffp-contract=off"],
              extra_link_args=["-pthread", "-fopenmp"], optional=True),
    Extension("warmpath.models._qlinear_a8", sources=["native/qlinear_a8.c", "native/taskpool.c"], include_dirs=["native"],
              depends=["native/qlinear_call.h", "native/taskpool.h", "native/vecmath.h"], extra_compile_args=["-O3", "-pthread", "-fopenmp", "-ffp-contract=off"],
              extra_link_args=["-pthread", "-fopenmp"], optional=True),
    Extension("warmpath.models._fused", sources=["native/fused.c", "native/taskpool.c"], include_dirs=["native"],
              depends=["native/taskpool.h", "native/vecmath.h"], extra_compile_args=["-O3", "-pthread", "-fopenmp", "-ffp-contract=off", "-Wno-psabi"],
              extra_link_args=["-pthread", "-fopenmp"], optional=True),
    Extension("warmpath.models._rope", sources=["native/rope.c"], extra_compile_args=["-O3", "-ffp-contract=off"],
              optional=True),
])
