"""Build of the compiled core: every ``src/netcl_loader/*.pyx`` is one extension.

Flags: ``-O3 -Wall`` by default (``/O2 /W3`` under MSVC).  ``NETCL_LOADER_DEBUG=1``
builds with ``-O0 -g`` and Cython line tracing (for coverage and profilers);
``NETCL_LOADER_DEBUG=asan`` adds AddressSanitizer and UndefinedBehaviorSanitizer
(run Python with ``LD_PRELOAD=$(gcc -print-file-name=libasan.so)``).

Cython turns the ``.pyx`` into C when it is installed; without it (an sdist
installed with ``--no-build-isolation``) the generated C that the sdist carries
is compiled instead, so an sdist builds with a C compiler alone.

The JPEG decoder ``_jpeg`` links libjpeg(-turbo), in one of two ways:

- ``JPEG_STATIC_LIB=/path/libjpeg.a`` (with ``JPEG_INCLUDE_DIR``): the static
  library is linked in and none of its symbols is exported, so the module never
  clashes with the libjpeg inside Pillow or OpenCV.  The wheels are built so
  (``.ci/wheel``).
- otherwise the system's shared libjpeg, when the compiler finds ``jpeglib.h``
  and the library (``JPEG_INCLUDE_DIR`` and ``JPEG_LIB_DIR`` add search
  directories); without them one warning is printed and the rest is built
  (JPEG files are then decoded with Pillow).

Everything else about the package lives in ``pyproject.toml``.
"""
import os
import sys
import tempfile
from glob import glob

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

try:
    from Cython.Build import cythonize
except ImportError:  # an sdist carries the generated C
    cythonize = None

DEBUG = os.environ.get("NETCL_LOADER_DEBUG", "").strip().lower()

# Flags by compiler family, not by platform: mingw-w64 on Windows takes gcc's.
if not DEBUG:
    GCC_ARGS, MSVC_ARGS = ["-O3", "-Wall", "-std=c11"], ["/O2", "/W3"]
else:
    GCC_ARGS, MSVC_ARGS = ["-O0", "-g", "-Wall", "-std=c11"], ["/Od", "/Zi"]
GCC_LINK_ARGS = []
if DEBUG == "asan":
    sanitize = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer"]
    GCC_ARGS = GCC_ARGS + sanitize
    GCC_LINK_ARGS = GCC_LINK_ARGS + sanitize
VERSION_SCRIPT = "csrc/netcl_module.map"
# WaitOnAddress and WakeByAddressAll live in the Synchronization API set.
WINDOWS_LIBRARIES = ["synchronization"]

macros = []
directives = {"language_level": "3", "boundscheck": False, "wraparound": False}
if DEBUG:
    macros += [("CYTHON_TRACE", "1"), ("CYTHON_TRACE_NOGIL", "1")]
    directives["linetrace"] = True

# Sources compiled into every extension, except the libjpeg decoder which goes
# only into _jpeg (it needs the library at link time).
JPEG_SOURCES = ["csrc/netcl_jpeg.c"]
COMMON_SOURCES = [c for c in sorted(glob("csrc/*.c")) if c not in JPEG_SOURCES]


class BuildExt(build_ext):
    """Adds the flags of the compiler family that build_ext picked."""

    def build_extensions(self):
        kind = self.compiler.compiler_type
        for ext in self.extensions:
            if kind == "msvc":
                ext.extra_compile_args = MSVC_ARGS + ext.extra_compile_args
            else:
                ext.extra_compile_args = GCC_ARGS + ext.extra_compile_args
                ext.extra_link_args = GCC_LINK_ARGS + ext.extra_link_args
                if sys.platform.startswith("linux"):
                    # Only PyInit_<name> is exported: the symbols of a static
                    # libjpeg-turbo and of csrc/ stay inside the module.
                    ext.extra_link_args = ext.extra_link_args + [
                        "-Wl,--version-script=" + VERSION_SCRIPT]
            if sys.platform == "win32":
                ext.libraries = ext.libraries + WINDOWS_LIBRARIES
        super().build_extensions()


def find_libjpeg():
    """(include_dirs, library_dirs) with which a libjpeg program compiles and
    links, or (None, reason)."""
    from setuptools._distutils.ccompiler import new_compiler
    from setuptools._distutils.errors import CompileError, LinkError
    from setuptools._distutils.sysconfig import customize_compiler

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


def jpeg_linkage():
    """Extension keywords that link libjpeg, or None (with the warning said)."""
    static = os.environ.get("JPEG_STATIC_LIB")
    if static:
        include = os.environ.get("JPEG_INCLUDE_DIR")
        if not os.path.isfile(static) or not include or not os.path.isfile(
                os.path.join(include, "jpeglib.h")):
            sys.exit(f"JPEG_STATIC_LIB={static!r} needs the library file and JPEG_INCLUDE_DIR "
                     f"(now {include!r}) holding its jpeglib.h and jconfig.h")
        return dict(include_dirs=[include], extra_objects=[static])
    found, why = find_libjpeg()
    if found is None:
        print(f"WARNING: netcl_loader is built without its JPEG decoder: {why}. JPEG "
              f"files will be decoded with Pillow (slower). Install the wheel, which has "
              f"libjpeg-turbo inside, or install the libjpeg-turbo headers (apt-get install "
              f"libjpeg62-turbo-dev, or libjpeg-dev; brew install jpeg-turbo) or point "
              f"JPEG_INCLUDE_DIR and JPEG_LIB_DIR at them, then rebuild.", file=sys.stderr)
        return None
    return dict(include_dirs=found[0], library_dirs=found[1], libraries=["jpeg"])


def source_of(pyx):
    """The .pyx when Cython is here to translate it, else the C an sdist carries."""
    if cythonize is not None:
        return pyx
    c = os.path.splitext(pyx)[0] + ".c"
    if not os.path.isfile(c):
        sys.exit(f"{c} is missing and Cython is not installed: install Cython (pip install "
                 f"'Cython>=3.0') to build from a clone, or build from the sdist, which "
                 f"carries the generated C")
    return c


def extension(pyx):
    """The extension of one .pyx, or None for _jpeg when no libjpeg is found."""
    name = os.path.splitext(os.path.basename(pyx))[0]
    kw = dict(sources=[source_of(pyx)] + COMMON_SOURCES, include_dirs=["csrc"])
    if name == "_jpeg":
        linkage = jpeg_linkage()
        if linkage is None:
            return None
        kw["sources"] = [source_of(pyx)] + JPEG_SOURCES
        kw["include_dirs"] = kw["include_dirs"] + linkage.pop("include_dirs")
        kw.update(linkage)
    return Extension("netcl_loader." + name, define_macros=macros, **kw)


PYX = sorted(glob("src/netcl_loader/*.pyx"))
extensions = [e for e in map(extension, PYX) if e]
if cythonize is not None:
    # Every .pyx is translated, _jpeg too where it is not compiled here, so
    # that an sdist made on any machine carries the C of every module.
    built = {e.name for e in extensions}
    extensions = [e for e in cythonize(
        extensions + [Extension("netcl_loader." + os.path.basename(p)[:-4], [p])
                      for p in PYX if "netcl_loader." + os.path.basename(p)[:-4] not in built],
        compiler_directives=directives) if e.name in built]

setup(ext_modules=extensions, cmdclass={"build_ext": BuildExt})
