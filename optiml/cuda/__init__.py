"""The CUDA source model: kernels, signatures, spec comments and translation units, on tree-sitter-cuda."""
