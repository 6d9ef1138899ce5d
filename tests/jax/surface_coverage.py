"""Which public functions the public-surface test covers, and why the rest
need no adapter: every public callable of the namespaces below is either the
API of an adapter (or the same object under another name), exercised by an
adapter of another name, or listed here with the reason it takes no tree
and no function of the user's."""

import importlib
import inspect

NAMESPACES = (
    "jax",
    "jax.lax",
    "jax.tree_util",
    "jax.tree",
    "jax.scipy.sparse.linalg",
    "jax.experimental.ode",
    "jax.custom_batching",
    "jax.custom_derivatives",
    "jax.debug",
    "jax.experimental",
    "jax.experimental.checkify",
    "jax.experimental.compute_on",
    "jax.experimental.jet",
    "jax.experimental.layout",
    "jax.experimental.multihost_utils",
    "jax.experimental.sparse",
    "jax.flatten_util",
)
# Modules whose own functions are their API: the names they import from
# elsewhere are not.
OWN_FUNCTIONS_ONLY = (
    "jax.experimental.ode",
    "jax.experimental.jet",
    "jax.experimental.multihost_utils",
)

# The public names of the opt-in itself; some of them only in some versions
# of the patch series, so none is required to exist.
OPT_IN_API = frozenset(
    {
        "jax.tree_util.preserve_relative_identities",
        "jax.tree_util.has_relative_identities",
        "jax.tree_util.tree_retie",
        "jax.tree_util.tree_unshare",
        "jax.tree_util.LateOptInWarning",
        "jax.tree_util.SplitTieError",
        "jax.tree_util.SplitTieWarning",
        "jax.tree_util.TiedByOptInWarning",
    }
)

# Called by the adapter named, as part of what it tests.
EXERCISED_BY = {
    "jax.tree_util.treedef_is_leaf": "jax.tree_util.treedef_children",
    "jax.custom_derivatives.custom_vjp_primal_tree_values": "jax.custom_vjp[symbolic_zeros]",
    "jax.custom_derivatives.SymbolicZero": "jax.custom_vjp[symbolic_zeros]",
    "jax.effects_barrier": "jax.debug.callback",
    "jax.make_mesh": "jax.shard_map",
    "jax.experimental.multihost_utils.global_array_to_host_local_array": (
        "jax.experimental.multihost_utils.host_local_array_to_global_array"
    ),
}

