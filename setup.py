"""kvsched's one compiled module, the compiled scheduler (Cython to C++: optimized/compiled.pyx).

Everything else about the package is in pyproject.toml. The module is optional: where it
cannot be built (no C++ compiler, or an install without build isolation into an
environment without Cython, such as `make vllm-plugin`'s into vLLM's), kvsched installs
without it, and `kvsched simulate` falls back to the reference scheduler
(docs/optimized.md).
"""

from setuptools import Extension, setup

try:
    from Cython.Build import cythonize
except ImportError:
    ext_modules = []
else:
    ext_modules = cythonize(
        [Extension("kvsched.optimized.compiled", ["src/kvsched/optimized/compiled.pyx"],
                   language="c++", optional=True)],
        quiet=True)

setup(ext_modules=ext_modules)
