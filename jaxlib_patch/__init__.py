"""Relative identities for JAX pytrees.

`jaxlib_patch.pytree` is a drop-in replacement for the `pytree` submodule of
`jaxlib._jax` (same classes, methods and errors) whose registries also accept
``preserve_relative_identities=True``: nodes of such a class that occur several
times in one flatten are recorded once in the ``PyTreeDef``, and unflattening
builds them once, so the output shares them exactly where the input did.
"""

import pkgutil

# The package's source folder (a checkout's jaxlib_patch/, which holds no
# built module) shadows the installed package for a program started in the
# checkout's root; every folder of this name on the path is part of the
# package, so `pytree` is found in the installed one too.
__path__ = pkgutil.extend_path(__path__, __name__)
