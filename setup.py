"""Build of the compiled core: every ``src/netcl_loader/*.pyx`` is one extension.

Flags: ``-O3 -Wall`` by default.  ``NETCL_LOADER_DEBUG=1`` builds with ``-O0 -g``
and Cython line tracing (for coverage and profilers); ``NETCL_LOADER_DEBUG=asan``
adds AddressSanitizer and UndefinedBehaviorSanitizer (run Python with
``LD_PRELOAD=$(gcc -print-file-name=libasan.so)``).
The JPEG decoder ``_jpeg`` links libjpeg(-turbo): it is built only when the
compiler finds ``jpeglib.h`` and the library (``JPEG_INCLUDE_DIR`` and
``JPEG_LIB_DIR`` add search directories); without them one warning is printed
and the rest is built (JPEG files are then decoded with Pillow).
Everything else about the package lives in ``pyproject.toml``.
"""
import os
import sys
import tempfile
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

# Sources compiled into every extension, except the libjpeg decoder which goes
# only into _jpeg (it needs the library at link time).
JPEG_SOURCES = ["csrc/netcl_jpeg.c"]
COMMON_SOURCES = [c for c in sorted(glob("csrc/*.c")) if c not in JPEG_SOURCES]


def find_libjpeg():
    """(include_dirs, library_dirs) with which a libjpeg program compiles and
    links, or (None, reason)."""
    from distutils.ccompiler import new_compiler
    from distutils.errors import CompileError, LinkError
    from distutils.sysconfig import customize_compiler

    include_dirs = [d for d in [os.environ.get("JPEG_INCLUDE_DIR")] if d]
    library_dirs = [d for d in [os.environ.get("JPEG_LIB_DIR")] if d]
    for prefix in ("/opt/homebrew/opt/jpeg-turbo", "/usr/local/opt/jpeg-turbo"):
        if not include_dirs and os.path.isdir(prefix):  # Homebrew keeps it out of the defaults
            include_dirs, library_dirs = [prefix + "/include"], [prefix + "/lib"]
    compiler = new_compiler()
    customize_compiler(compiler)
    with tempfile.TemporaryDirectory() as tmp:
        probe = os.path.join(tmp, "probe.c")
        with open(probe, "w") as f:
            f.write("#include <stdio.h>\n#include <jpeglib.h>\nint main(void) {\n"
                    "  struct jpeg_decompress_struct c; struct jpeg_error_mgr e;\n"
                    "  c.err = jpeg_std_error(&e); jpeg_create_decompress(&c);\n"
                    "  jpeg_destroy_decompress(&c); return 0;\n}\n")
        # The compiler's own complaints would only bury the one warning below.
        saved = os.dup(2)
        try:
            with open(os.devnull, "w") as null:
                os.dup2(null.fileno(), 2)
            try:
                objects = compiler.compile([probe], output_dir=tmp, include_dirs=include_dirs)
            except CompileError:
                return None, "jpeglib.h not found"
            try:
                compiler.link_executable(objects, os.path.join(tmp, "probe"),
                                         libraries=["jpeg"], library_dirs=library_dirs)
            except LinkError:
                return None, "the libjpeg library (-ljpeg) not found"
        finally:
            os.dup2(saved, 2)
            os.close(saved)
    return (include_dirs, library_dirs), None


def extension(pyx):
    name = os.path.splitext(os.path.basename(pyx))[0]
    sources, libraries, include_dirs, library_dirs = [pyx] + COMMON_SOURCES, [], ["csrc"], []
    if name == "_jpeg":
        found, why = find_libjpeg()
        if found is None:
            print(f"WARNING: netcl_loader is built without its JPEG decoder: {why}. JPEG "
                  f"files will be decoded with Pillow (slower). To build it, install the "
                  f"libjpeg-turbo headers (apt-get install libjpeg62-turbo-dev, or "
                  f"libjpeg-dev; brew install jpeg-turbo) or point JPEG_INCLUDE_DIR and "
                  f"JPEG_LIB_DIR at them, then rebuild.", file=sys.stderr)
            return None
        sources = [pyx] + JPEG_SOURCES
        include_dirs += found[0]
        library_dirs += found[1]
        libraries = ["jpeg"]
    return Extension(
        "netcl_loader." + name,
        sources=sources,
        include_dirs=include_dirs,
        library_dirs=library_dirs,
        libraries=libraries,
        define_macros=macros,
        extra_compile_args=compile_args,
        extra_link_args=link_args,
    )


extensions = [e for e in map(extension, sorted(glob("src/netcl_loader/*.pyx"))) if e]

setup(ext_modules=cythonize(extensions, compiler_directives=directives))
