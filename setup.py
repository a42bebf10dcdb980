"""kvsched's one compiled module, the compiled scheduler (Cython to C++: optimized/compiled.pyx).

Everything else about the package is in pyproject.toml. The module is optional: where it
cannot be built (no C++ compiler), kvsched installs without it, and `kvsched simulate`
falls back to the reference scheduler (docs/optimized.md).
"""

from Cython.Build import cythonize
from setuptools import Extension, setup

setup(ext_modules=cythonize(
    [Extension("kvsched.optimized.compiled", ["src/kvsched/optimized/compiled.pyx"],
               language="c++", optional=True)],
    quiet=True))
