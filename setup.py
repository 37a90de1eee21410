"""The one compiled part: ``warmpath.kv._blockhash``, the block hash chain in C (native/blockhash.c)
and a set of block keys (native/keyset.c, native/keyruns.c).

Everything else is in pyproject.toml. ``optional``: where no C compiler exists the install
still succeeds and ``kv/hashing.py`` hashes in Python (same keys, ~10x slower);
tests/kv/test_native_hashing.py fails there, so CI notices.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("warmpath.kv._blockhash", sources=["native/blockhash.c", "native/keyset.c", "native/keyruns.c"], include_dirs=["native"],
                             depends=["native/xxhash.h", "native/keyset.h"], extra_compile_args=["-O3"], optional=True)])
