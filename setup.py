"""Build of the compiled core: every ``src/netcl_loader/*.pyx`` is one extension.

Flags: ``-O3 -Wall`` by default.  ``NETCL_LOADER_DEBUG=1`` builds with ``-O0 -g``
and Cython line tracing (for coverage and profilers); ``NETCL_LOADER_DEBUG=asan``
adds AddressSanitizer and UndefinedBehaviorSanitizer (run Python with
``LD_PRELOAD=$(gcc -print-file-name=libasan.so)``).
Everything else about the package lives in ``pyproject.toml``.
"""
import os
import sys
from glob import glob

from Cython.Build import cythonize
from setuptools import Extension, setup

DEBUG = os.environ.get("NETCL_LOADER_DEBUG", "").strip().lower()

if sys.platform == "win32":
    compile_args = ["/O2", "/W3"] if not DEBUG else ["/Od", "/Zi"]
    link_args = []
else:
    compile_args = ["-O3", "-Wall", "-std=c11"] if not DEBUG else ["-O0", "-g", "-Wall", "-std=c11"]
    link_args = []
    if DEBUG == "asan":
        sanitize = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer"]
        compile_args += sanitize
        link_args += sanitize

macros = []
directives = {"language_level": "3", "boundscheck": False, "wraparound": False}
if DEBUG:
    macros += [("CYTHON_TRACE", "1"), ("CYTHON_TRACE_NOGIL", "1")]
    directives["linetrace"] = True

extensions = [
    Extension(
        "netcl_loader." + os.path.splitext(os.path.basename(pyx))[0],
        sources=[pyx] + sorted(glob("csrc/*.c")),
        include_dirs=["csrc"],
        define_macros=macros,
        extra_compile_args=compile_args,
        extra_link_args=link_args,
    )
    for pyx in sorted(glob("src/netcl_loader/*.pyx"))
]

setup(ext_modules=cythonize(extensions, compiler_directives=directives))
