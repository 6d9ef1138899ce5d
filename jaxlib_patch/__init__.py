"""Relative identities for JAX pytrees.

`jaxlib_patch.pytree` is a drop-in replacement for the `pytree` submodule of
`jaxlib._jax` (same classes, methods and errors) whose registries also accept
``preserve_relative_identities=True``: nodes of such a class that occur several
times in one flatten are recorded once in the ``PyTreeDef``, and unflattening
builds them once, so the output shares them exactly where the input did.
"""
