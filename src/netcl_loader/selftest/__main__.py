"""``python -m netcl_loader.selftest [--quick] [--json] [--require-opencl]``: the command line."""
import sys

from .harness import main

if __name__ == "__main__":
    sys.exit(main())
