"""The sites of the patched jax.experimental that keep relative identities,
with why: its modules are written against the public ``jax.tree`` and
``jax.tree_util`` API (none is patched, but 0012's leaf files), so they lay
trees out as that API does, keeping relative identities. Keys as in
``tree_sites_declared.py``, with the module's full name.
"""

from tree_sites_declared import SHARING

_USERS_TREES = (
    "the public tree API on the user's trees: a node they share is one "
    "object, as jax.tree.map keeps it"
)

SITES = {
    # Functions of each leaf of the user's tree: a shared node once.
    ("jax.experimental.multihost_utils", "*", "*"): (
        SHARING,
        "functions of each leaf of the user's tree (broadcasts, gathers, "
        "equality checks, host-local and global arrays): each leaf once, "
        "the tree's ties kept",
    ),
    ("jax.experimental.array_serialization.pytree_serialization", "*", "*"): (
        SHARING,
        "save and load a user's tree: a shared node's arrays written once; "
        "its treedef is written by jax.export's serialization, which "
        "refuses a treedef that shares (it cannot record sharing)",
    ),
    ("jax.experimental.array_serialization.serialization", "*", "*"): (
        SHARING,
        "arrays of the user's tree serialized leaf by leaf: each once",
    ),
    ("jax.experimental.array_serialization.tensorstore_impl", "*", "*"): (
        SHARING,
        "arrays of the user's tree serialized leaf by leaf: each once",
    ),
    ("jax.experimental.transfer", "*", "*"): (
        SHARING,
        "arrays of the user's tree pulled leaf by leaf: each once",
    ),
    # Transformations written on the public API: they flatten the user's
    # function's arguments and results with it, consistently.
    ("jax.experimental.sparse.transform", "*", "*"): (
        SHARING,
        "sparsify: " + _USERS_TREES + " (its flattens and unflattens all "
        "keep them, so a shared node is one sparse value)",
    ),
    ("jax.experimental.sparse.ad", "*", "*"): (SHARING, _USERS_TREES),
    ("jax.experimental.sparse.api", "todense", "*"): (SHARING, _USERS_TREES),
    ("jax.experimental.sparse.util", "*", "*"): (SHARING, _USERS_TREES),
    ("jax.experimental.sparse.test_util", "*", "*"): (
        SHARING,
        "test helpers comparing trees of arrays leaf by leaf",
    ),
    ("jax.experimental.jet", "*", "*"): (
        SHARING,
        "jet's primals and series, arrays the user passes (a node of "
        "theirs is refused as stock refuses it)",
    ),
    ("jax.experimental.ode", "*", "*"): (
        SHARING,
        "odeint's checks of the user's y0 and args, and the cotangents of "
        "its reverse pass, leaf by leaf",
    ),
    ("jax.experimental.serialize_executable", "serialize", "*"): (
        SHARING,
        "a compiled executable's argument trees, as its lowering laid them "
        "out",
    ),
    ("jax.experimental.leaf_files", "*", "*"): (
        SHARING,
        "a model's leaves and its untied layout, for load_leaves (0012)",
    ),
    ("jax.experimental.key_reuse._core", "*", "*"): (
        SHARING,
        "the key-reuse checker's signature of a function's arguments",
    ),
    # Interop and kernels, which take arrays and their own trees.
    ("jax.experimental.jax2tf.jax2tf", "*", "*"): (
        SHARING,
        "jax2tf's arguments and results: TensorFlow values, no node of a "
        "user's class",
    ),
    ("jax.experimental.jax2tf.call_tf", "*", "*"): (
        SHARING,
        "call_tf's arguments and results: TensorFlow values, no node of a "
        "user's class",
    ),
    ("jax.experimental.mosaic.gpu.core", "*", "*"): (
        SHARING,
        "Mosaic GPU kernels' operand and shared-memory trees: arrays and "
        "refs, no node of a user's class",
    ),
    ("jax.experimental.mosaic.gpu.utils", "*", "*"): (
        SHARING,
        "Mosaic GPU loop carries: MLIR values, no node of a user's class",
    ),
    ("jax.experimental.pallas.ops.tpu.flash_attention", "*", "*"): (
        SHARING,
        "a kernel's cost estimate over its operand arrays",
    ),
    (
        "jax.experimental.pallas.ops.tpu.splash_attention"
        ".splash_attention_kernel",
        "*",
        "*",
    ): (SHARING, "the kernel's own mask and block-index arrays"),
}
