"""Kernels: torch-facing wrappers of ``sssd._cuda`` (tree attention, KV commit) and of the CPU kernels of
``sssd._core`` (``linear``: the linear layers of a verification forward), and their references.

``tree_attention`` checks devices, dtypes, shapes and contiguity and passes raw pointers and the stream
to the extension (which never links libtorch); ``reference`` holds the float64 references and the host
emulation of the kernels' tiling that the tests compare against.

Imports: torch, numpy, ``sssd._cuda`` (the kernels) and ``sssd._core`` (the host emulation of their
tiling, for ``reference``). Nothing else of sssd.
"""
