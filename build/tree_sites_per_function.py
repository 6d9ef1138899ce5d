"""The sites of the patched jax/_src where a public function that is no
entry point hands the user's tree on and gives a tree back (0010, 0011):
each keeps the tree's ties, or tells where it cannot. Keys and layouts as in
``tree_sites_declared.py``.
"""

from tree_sites_declared import PER_LEAF, RESULTS, FOLLOWS, SHARING

SITES = {
    # 0010: the same class, found by its shape: a public function that maps
    # the user's tree leaf by leaf (every collective of lax/parallel.py is a
    # `tree_map(bind, x)`), or hands it on as given.
    ("lax.parallel", "*", "tree_identities.tree_map"): (SHARING, PER_LEAF),
    ("ad_checkpoint", "checkpoint_name", "tree_identities.tree_map"): (
        SHARING,
        PER_LEAF,
    ),
    ("xla_metadata", "set_xla_metadata", "tree_identities.tree_map"): (
        SHARING,
        PER_LEAF,
    ),
    (
        "lax.control_flow.loops",
        "_batch_and_remainder",
        "default_registry.flatten",
    ): (SHARING, PER_LEAF),
    ("lax.control_flow.loops", "map", "tree_identities.tree_map"): (
        SHARING,
        "lax.map's batches put back together as they were cut: each leaf "
        "once",
    ),
    (
        "debugging",
        "_split_callback_args",
        "default_registry.flatten",
    ): (
        SHARING,
        "the arguments jax.debug.callback hands the callback: as given",
    ),
    (
        "checkify",
        "checkify.checked_fun",
        "tree_util.FlatTree.flatten[identity_tracing_registry]",
    ): (
        SHARING,
        "checkify's result, handed back to the user: keeping relative "
        "identities (its arguments are closed over)",
    ),
    (
        "ad_checkpoint",
        "_remat_arguments",
        "identity_tracing_registry.flatten",
    ): (
        SHARING,
        "checkpoint's arguments: an entry point, as jit's (its function sees "
        "the ties, and returns them)",
    ),
    # 0011: functions that hand the user's tree to the user's function and
    # give a tree back keep its ties; ravel_pytree tells where it cannot.
    ("lax.lax", "composite._decorator", "default_registry.flatten"): (
        SHARING,
        "composite's arguments: its decomposition sees the ties, as a "
        "function under jit does",
    ),
    (
        "lax.lax",
        "_trace_composite_to_jaxpr",
        "tree_util.FlatTree.flatten_args[in_layout_of(...)]",
    ): (FOLLOWS, RESULTS),
    (
        "lax.control_flow.loops",
        "associative_scan",
        "default_registry.flatten",
    ): (
        SHARING,
        "associative_scan's elements: fn sees a shared node as one object, "
        "and the result keeps it (laid out as stock where fn splits it, "
        "told)",
    ),
    (
        "lax.control_flow.loops",
        "_combined_leaves_keeping_ties",
        "default_registry.flatten",
    ): (
        SHARING,
        "associative_scan's fn result, read in the elements' layout where "
        "its places hold the very same leaves",
    ),
    (
        "lax.control_flow.loops",
        "scan3",
        "tree_util.FlatTree.flatten[identity_tracing_registry]",
    ): (
        SHARING,
        "scan3's carry, as scan's: one ref per shared node (laid out as "
        "stock where the body splits it, told)",
    ),
    (
        "lax.control_flow.loops",
        "scan3.write_carry",
        "tree_util.FlatTree.flatten[identity_tracing_registry]",
    ): (
        SHARING,
        "scan3's body output, read in the carry's layout where its places "
        "hold the very same values",
    ),
    ("flatten_util", "ravel_pytree", "default_registry.flatten"): (
        SHARING,
        "only the ties of the raveled tree, for unravel to tell that it "
        "rebuilds a copy per place (the vector is in stock's layout)",
    ),
    (
        "lax.lax",
        "_reduction_trees",
        "tree_util.default_registry (as a value)",
    ): (
        SHARING,
        "lax.reduce's and reduce_window's operands and init values: a node "
        "both share alike is one operand (else stock's layout, told)",
    ),
    (
        "lax.lax",
        "_variadic_reduction_jaxpr",
        "tree_identities.treedef_tuple (as a value)",
    ): (
        SHARING,
        "the reducer's two arguments, side by side, each keeping the "
        "operands' ties",
    ),
    (
        "lax.lax",
        "_variadic_reduction_jaxpr",
        "tree_util.FlatTree.flatten_args[in_layout_of(...)]",
    ): (FOLLOWS, RESULTS),
    (
        "custom_batching",
        "custom_vmap.__call__",
        "tree_identities.tree_structure",
    ): (
        SHARING,
        "only the ties of the arguments, for the call to tell that its "
        "function returned a copy per place",
    ),
    (
        "custom_derivatives",
        "closure_convert",
        "tree_identities.tree_structure",
    ): (
        SHARING,
        "only the ties of the example arguments, for the call to tell that "
        "the converted function returns a copy per place",
    ),
    (
        "compute_on",
        "_compute_on2.wrapped",
        "default_registry.flatten",
    ): (
        SHARING,
        "compute_on2's arguments: an entry point, as jit's (its function "
        "sees the ties, and returns them)",
    ),
    ("pjit", "with_layout_constraint", "default_registry.flatten"): (
        SHARING,
        PER_LEAF,
    ),
    ("pjit", "reshard", "default_registry.flatten"): (
        SHARING,
        PER_LEAF,
    ),
}
