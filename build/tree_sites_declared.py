"""The sites of the patched jax/_src that keep relative identities, choose
their layout, or flatten with a registry ``tree_sites.py`` cannot name: each
with its layout and why. ``tree_sites.py`` fails on such a site that is not
here, and on an entry here that matches no site.

A key is (module under jax._src, enclosing function, call), as the failure
message gives it; the function or the call may be ``"*"``. Layouts:
``sharing`` keeps relative identities, ``follows`` takes the layout of trees
it is given (results follow arguments), ``treedef`` is the layout of the
treedefs it compares, ``stock`` is stock's. A tree function of the library
(tree_util, tree_identities, tree) declared here is that to its callers.
"""

SHARING, FOLLOWS, STOCK, TREEDEF = "sharing", "follows", "stock", "treedef"

# Module-level registries whose layout their flag does not tell.
REGISTRIES = {
    "interpreters.mlir.ir_tree_registry": (
        STOCK,
        "holds only MLIR values and types in lists and tuples: a class "
        "opts in only in tree_util's registries, so none of this registry's "
        "nodes is ever shared",
    ),
}

_PUBLIC = "the public jax.tree / jax.tree_util API: the user's trees"
_CALL = "jit's arguments, one identity scope per call"
RESULTS = "results follow arguments: in the arguments' layout"
_STRUCTURE_ERROR = (
    "an error message: says where two trees differ in their " "sharing"
)

PER_LEAF = (
    "a function of each leaf of the user's tree: each leaf once, the tree's "
    "ties kept in what it returns"
)