_REASONS = {
    "a configuration option, or a context manager that takes no tree": """
        jax.allow_f16_reductions jax.array_garbage_collection_guard
        jax.auto_pcast jax.check_tracer_leaks jax.checking_leaks
        jax.debug_infs jax.debug_key_reuse jax.debug_nans jax.default_device
        jax.default_matmul_precision jax.default_prng_impl jax.enable_checks
        jax.enable_custom_prng jax.enable_x64 jax.explain_cache_misses
        jax.jax2tf_associative_scan_reductions jax.legacy_prng_key
        jax.log_compiles jax.no_execution jax.no_tracing
        jax.numpy_dtype_promotion jax.numpy_rank_promotion
        jax.softmax_custom_jvp jax.thread_guard jax.threefry_partitionable
        jax.transfer_guard jax.transfer_guard_device_to_device
        jax.transfer_guard_device_to_host jax.transfer_guard_host_to_device
        jax.named_scope jax.set_mesh jax.make_user_context
    """,
    "about devices, processes, meshes or caches; no tree": """
        jax.clear_caches jax.default_backend jax.device_count jax.devices
        jax.host_count jax.host_id jax.host_ids jax.live_arrays
        jax.local_device_count jax.local_devices jax.print_environment_info
        jax.process_count jax.process_index jax.process_indices
        jax.remove_size_one_mesh_axis_from_type
    """,
    "a type or a record of options, not a function of trees": """
        jax.Array jax.Device jax.NamedSharding jax.P jax.Ref
        jax.ShapeDtypeStruct jax.Shard jax.tree_util.DictKey
        jax.tree_util.FlattenedIndexKey jax.tree_util.GetAttrKey
        jax.tree_util.KeyPath jax.tree_util.PyTreeDef
        jax.tree_util.SequenceKey jax.custom_derivatives.CustomVJPPrimal
        jax.debug.DebugEffect jax.debug.OrderedDebugEffect jax.experimental.EArray
        jax.lax.AccuracyMode jax.lax.ConvDimensionNumbers
        jax.lax.ConvGeneralDilatedDimensionNumbers jax.lax.DotAlgorithm
        jax.lax.DotAlgorithmPreset jax.lax.DotDimensionNumbers jax.lax.FftType
        jax.lax.GatherDimensionNumbers jax.lax.GatherScatterMode
        jax.lax.Precision jax.lax.PrecisionLike jax.lax.RaggedDotDimensionNumbers
        jax.lax.RandomAlgorithm jax.lax.RoundingMethod
        jax.lax.ScatterDimensionNumbers jax.lax.Tolerance
    """,
    "takes arrays, shapes or refs, not trees of the user's": """
        jax.make_array_from_callback jax.make_array_from_process_local_data
        jax.make_array_from_single_device_arrays jax.typeof jax.ds
        jax.new_ref jax.empty_ref jax.free_ref jax.freeze
        jax.custom_derivatives.zero_from_primal
        jax.debug.inspect_array_sharding jax.debug.visualize_array_sharding
        jax.debug.visualize_sharding jax.experimental.cur_qdd
        jax.experimental.primal_tangent_dtype
    """,
    "jax.lax on arrays (or a sequence of arrays): no tree reaches it": """
        abs acos acosh add after_all approx_max_k approx_min_k argmax argmin
        asin asinh atan atan2 atanh axis_index axis_size batch_matmul
        bessel_i0e bessel_i1e betainc bitcast_convert_type bitwise_and
        bitwise_not bitwise_or bitwise_xor broadcast broadcast_in_dim
        broadcast_like broadcast_shapes broadcast_to_rank broadcasted_iota
        cbrt ceil clamp clz collapse complex concatenate conj conv
        conv_dimension_numbers conv_general_dilated conv_general_dilated_local
        conv_general_dilated_patches conv_general_permutations
        conv_general_shape_tuple conv_shape_tuple conv_transpose
        conv_transpose_shape_tuple conv_with_general_padding
        convert_element_type cos cosh create_token cumlogsumexp cummax cummin
        cumprod cumsum digamma div dot dot_general dtype dynamic_index_in_dim
        dynamic_slice dynamic_slice_in_dim dynamic_update_index_in_dim
        dynamic_update_slice dynamic_update_slice_in_dim empty eq erf erf_inv
        erfc exp exp2 expand_dims expm1 fft floor full full_like gather ge gt
        igamma igamma_grad_a igammac imag index_in_dim index_take integer_pow
        iota is_finite le lgamma log log1p logistic lt max min mul mulhi ne
        neg nextafter pad padtype_to_pads polygamma population_count pow
        precv psend ragged_all_to_all ragged_dot ragged_dot_general
        random_gamma_grad real reciprocal reduce_and reduce_max reduce_min
        reduce_or reduce_precision reduce_prod reduce_sum
        reduce_window_shape_tuple reduce_xor rem reshape rev rng_bit_generator
        rng_uniform round rsqrt scaled_dot scatter scatter_add scatter_max
        scatter_min scatter_mul scatter_sub select select_n shape_as_value
        shift_left shift_right_arithmetic shift_right_logical sign sin sinh
        slice slice_in_dim sort sort_key_val split sqrt square squeeze stack
        stage sub tan tanh tile top_k transpose unstack zeta
    """,
    "jax.lax.scatter_apply's function maps one array: no tree reaches it": "jax.lax.scatter_apply",
    "registers a class, or reads a key path: no tree": """
        jax.tree_util.keystr jax.tree_util.register_dataclass
        jax.tree_util.register_pytree_node
        jax.tree_util.register_pytree_node_class
        jax.tree_util.register_pytree_with_keys
        jax.tree_util.register_pytree_with_keys_class
        jax.tree_util.register_static jax.tree.static
    """,
    "the opt-in's own API, which no program written for stock calls": " ".join(
        sorted(OPT_IN_API)
    ),
    "odeint's internal helpers, public by accident": """
        jax.experimental.ode.abs2 jax.experimental.ode.fit_4th_order_polynomial
        jax.experimental.ode.initial_step_size
        jax.experimental.ode.interp_fit_dopri
        jax.experimental.ode.mean_error_ratio
        jax.experimental.ode.optimal_step_size
        jax.experimental.ode.ravel_first_arg
        jax.experimental.ode.runge_kutta_step
    """,
    "jet's rules and tracer types, public by accident; jet itself takes "
    "a tuple of arrays, refusing a node (as stock does)": """
        jax.experimental.jet.JetTrace jax.experimental.jet.JetTracer
        jax.experimental.jet.ZeroSeries jax.experimental.jet.ZeroTerm
        jax.experimental.jet.def_comp jax.experimental.jet.def_deriv
        jax.experimental.jet.deflinear jax.experimental.jet.defzero
        jax.experimental.jet.deriv_prop jax.experimental.jet.fact
        jax.experimental.jet.jet jax.experimental.jet.linear_prop
        jax.experimental.jet.zero_prop
    """,
    "multihost_utils' primitives' rules, and calls about processes and "
    "devices that take no tree": """
        jax.experimental.multihost_utils.ProcessFailureError
        jax.experimental.multihost_utils.global_array_to_host_local_array_impl
        jax.experimental.multihost_utils.gtl_abstract_eval
        jax.experimental.multihost_utils.host_local_array_to_global_array_impl
        jax.experimental.multihost_utils.live_devices
        jax.experimental.multihost_utils.ltg_abstract_eval
        jax.experimental.multihost_utils.ltg_batcher
        jax.experimental.multihost_utils.reached_preemption_sync_point
        jax.experimental.multihost_utils.sync_global_devices
    """,
    "checkify's checks and error types: a predicate and a message, the "
    "checked function's own calls (the checkify adapter calls check)": """
        jax.experimental.checkify.Error jax.experimental.checkify.ErrorCategory
        jax.experimental.checkify.JaxRuntimeError
        jax.experimental.checkify.check jax.experimental.checkify.check_error
        jax.experimental.checkify.debug_check
    """,
    "a context manager, or a type of layouts: no tree": """
        jax.experimental.compute_on.compute_on
        jax.experimental.layout.Format jax.experimental.layout.Layout
    """,
    "sparse arrays and functions of them (BCOO, BCSR, COO, CSR, CSC): no "
    "tree of the user's": """
        jax.experimental.sparse.BCOO jax.experimental.sparse.BCSR
        jax.experimental.sparse.COO jax.experimental.sparse.CSC
        jax.experimental.sparse.CSR
        jax.experimental.sparse.CuSparseEfficiencyWarning
        jax.experimental.sparse.JAXSparse
        jax.experimental.sparse.SparseEfficiencyError
        jax.experimental.sparse.SparseEfficiencyWarning
        jax.experimental.sparse.SparseTracer
        jax.experimental.sparse.bcoo_broadcast_in_dim
        jax.experimental.sparse.bcoo_concatenate
        jax.experimental.sparse.bcoo_conv_general_dilated
        jax.experimental.sparse.bcoo_dot_general
        jax.experimental.sparse.bcoo_dot_general_sampled
        jax.experimental.sparse.bcoo_dynamic_slice
        jax.experimental.sparse.bcoo_extract
        jax.experimental.sparse.bcoo_fromdense jax.experimental.sparse.bcoo_gather
        jax.experimental.sparse.bcoo_multiply_dense
        jax.experimental.sparse.bcoo_multiply_sparse
        jax.experimental.sparse.bcoo_reduce_sum
        jax.experimental.sparse.bcoo_reshape jax.experimental.sparse.bcoo_rev
        jax.experimental.sparse.bcoo_slice
        jax.experimental.sparse.bcoo_sort_indices
        jax.experimental.sparse.bcoo_squeeze
        jax.experimental.sparse.bcoo_sum_duplicates
        jax.experimental.sparse.bcoo_todense
        jax.experimental.sparse.bcoo_transpose
        jax.experimental.sparse.bcoo_update_layout
        jax.experimental.sparse.bcsr_broadcast_in_dim
        jax.experimental.sparse.bcsr_concatenate
        jax.experimental.sparse.bcsr_dot_general
        jax.experimental.sparse.bcsr_extract
        jax.experimental.sparse.bcsr_fromdense
        jax.experimental.sparse.bcsr_sum_duplicates
        jax.experimental.sparse.bcsr_todense
        jax.experimental.sparse.coo_fromdense jax.experimental.sparse.coo_matmat
        jax.experimental.sparse.coo_matvec jax.experimental.sparse.coo_todense
        jax.experimental.sparse.csr_fromdense jax.experimental.sparse.csr_matmat
        jax.experimental.sparse.csr_matvec jax.experimental.sparse.csr_todense
        jax.experimental.sparse.empty jax.experimental.sparse.eye
        jax.experimental.sparse.random_bcoo jax.experimental.sparse.todense
    """,
    "interactive: stops the program for a debugger": "jax.debug.breakpoint",
    "fails on stock 0.10.2 on CPU for every operand (its vmap rule calls "
    "take with a list; under shard_map it has no CPU lowering)": "jax.lax.pbroadcast",
}


