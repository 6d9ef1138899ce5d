"""Differential tests: ``jaxlib_patch.pytree`` must behave exactly like stock.

Every test runs the same operation against the stock module
(``jaxlib._jax.pytree``) and against the candidate (``jaxlib_patch.pytree``)
and compares the *outcomes*: the returned values (canonicalized, see
``canon``), or the exception type and message when the operation raises.  It
also compares the log of Python callbacks each module made (custom
``to_iterable``/``from_iterable`` functions, leaf predicates, walk
callbacks), since those calls are observable behaviour too.

Only trees in which no class opts into the candidate's extra
``preserve_relative_identities`` flag are used: there the candidate must be a
drop-in replacement.

Error messages are compared after removing memory addresses, the module path
of the pytree classes, and the candidate's extra keyword-only parameter from
nanobind signatures (``norm_msg``).  Two stock defects are tolerated rather
than required: hash consistency (a == b implies equal hashes) is only checked
for treedefs of one registry, and the recursion depth stock leaks on nested
errors is compensated by a fixture (the candidate may leak less, not more).

The deliberate differences documented in docs/semantics.md ("Deliberate
differences from stock jaxlib 0.10.2") are listed in ``DEVIATIONS``: for each
item, the hand-written cases and property sub-checks it affects and what the
candidate must do there instead of matching stock (raise a given exception
type, order dict keys with ``sorted()``, ...).  Those places are still
checked, just against the documented behaviour; ``test_deviations_table``
keeps the table in step with the document.

Environment variables:

* ``PYTREE_CANDIDATE=stock`` compares stock with itself (for working on this
  suite while the candidate is not built; see ``strategies.py``).
* ``PYTREE_EXAMPLES=N`` overrides the number of hypothesis examples per
  property (default 300).
* ``PYTREE_COMPARE_CALLS=0`` stops comparing callback logs (to see other
  differences when a callback-order difference masks them).

The package's rooms:

* ``strategies``: the node classes, registries (one set per module) and
  hypothesis strategies, importable by name for pickle;
* ``describe``: module-independent descriptions of results (``canon``);
* ``deviations``: the table of deliberate differences and their checks;
* ``compare``: running an operation on both modules and comparing
  (``both``), and the hypothesis settings;
* ``inputs``: leaf predicates, and related trees built from generated ones;
* ``error_cases``: the hand-written cases, grouped by the call they make,
  and ``error_case_inputs``, what they are handed;
* the test files, by concern: ``test_flatten`` (flatten, flatten_with_path,
  flatten_one_level, unflatten, flatten_up_to, misbehaving custom nodes,
  dict keys), ``test_treedefs`` (equality, compose, children, walk,
  from_iterable_tree, treedef_tuple), ``test_serialization`` (pickle,
  proto), ``test_registry`` (all_leaves, is_node, keys, registrations),
  ``test_error_cases`` (hand-written cases, recursion leaks),
  ``test_deviations`` (the table against docs/semantics.md) and
  ``test_api_surface``.
"""
