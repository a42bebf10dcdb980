"""kvsched's compiled modules (Cython to C++): the compiled scheduler (optimized/compiled.pyx)
and the fast checker's state (optimized/state.pyx).

Everything else about the package is in pyproject.toml. The modules are optional: where
they cannot be built (no C++ compiler, or an install without build isolation into an
environment without Cython, such as `make vllm-plugin`'s into vLLM's), kvsched installs
without them, `kvsched simulate` falls back to the reference scheduler and `kvsched
check` to the spec's checker (docs/optimized.md).
"""

from setuptools import Extension, setup

try:
    from Cython.Build import cythonize
except ImportError:
    ext_modules = []
else:
    ext_modules = cythonize(
        [Extension("kvsched.optimized.compiled", ["src/kvsched/optimized/compiled.pyx"],
                   # the parts it includes, so that an sdist holds them
                   depends=[f"src/kvsched/optimized/compiled{part}" for part in (
                       ".pyx", "_blocks.pxi", "_writer.pxi", "_replay.pxi",
                       "_simulation.pxi")] + ["src/kvsched/optimized/columns.pxi"],
                   language="c++", optional=True),
         Extension("kvsched.optimized.state", ["src/kvsched/optimized/state.pyx"],
                   depends=["src/kvsched/optimized/columns.pxi"],
                   language="c++", optional=True)],
        quiet=True)
    # cythonize() hands back new Extensions without `optional`: set it again, so that
    # setuptools' build_ext leaves out, with a warning, a module that fails to build (no
    # compiler, or one that fails) instead of failing the install.
    for extension in ext_modules:
        extension.optional = True

setup(ext_modules=ext_modules)