def _qualified(name):
  return name if name.startswith("jax.") else f"jax.lax.{name}"


NO_ADAPTER = {
    _qualified(name): reason
    for reason, names in _REASONS.items()
    for name in names.split()
}


def public_functions():
  """Every public callable of the namespaces, by qualified name."""
  out = {}
  for namespace in NAMESPACES:
    module = importlib.import_module(namespace)
    for name in dir(module):
      obj = getattr(module, name)
      if name.startswith("_") or inspect.ismodule(obj) or not callable(obj):
        continue
      if namespace in OWN_FUNCTIONS_ONLY and (
          getattr(obj, "__module__", None) != namespace
      ):
        continue  # imported from elsewhere
      out[f"{namespace}.{name}"] = obj
  return out


def _resolve(name):
  module, attr = name.rsplit(".", 1)
  return getattr(importlib.import_module(module), attr)


def unclassified(adapters):
  """(public functions with no adapter and no reason, classified names
  that are not public functions)."""
  public = public_functions()
  tested = {id(_resolve(api.split("[")[0])) for api in adapters}
  for name, api in EXERCISED_BY.items():
    assert api in adapters, f"{name} is exercised by {api}, which is gone"
  missing = sorted(
      name
      for name, obj in public.items()
      if id(obj) not in tested
      and name not in EXERCISED_BY
      and name not in NO_ADAPTER
  )
  stale = sorted(set(NO_ADAPTER) - set(public) - OPT_IN_API)
  return missing, stale