# The entry points that keep relative identities, and the mechanism.
SITES = {
    # The mechanism: the registries, the public API, FlatTree's layouts.
    ("tree_util", "<module>", "*"): (
        SHARING,
        "the registries that keep identities themselves (default_registry, "
        "identity_*), each sharing its table of registrations with a "
        "stock-layout twin (PyTreeRegistry.twin); in_layout_of's table of "
        "twins",
    ),
    ("tree_identities", "*", "*"): (SHARING, _PUBLIC),
    ("tree", "*", "*"): (SHARING, _PUBLIC + " (jax.tree)"),
    ("tree_util", "tree_retie", "*"): (SHARING, _PUBLIC + ": tree_retie"),
    ("tree_util", "tree_unshare", "default_registry.flatten"): (
        STOCK,
        "reads the sharing only to write each shared node out at each "
        "place: its result is in stock's layout",
    ),
    ("tree_util", "equality_errors", "default_registry.flatten"): (
        SHARING,
        _STRUCTURE_ERROR,
    ),
    ("tree_util", "equality_errors_pytreedef", "tree_util.equality_errors"): (
        TREEDEF,
        "trees unflattened from the two treedefs it is given: they "
        "share exactly as the treedefs do",
    ),
    ("tree_util", "broadcast_prefix", "in_layout_of(...).flatten"): (
        FOLLOWS,
        "a prefix read in the layout of the full tree's treedef (an entry "
        "point's own, passed as full_treedef): a shared node gets one value",
    ),
    ("tree_util", "prefix_errors", "in_layout_of(...).flatten"): (
        FOLLOWS,
        "a prefix read in the layout of the full tree's treedef, as "
        "broadcast_prefix reads it",
    ),
    ("tree_util", "FlatTree.pack", "*"): (
        FOLLOWS,
        "packed trees keep relative identities if one of them does "
        "(jit's arguments, a carry): a function traced on them flattens its "
        "results so",
    ),
    ("tree_util", "FlatTree._with_identities", "*"): (
        FOLLOWS,
        "a tree of tracing_registry, which shares nothing, "
        "re-laid on its identity twin for pack",
    ),
    (
        "tree_util",
        "FlatTree.flatten_like",
        "tree_util.FlatTree.flatten[like.registry]",
    ): (
        FOLLOWS,
        "a tree in another role laid out as `like` (linearize's "
        "tangents beside its primals)",
    ),
    (
        "tree_util",
        "FlatTree.flatten_alike",
        "tree_util.FlatTree.flatten[identity_tracing_registry]",
    ): (
        SHARING,
        "trees of one shape in different roles keep identities if "
        "they all share alike, else stock (jvp's primals and tangents)",
    ),
    ("tree_util", "FlatTree.paths", "self.registry.flatten_with_path"): (
        FOLLOWS,
        "the paths of the FlatTree's own leaves, in its registry",
    ),
    (
        "lib",
        "_JaxJit.parse_arguments",
        "tree_util.default_registry (as a value)",
    ): (
        SHARING,
        "jax_jit.parse_arguments given our default registry (either "
        "twin) answers with treedefs of that registry",
    ),
    ("lib", "_SignatureOn.__init__", "registry.flatten"): (
        FOLLOWS,
        "the caller's registry: parse_arguments' own argument",
    ),
    (
        "linear_util",
        "DebugInfo.set_result_paths",
        "registry.flatten_with_path",
    ): (
        FOLLOWS,
        "one result path per leaf of the registry the results are "
        "flattened with (trace_to_jaxpr's in_layout_of)",
    ),
    ("api_util", "flatten_fun", "in_layout_of(...).flatten"): (
        FOLLOWS,
        RESULTS,
    ),
    ("api_util", "flatten_fun_nokwargs", "in_layout_of(...).flatten"): (
        FOLLOWS,
        RESULTS,
    ),
    ("api_util", "flatten_axes", "in_layout_of(...).flatten"): (
        FOLLOWS,
        "an axis spec laid out as the tree it is a prefix of: a node shared "
        "in both gets its value once",
    ),
    (
        "api_util",
        "_non_static_arg_names",
        "identity_tracing_registry.flatten_with_path",
    ): (
        SHARING,
        "debug names, one per leaf of the flatten that keeps "
        "identities (identity_scopes: the call's or each argument's)",
    ),
    ("interpreters.partial_eval", "trace_to_jaxpr", "in_layout_of"): (
        FOLLOWS,
        RESULTS + " (jit's, a loop's carry)",
    ),
    (
        "interpreters.partial_eval",
        "trace_to_jaxpr",
        "tree_util.FlatTree.flatten[out_registry]",
    ): (FOLLOWS, RESULTS),
    (
        "interpreters.batching",
        "flatten_fun_for_vmap",
        "in_layout_of(...).flatten",
    ): (FOLLOWS, RESULTS + " (vmap)"),
    ("interpreters.ad", "jvp", "in_layout_of"): (
        FOLLOWS,
        RESULTS + ": the primals' (the registry for the two below)",
    ),
    ("interpreters.ad", "jvp", "tree_util.FlatTree.flatten[registry]"): (
        FOLLOWS,
        RESULTS + ": the primals', has_aux's aux as the result",
    ),
    ("interpreters.ad", "linearize", "in_layout_of"): (
        FOLLOWS,
        RESULTS + ": the primals' (the registry for the two below)",
    ),
    ("interpreters.ad", "linearize", "tree_util.FlatTree.flatten[registry]"): (
        FOLLOWS,
        RESULTS + ": the primals', has_aux's aux as the result",
    ),
    # jit, AOT.
    ("pjit", "_flatten_dynamic_args", "identity_tracing_registry.flatten"): (
        SHARING,
        _CALL,
    ),
    ("pjit", "_cpp_pjit", "tree_util.identity_tracing_registry (as a value)"): (
        SHARING,
        _CALL + ": the front door's registry",
    ),
    (
        "pjit",
        "_trace_for_jit",
        "tree_util.FlatTree.flatten_static_argnums_argnames"
        "[identity_tracing_registry]",
    ): (SHARING, _CALL + ", traced"),
    ("pjit", "with_sharding_constraint", "default_registry.flatten"): (
        SHARING,
        "with_sharding_constraint's tree: a shared node is one value, which "
        "the shardings constrain once",
    ),
    (
        "interpreters.pxla",
        "MeshExecutable.create_cpp_call",
        "tree_util.identity_tracing_registry (as a value)",
    ): (SHARING, "AOT calls of a compiled executable: " + _CALL),
    ("stages", "Stage.in_tree", "identity_tracing_registry.flatten"): (
        SHARING,
        "the AOT stage's argument tree, as jit flattened it",
    ),
    ("stages", "Stage.in_avals", "identity_tracing_registry.flatten"): (
        SHARING,
        "the tree of input avals, laid out as in_tree (args_info's ties)",
    ),
    ("stages", "Stage.donate_argnums", "identity_tracing_registry.flatten"): (
        SHARING,
        "the donated flat arguments, indexed as in_tree lays them out",
    ),
    ("stages", "lojax_pytree", "in_layout_of(...).flatten"): (
        FOLLOWS,
        "the lowered values in the layout of the tree they replace",
    ),
    ("stages", "Compiled.call", "in_layout_of"): (
        FOLLOWS,
        "AOT calls flatten in the layout the function was traced " "in",
    ),
    ("stages", "Compiled.call", "registry.flatten"): (
        FOLLOWS,
        "AOT calls flatten in the layout the function was traced "
        "in (the in_layout_of above)",
    ),
    ("export._export", "_export_lowered", "in_layout_of(...).flatten"): (
        FOLLOWS,
        "one aval per argument leaf, in the layout of the lowered in_tree",
    ),
    ("export._export", "call.f_imported", "in_layout_of(...).flatten"): (
        FOLLOWS,
        "calls of an exported function flatten in the layout it was "
        "exported with (jit's keeps relative identities)",
    ),
    ("export._export", "call.f_imported", "tree_util.equality_errors"): (
        SHARING,
        _STRUCTURE_ERROR,
    ),
    # The grad family, vmap, device_put.
    ("api", "vmap", "default_registry.flatten"): (
        SHARING,
        "vmap's in_axes, the user's tree: a node they share is read once",
    ),
    ("pmap", "pmap.infer_params", "default_registry.flatten"): (
        SHARING,
        "pmap's arguments: a node shared among them is one input, which "
        "in_axes give one axis",
    ),
    ("pmap", "_cached_shard_map._fun", "in_layout_of(...).flatten"): (
        FOLLOWS,
        RESULTS + " (pmap's)",
    ),
    ("pmap", "_get_in_axes_flat", "in_layout_of(...).flatten"): (
        FOLLOWS,
        "in_axes read in the arguments' layout",
    ),
    ("api", "vmap.vmap_f", "default_registry.flatten"): (
        SHARING,
        "vmap's arguments",
    ),
    ("api", "vmap.vmap_f", "in_layout_of(...).flatten_with_path"): (
        FOLLOWS,
        "out_axes read in the outputs' layout, for the error's path",
    ),
    ("api", "_jvp", "tree_util.FlatTree.flatten_alike"): (
        SHARING,
        "jvp's primals and tangents, kept if they share alike",
    ),
    (
        "api",
        "linearize",
        "tree_util.FlatTree.flatten[identity_tracing_registry]",
    ): (SHARING, "linearize's primals"),
    (
        "api",
        "value_and_grad.value_and_grad_f",
        "default_registry.flatten",
    ): (
        SHARING,
        "grad's dtype check of each leaf, once, as vjp takes them: a shared "
        "DAG costs its nodes, not its places",
    ),
    ("api", "device_get", "default_registry.flatten"): (
        SHARING,
        PER_LEAF,
    ),
    ("api", "block_until_ready", "default_registry.flatten"): (
        SHARING,
        PER_LEAF,
    ),
    ("lax.lax", "stop_gradient", "tree_identities.tree_map"): (
        SHARING,
        PER_LEAF,
    ),
    ("lax.lax", "optimization_barrier", "default_registry.flatten"): (
        SHARING,
        PER_LEAF,
    ),
    ("api", "vjp", "tree_util.FlatTree.flatten[identity_tracing_registry]"): (
        SHARING,
        "vjp's primals: a node shared by two primals is one primal, "
        "with one cotangent",
    ),
    ("api", "_vjp3_callable", "in_layout_of(...).flatten"): (
        FOLLOWS,
        "the cotangent refs in the primals' layout",
    ),
    ("api", "_flatten_cotangents", "in_layout_of(...).flatten"): (
        FOLLOWS,
        "cotangents in the outputs' layout: a node that is one object among "
        "the outputs has one cotangent (given per place, they add up)",
    ),
    ("api", "linear_transpose", "default_registry.flatten"): (
        SHARING,
        "linear_transpose's primals, as vjp's",
    ),
    ("api", "jacrev.jacfun", "tree_identities.tree_transpose"): (
        SHARING,
        "jacrev's jacobian, laid out as its arguments and results: a tied "
        "node is one variable, with one row of the jacobian",
    ),
    ("api", "jacrev.jacfun", "tree_identities.tree_structure"): (
        SHARING,
        "the structures jacrev's jacobian is transposed with, in the layout "
        "of its arguments and results",
    ),
    ("api", "_jacobian_map", "tree_identities.tree_map"): (
        SHARING,
        "the jacobians' maps over their arguments and results, as grad "
        "keeps them: one derivative per tied node",
    ),
    ("api", "_std_basis", "default_registry.flatten"): (
        SHARING,
        "the jacobians' basis: one direction per leaf of a tied node",
    ),
    (
        "api",
        "_unravel_array_into_pytree",
        "default_registry.flatten",
    ): (
        SHARING,
        "a jacobian unravelled into the tree of its arguments or results, a "
        "tied node's leaves once",
    ),
    (
        "shard_map",
        "_shard_map.wrapped",
        "tree_util.FlatTree.flatten[identity_tracing_registry]",
    ): (
        SHARING,
        "shard_map's arguments: a node shared among them is one "
        "input, which in_specs give one spec",
    ),
    (
        "shard_map",
        "_shard_map.wrapped.f_wrapped",
        "tree_util.FlatTree.flatten[in_layout_of(...)]",
    ): (FOLLOWS, RESULTS + " (shard_map's)"),
    ("api", "device_put", "default_registry.flatten"): (
        SHARING,
        "device_put: one buffer per unique leaf",
    ),
    # Custom rules: the function and its rules see the trees they were given.
    (
        "custom_derivatives",
        "custom_jvp.__call__",
        "default_registry.flatten",
    ): (
        SHARING,
        "custom_jvp's arguments: the function and its rule see the "
        "trees they were called with",
    ),
    (
        "custom_derivatives",
        "custom_vjp.__call__",
        "default_registry.flatten",
    ): (
        SHARING,
        "custom_vjp's arguments as the function sees them, tied again "
        "from the primitive's per-position inputs; the rules see copies, "
        "unless the call is made inside rules that run on the ties, where "
        "the primitive takes them as given",
    ),
    (
        "custom_derivatives",
        "_flatten_fun_nokwargs",
        "default_registry.flatten",
    ): (
        SHARING,
        "the results of a custom_vjp called inside rules that run on the "
        "ties: they keep their sharing, as its arguments do",
    ),
    (
        "custom_rule_ties",
        "ResultSharing.note_result",
        "default_registry.flatten",
    ): (
        SHARING,
        "the sharing of what a custom_vjp's or custom_jvp's function (or "
        "rule) returned, given arguments that share: the result keeps it",
    ),
    (
        "custom_rule_ties",
        "TiedArguments.flatten_fwd_output",
        "tree_util.default_registry (as a value)",
    ): (
        SHARING,
        "residuals (and, inside rules that run on the ties, results) of a "
        "fwd rule that ran on the ties: its bwd rule runs on them",
    ),
    # Loops and branches.
    (
        "lax.control_flow.loops",
        "scan",
        "tree_util.FlatTree.flatten[identity_tracing_registry]",
    ): (SHARING, "scan's carry and xs, each in a scope of its own"),
    (
        "lax.control_flow.loops",
        "_ys_apart_from_carry.body",
        "identity_tracing_registry.flatten",
    ): (
        SHARING,
        "scan's ys rebuilt apart from the carry, in the body "
        "results' layout",
    ),
    (
        "lax.control_flow.loops",
        "_check_carry_type",
        "tree_util.equality_errors",
    ): (SHARING, _STRUCTURE_ERROR + " (the carry)"),
    (
        "lax.control_flow.loops",
        "while_loop",
        "tree_util.FlatTree.flatten[identity_tracing_registry]",
    ): (SHARING, "while_loop's carry"),
    (
        "lax.control_flow.common",
        "_retie",
        "identity_tracing_registry.flatten",
    ): (
        SHARING,
        "a body's or branch's results, as they are flattened, "
        "rebuilt with the sharing they agree on",
    ),
    (
        "lax.control_flow.conditionals",
        "_switch_internal",
        "tree_util.FlatTree.flatten[identity_tracing_registry]",
    ): (SHARING, "switch's operands"),
    (
        "lax.control_flow.conditionals",
        "cond",
        "tree_util.FlatTree.flatten[identity_tracing_registry]",
    ): (SHARING, "cond's operands"),
    # Callbacks: results read as their spec.
    ("callback", "_FlatCallback.__call__", "tree_identities.tree_leaves"): (
        SHARING,
        "a callback's result, the user's tree",
    ),
    ("callback", "_ResultAsSpec.__call__", "in_layout_of(...).flatten"): (
        FOLLOWS,
        "a callback's result read in the layout of its spec",
    ),
    ("callback", "pure_callback_impl", "tree_identities.tree_map"): (
        SHARING,
        "the user's callback result, converted leaf by leaf",
    ),
    ("callback", "io_callback_impl", "tree_identities.tree_map"): (
        SHARING,
        "the user's callback result, converted leaf by leaf",
    ),
    ("callback", "pure_callback", "*"): (
        SHARING,
        "the callback's arguments, and its result spec: the spec's "
        "sharing is the result's",
    ),
    ("callback", "io_callback", "default_registry.flatten"): (
        SHARING,
        "the callback's arguments, and its result spec: the spec's "
        "sharing is the result's",
    ),
    # Checks and effects of each leaf: each leaf once.
    ("api", "jacfwd.jacfun", "tree_identities.tree_leaves"): (
        SHARING,
        "the dtype checks of the arguments and of the result: a check of "
        "each leaf, each once",
    ),
    ("api", "jacrev.jacfun", "tree_identities.tree_leaves"): (
        SHARING,
        "the dtype checks of the arguments and of the result: a check of "
        "each leaf, each once",
    ),
    ("api", "copy_to_host_async", "tree_identities.tree_leaves"): (
        SHARING,
        "starts each leaf's copy to the host, each leaf once",
    ),
    ("callback", "io_callback", "tree_identities.tree_leaves"): (
        SHARING,
        "the check of each leaf of the result spec, each once",
    ),
    ("lax.lax", "dce_sink", "tree_identities.tree_leaves"): (
        SHARING,
        "marks each leaf used, each once",
    ),
    # Telling a split tie.
    (
        "written_out_ties",
        "_places_of_pairs",
        "tree_identities.tree_flatten_with_path",
    ): (
        SHARING,
        "names where a split pair sits in the user's tree: each object's "
        "first place, one visit per shared node",
    ),
    (
        "tie_policy",
        "tell_tie_by_opt_in",
        "tree_identities.tree_flatten_with_path",
    ): (
        SHARING,
        "names the places of a tie a library's base class opted in, in the "
        "user's tree the flatten met it in: one visit per shared node",
    ),
    ("tie_policy", "<module>", "*"): (
        SHARING,
        "sets the identity registries' inherited_tie_observer: the "
        "registries themselves, no flatten",
    ),
}
