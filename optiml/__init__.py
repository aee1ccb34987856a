"""OptiML: turns a CUDA kernel into a faster one that is proven correct.

The public API is re-exported from `optiml.api`; the CLI and the language server use nothing else.
"""

__version__ = "0.1.0"
