"""Hand-written cases: error paths and quirks that random trees rarely hit,
grouped by the call they make. Each case is fn(side) -> value; both modules
must give the same outcome (test_error_cases.py), or the one DEVIATIONS
documents for it (test_deviations.py).
"""

import pickle

import numpy as np

from test_stock_compat import strategies as S
from test_stock_compat.strategies import (
    DataNode,
    KeyedNode,
    Pair,
    RegA,
    RegB,
    Single,
    TupleSub,
    rega_flatten,
    rega_flatten_keys,
    rega_unflatten,
)
from test_stock_compat.describe import KEY_CLASSES, safe
from test_stock_compat.inputs import f_leaf, f_node, f_node_raising
from test_stock_compat.error_case_inputs import (
    I,
    LEAF_ENTRY,
    children_of,
    deeper_than_recursion_limit,
    fresh_registry,
    from_node_data,
    register_twice,
    setstate_initialized,
    setstate_then_repr,
    treedef_of,
    uninitialized_treedef,
    walk,
)

# Registry construction and registration.
REGISTRATION_CASES = {
    "registry_kwargs_defaults": lambda s: fresh_registry(s).flatten(
        (None, [1], {"a": 2}, Pair(3, 4))
    ),
    "registry_positional_flags": lambda s: s.mod.PyTreeRegistry(
        True, True, True, True, False
    ).flatten({"a": 1}),
    "registry_too_many_flags": lambda s: s.mod.PyTreeRegistry(
        True, True, True, True, True, True
    ),
    "registry_unknown_kwarg": lambda s: s.mod.PyTreeRegistry(bogus=True),
    "registry_int_flag": lambda s: s.mod.PyTreeRegistry(enable_none=1),
    "registry_numpy_bool_flag": lambda s: s.mod.PyTreeRegistry(
        enable_list=np.False_
    ),
    "registry_reduce_unnamed": lambda s: fresh_registry(s).__reduce__(),
    "registry_reduce_named": lambda s: s.regs["full"].__reduce__()
    == s.regs["full"].__name__,
    "registry_pickle_named": lambda s: pickle.loads(
        pickle.dumps(s.regs["full"])
    )
    is s.regs["full"],
    "registry_pickle_unnamed": lambda s: pickle.dumps(fresh_registry(s)),
    "registry_dict_attr": lambda s: sorted(vars(fresh_registry(s))),
    "duplicate_node": lambda s: register_twice(s, "node", "node"),
    "duplicate_dataclass": lambda s: register_twice(
        s, "dataclass", "dataclass"
    ),
    "node_then_dataclass": lambda s: register_twice(s, "node", "dataclass"),
    "dataclass_then_node": lambda s: register_twice(s, "dataclass", "node"),
    "register_builtin_tuple": lambda s: fresh_registry(s).register_node(
        tuple, rega_flatten, rega_unflatten
    ),
    "register_builtin_none": lambda s: fresh_registry(
        s
    ).register_dataclass_node(type(None), [], []),
    "register_tuple_when_disabled": lambda s: fresh_registry(
        s, enable_tuple=False
    ).register_node(tuple, S.tuple_flatten, S.tuple_unflatten),
    "register_non_type": lambda s: fresh_registry(s).register_node(
        5, rega_flatten, rega_unflatten
    ),
    "register_non_callable": lambda s: fresh_registry(s).register_node(
        RegA, 5, 6
    ),
    "register_bad_keys_fn": lambda s: fresh_registry(s).register_node(
        RegA, rega_flatten, rega_unflatten, 7
    ),
    "register_keys_fn_none": lambda s: fresh_registry(s).register_node(
        RegA, rega_flatten, rega_unflatten, None
    ),
    "register_keys_fn_kw": lambda s: fresh_registry(s).register_node(
        RegA,
        rega_flatten,
        rega_unflatten,
        to_iterable_with_keys=rega_flatten_keys,
    ),
    "register_all_kw": lambda s: fresh_registry(s).register_node(
        type=RegA, to_iterable=rega_flatten, from_iterable=rega_unflatten
    ),
    "dataclass_fields_str": lambda s: fresh_registry(s).register_dataclass_node(
        RegA, "pq", "r"
    ),
    "dataclass_fields_ints": lambda s: fresh_registry(
        s
    ).register_dataclass_node(RegA, [1], []),
    "dataclass_fields_tuple": lambda s: fresh_registry(
        s
    ).register_dataclass_node(RegA, ("p",), ("q",)),
    "dataclass_kwargs": lambda s: fresh_registry(s).register_dataclass_node(
        type=RegA, data_fields=["p"], meta_fields=[]
    ),
    "dataclass_missing_attr": lambda s: (
        lambda r: (
            r.register_dataclass_node(RegA, ["p", "zz"], []),
            r.flatten(I.rega),
        )
    )(fresh_registry(s)),
    "dataclass_unflatten_bad_ctor": lambda s: (
        lambda r: (
            r.register_dataclass_node(RegA, ["p"], ["zz"]),
            s.mod.PyTreeDef.from_node_data_and_children(
                r, (RegA, (1,)), [treedef_of(s, 0)]
            ).unflatten([1]),
        )
    )(fresh_registry(s)),
}


# flatten & friends: bad arguments.
FLATTEN_CASES = {
    "flatten_no_args": lambda s: s.regs["full"].flatten(),
    "flatten_kw_tree": lambda s: s.regs["full"].flatten(tree=[1, (2,)]),
    "flatten_bad_predicate": lambda s: s.regs["full"].flatten([1], 5),
    "flatten_predicate_raises_on_root": lambda s: s.regs["full"].flatten(
        (1,), lambda x: 1 / 0
    ),
    "flatten_predicate_numpy_bool": lambda s: s.regs["full"].flatten(
        [1], lambda x: np.True_
    ),
    "flatten_predicate_wrong_arity": lambda s: s.regs["full"].flatten_with_path(
        [1], lambda x: False
    ),
    "flatten_with_path_kw": lambda s: s.regs["full"].flatten_with_path(
        tree={"a": (1,)}, leaf_predicate=None
    ),
    "flatten_with_path_none_tree": lambda s: s.regs["full"].flatten_with_path(
        None
    ),
    "flatten_raising_dict_key": lambda s: s.regs["full"].flatten(
        I.raising_keys
    ),
    "flatten_one_level_leaf": lambda s: s.regs["full"].flatten_one_level(5),
    "flatten_one_level_keys_leaf": lambda s: s.regs[
        "full"
    ].flatten_one_level_with_keys(5),
    "flatten_one_level_namedtuple_keys": lambda s: s.regs[
        "full"
    ].flatten_one_level_with_keys(Pair(1, 2)),
    "flatten_one_level_list_identity": lambda s: (
        lambda x: s.regs["full"].flatten_one_level(x)[0] is x
    )([1, 2]),
    "flatten_one_level_tuple_identity": lambda s: (
        lambda x: s.regs["full"].flatten_one_level(x)[0] is x
    )((1, 2)),
    "flatten_one_level_dict_unsortable": lambda s: s.regs[
        "full"
    ].flatten_one_level({1: 1, "a": 2}),
    "flatten_huge_int_leaf": lambda s: s.regs["full"].flatten([2**200]),
    "flatten_deeper_than_recursion_limit": lambda s: deeper_than_recursion_limit(
        s, "flatten"
    ),
    "flatten_with_path_deeper_than_recursion_limit": lambda s: deeper_than_recursion_limit(
        s, "flatten_with_path"
    ),
}


# unflatten.
UNFLATTEN_CASES = {
    "unflatten_too_few": lambda s: treedef_of(s, (1, [2, 3])).unflatten([1]),
    "unflatten_too_many": lambda s: treedef_of(s, (1, [2, 3])).unflatten(
        range(9)
    ),
    "unflatten_non_iterable": lambda s: treedef_of(s, (1, 2)).unflatten(5),
    "unflatten_string": lambda s: treedef_of(s, (1, 2)).unflatten("ab"),
    "unflatten_dict": lambda s: treedef_of(s, (1, 2)).unflatten(
        {"a": 1, "b": 2}
    ),
    "unflatten_no_args": lambda s: treedef_of(s, (1, 2)).unflatten(),
    "unflatten_leaf_treedef": lambda s: treedef_of(s, 1).unflatten([I.leaf0]),
    "unflatten_namedtuple_ctor": lambda s: treedef_of(s, Pair(1, 2)).unflatten(
        [1, 2]
    ),
}


# flatten_up_to.
FLATTEN_UP_TO_CASES = {
    "up_to_none_prefix": lambda s: treedef_of(s, (None, 1)).flatten_up_to(
        (5, 1)
    ),
    "up_to_expected_none": lambda s: treedef_of(s, [None]).flatten_up_to([3]),
    "up_to_tuple_vs_list": lambda s: treedef_of(s, (1, 2)).flatten_up_to(
        [1, 2]
    ),
    "up_to_tuple_arity": lambda s: treedef_of(s, (1, 2)).flatten_up_to(
        (1, 2, 3)
    ),
    "up_to_list_arity": lambda s: treedef_of(s, [1, 2]).flatten_up_to([1]),
    "up_to_dict_keys": lambda s: treedef_of(s, {"a": 1, "b": 2}).flatten_up_to(
        {"a": 1, "c": 2}
    ),
    "up_to_dict_vs_list": lambda s: treedef_of(s, {"a": 1}).flatten_up_to([1]),
    "up_to_dict_int_keys": lambda s: treedef_of(s, {1: 1, 2: 2}).flatten_up_to(
        {1: 1, 3: 2}
    ),
    "up_to_dict_unsortable": lambda s: treedef_of(s, {"a": 1}).flatten_up_to(
        {"a": 1, 1: 2}
    ),
    "up_to_namedtuple_vs_tuple": lambda s: treedef_of(
        s, Pair(1, 2)
    ).flatten_up_to((1, 2)),
    "up_to_namedtuple_other": lambda s: treedef_of(s, Pair(1, 2)).flatten_up_to(
        Single(1)
    ),
    "up_to_custom_meta": lambda s: treedef_of(s, I.k1a).flatten_up_to(I.k1b),
    "up_to_custom_type": lambda s: treedef_of(s, I.k1a).flatten_up_to(I.p1a),
    "up_to_custom_arity": lambda s: treedef_of(s, I.k1a).flatten_up_to(I.k12a),
    "up_to_dataclass_meta": lambda s: treedef_of(s, I.d12t).flatten_up_to(
        I.d12u
    ),
    "up_to_dataclass_vs_leaf": lambda s: treedef_of(s, I.d12t).flatten_up_to(5),
    "up_to_bad_meta_eq": lambda s: treedef_of(s, I.bad_child1).flatten_up_to(
        I.bad_child2
    ),
    "up_to_no_args": lambda s: treedef_of(s, (1,)).flatten_up_to(),
}


# Equality / hash / repr of treedefs with odd metadata.
EQUALITY_CASES = {
    "eq_bad_meta": lambda s: treedef_of(s, I.bad1) == treedef_of(s, I.bad2),
    "ne_bad_meta": lambda s: treedef_of(s, I.bad1) != treedef_of(s, I.bad2),
    "eq_array_meta": lambda s: treedef_of(s, I.arr1) == treedef_of(s, I.arr2),
    "eq_notimplemented_meta": lambda s: treedef_of(s, I.ni1)
    == treedef_of(s, I.ni2),
    "eq_weird_meta": lambda s: treedef_of(s, I.weird1)
    == treedef_of(s, I.weird2),
    "hash_bad_meta": lambda s: type(hash(treedef_of(s, I.bad1))),
    "hash_unhashable_meta": lambda s: type(hash(treedef_of(s, I.unhashable))),
    "repr_bad_meta": lambda s: repr(treedef_of(s, I.bad1)),
    "repr_str_dict_keys": lambda s: repr(treedef_of(s, {"a'b": 1, 'c"': 2})),
    "repr_nested": lambda s: repr(treedef_of(s, I.nested)),
    "eq_across_registries_builtin": lambda s: treedef_of(s, (1, [2]))
    == treedef_of(s, (1, [2]), "bare"),
    "eq_across_registries_custom": lambda s: treedef_of(s, I.k10)
    == treedef_of(s, I.k10, "no_none"),
    "eq_int_float_keys": lambda s: treedef_of(s, {1: 0})
    == treedef_of(s, {1.0: 0}),
    "eq_wrong_type_arg": lambda s: treedef_of(s, (1,)).__eq__(5),
    "ne_wrong_type_arg": lambda s: treedef_of(s, (1,)).__ne__(5),
}


# compose / treedef_tuple.
COMPOSE_CASES = {
    "compose_across_registries": lambda s: treedef_of(s, (1, 2)).compose(
        treedef_of(s, [1], "bare")
    ),
    "compose_non_treedef": lambda s: treedef_of(s, (1, 2)).compose(5),
    "compose_leaf_outer": lambda s: treedef_of(s, 1).compose(
        treedef_of(s, (1, 2))
    ),
    "compose_leaf_inner": lambda s: treedef_of(s, (1, 2)).compose(
        treedef_of(s, 1)
    ),
    "compose_empty_outer": lambda s: treedef_of(s, ()).compose(
        treedef_of(s, (1, 2))
    ),
    "treedef_tuple_across_registries": lambda s: s.mod.treedef_tuple(
        s.regs["full"], [treedef_of(s, 1), treedef_of(s, 1, "bare")]
    ),
    "treedef_tuple_empty": lambda s: s.mod.treedef_tuple(s.regs["full"], []),
    "treedef_tuple_non_treedef": lambda s: s.mod.treedef_tuple(
        s.regs["full"], [5]
    ),
    "treedef_tuple_tuple_arg": lambda s: s.mod.treedef_tuple(
        s.regs["full"], (treedef_of(s, 1),)
    ),
    "treedef_tuple_iterator_arg": lambda s: s.mod.treedef_tuple(
        s.regs["full"], iter([treedef_of(s, 1)])
    ),
    "treedef_tuple_no_tuple_registry": lambda s: s.mod.treedef_tuple(
        s.regs["no_tuple"], [treedef_of(s, 1, "no_tuple")]
    ),
    "treedef_tuple_bad_registry": lambda s: s.mod.treedef_tuple(5, []),
}


# children / node_data / from_node_data_and_children.
NODE_DATA_CASES = {
    "node_data_leaf": lambda s: treedef_of(s, 1).node_data(),
    "node_data_none": lambda s: treedef_of(s, None).node_data(),
    "node_data_dict": lambda s: treedef_of(s, {"b": 1, "a": 2}).node_data(),
    "node_data_namedtuple": lambda s: treedef_of(s, Pair(1, 2)).node_data(),
    "node_data_dataclass": lambda s: treedef_of(s, I.d12t).node_data(),
    "node_data_tuple_custom": lambda s: treedef_of(
        s, (1,), "tuple_custom"
    ).node_data(),
    "children_leaf": lambda s: treedef_of(s, 1).children(),
    "ndc_leaf": lambda s: from_node_data(s, None, []),
    "ndc_leaf_with_children": lambda s: from_node_data(s, None, children_of(s)),
    "ndc_unregistered_type": lambda s: from_node_data(s, (int, None), []),
    "ndc_tuple_bad_children": lambda s: from_node_data(s, (tuple, None), [1]),
    "ndc_tuple_generator_children": lambda s: from_node_data(
        s, (tuple, None), iter(children_of(s))
    ),
    "ndc_tuple_ignored_data": lambda s: from_node_data(s, (tuple, "x"), []),
    "ndc_list": lambda s: from_node_data(s, (list, None), children_of(s)),
    "ndc_dict": lambda s: from_node_data(s, (dict, ["a", "b"]), children_of(s)),
    "ndc_dict_unsorted_keys": lambda s: from_node_data(
        s, (dict, ["b", "a"]), children_of(s)
    ),
    "ndc_dict_key_tuple": lambda s: from_node_data(
        s, (dict, ("a", "b")), children_of(s)
    ),
    "ndc_dict_bad_data": lambda s: from_node_data(s, (dict, 5), children_of(s)),
    "ndc_dict_mapping_data": lambda s: from_node_data(
        s, (dict, {"a": 1, "b": 2}), children_of(s)
    ),
    "ndc_dict_too_few_keys": lambda s: repr(
        from_node_data(s, (dict, ["a"]), children_of(s))
    ),
    "ndc_none": lambda s: from_node_data(s, (type(None), None), []),
    "ndc_namedtuple": lambda s: from_node_data(s, (Pair, None), children_of(s)),
    "ndc_namedtuple_wrong_count": lambda s: from_node_data(
        s, (Pair, None), children_of(s)[:1]
    ),
    "ndc_custom": lambda s: from_node_data(s, (KeyedNode, "m"), children_of(s)),
    "ndc_dataclass": lambda s: from_node_data(
        s, (DataNode, ("t",)), children_of(s)
    ),
    "ndc_non_type": lambda s: from_node_data(s, (5, None), children_of(s)),
    "ndc_not_a_pair": lambda s: from_node_data(s, 5, children_of(s)),
    "ndc_triple": lambda s: from_node_data(s, (tuple, None, 1), children_of(s)),
    "ndc_children_int": lambda s: from_node_data(s, (tuple, None), 5),
    "ndc_disabled_tuple": lambda s: from_node_data(
        s, (tuple, None), children_of(s), "no_tuple"
    ),
    "ndc_disabled_none": lambda s: from_node_data(
        s, (type(None), None), [], "no_none"
    ),
    "ndc_disabled_namedtuple": lambda s: from_node_data(
        s, (Pair, None), children_of(s), "no_namedtuple"
    ),
    "ndc_custom_in_bare": lambda s: from_node_data(
        s, (KeyedNode, "m"), [], "bare"
    ),
    "ndc_mixed_registry_children": lambda s: from_node_data(
        s, (tuple, None), children_of(s) + [treedef_of(s, 1, "bare")]
    ),
    "ndc_kwargs": lambda s: s.mod.PyTreeDef.from_node_data_and_children(
        registry=s.regs["full"], node_data=None, children=[]
    ),
}


# walk.
WALK_CASES = {
    "walk_f_leaf_none": lambda s: walk(s, (1, 2), f_node, None, [1, 2]),
    "walk_too_few": lambda s: walk(s, (1, [2]), f_node, f_leaf, [1]),
    "walk_too_many": lambda s: walk(s, (1, [2]), f_node, f_leaf, [1, 2, 3]),
    "walk_f_leaf_raises": lambda s: walk(s, (1,), f_node, lambda x: 1 / 0, [1]),
    "walk_f_node_raises": lambda s: walk(s, [1], f_node_raising, f_leaf, [1]),
    "walk_non_iterable": lambda s: walk(s, (1,), f_node, f_leaf, 5),
    "walk_non_callable": lambda s: walk(s, (1,), 5, f_leaf, [1]),
    "walk_custom_and_dict": lambda s: walk(
        s, I.walk_tree, f_node, f_leaf, I.pool2
    ),
}


# from_iterable_tree.
FROM_ITERABLE_TREE_CASES = {
    "fit_non_iterable": lambda s: treedef_of(s, (1, 2)).from_iterable_tree(5),
    "fit_none_node": lambda s: treedef_of(s, (None, 1)).from_iterable_tree(
        [None, 1]
    ),
    "fit_dict_iterates_keys": lambda s: treedef_of(
        s, {"a": 1, "b": 2}
    ).from_iterable_tree({"b": 3, "a": 4}),
    "fit_arity": lambda s: treedef_of(s, (1, 2)).from_iterable_tree([1]),
    "fit_string": lambda s: treedef_of(s, (1, 2)).from_iterable_tree("ab"),
    "fit_custom": lambda s: treedef_of(s, I.fit_tree).from_iterable_tree(
        [[3, 4], [5, 6]]
    ),
    "fit_leaf": lambda s: treedef_of(s, 1).from_iterable_tree([1, 2]),
}


# proto.
PROTO_CASES = {
    "proto_custom_node": lambda s: treedef_of(s, I.k10).serialize_using_proto(),
    "proto_namedtuple": lambda s: treedef_of(
        s, Pair(1, 2)
    ).serialize_using_proto(),
    "proto_int_keys": lambda s: treedef_of(s, {1: 2}).serialize_using_proto(),
    "proto_leaf": lambda s: treedef_of(s, 1).serialize_using_proto(),
    "proto_none": lambda s: treedef_of(s, None).serialize_using_proto(),
    "proto_tuple_custom": lambda s: treedef_of(
        s, (1,), "tuple_custom"
    ).serialize_using_proto(),
    "proto_garbage": lambda s: s.mod.PyTreeDef.deserialize_using_proto(
        s.regs["full"], b"garbage"
    ),
    "proto_empty": lambda s: repr(
        s.mod.PyTreeDef.deserialize_using_proto(s.regs["full"], b"")
    ),
    "proto_bad_node_type": lambda s: s.mod.PyTreeDef.deserialize_using_proto(
        s.regs["full"], b"\n\x02\x10\x07"
    ),
    "proto_two_roots": lambda s: repr(
        s.mod.PyTreeDef.deserialize_using_proto(
            s.regs["full"], b"\n\x02\x10\x01\n\x02\x10\x01"
        )
    ),
    "proto_str_arg": lambda s: s.mod.PyTreeDef.deserialize_using_proto(
        s.regs["full"], "abc"
    ),
    "proto_bytearray_arg": lambda s: s.mod.PyTreeDef.deserialize_using_proto(
        s.regs["full"], bytearray(b"")
    ),
    "proto_kwargs": lambda s: s.mod.PyTreeDef.deserialize_using_proto(
        registry=s.regs["full"], data=treedef_of(s, [1]).serialize_using_proto()
    ),
    "proto_into_disabled_dict": lambda s: repr(
        s.mod.PyTreeDef.deserialize_using_proto(
            s.regs["no_dict"], treedef_of(s, {"a": 1}).serialize_using_proto()
        )
    ),
}


# pickle / state.
PICKLE_CASES = {
    "getstate_default_registry": lambda s: treedef_of(
        s, (1,), "default"
    ).__getstate__(),
    "pickle_default_registry": lambda s: pickle.dumps(
        treedef_of(s, (1,), "default")
    ),
    "pickle_unnamed_registry": lambda s: pickle.dumps(
        fresh_registry(s).flatten((1,))[1]
    ),
    "setstate_int": lambda s: uninitialized_treedef(s).__setstate__(5),
    "setstate_wrong_tuple": lambda s: uninitialized_treedef(s).__setstate__(
        (s.regs["full"], [(0, 0, None, None, 1, 1)], 3)
    ),
    "setstate_unknown_kind": lambda s: uninitialized_treedef(s).__setstate__(
        (s.regs["full"], [(9, 0, None, None, 1, 1)])
    ),
    # States whose arities do not make one tree: stock accepts them and fails
    # at the first use.
    "setstate_arity_too_big": lambda s: setstate_then_repr(
        s, [LEAF_ENTRY, (2, 2, None, None, 1, 2)]
    ),
    "setstate_negative_arity": lambda s: setstate_then_repr(
        s, [LEAF_ENTRY, (2, -1, None, None, 1, 2)]
    ),
    "setstate_two_roots": lambda s: setstate_then_repr(
        s, [LEAF_ENTRY, LEAF_ENTRY]
    ),
    "setstate_no_nodes": lambda s: setstate_then_repr(s, []),
    "setstate_dict_keys_short": lambda s: setstate_then_repr(
        s, [LEAF_ENTRY, LEAF_ENTRY, (5, 2, ["a"], None, 2, 3)]
    ),
    "setstate_dict_keys_not_a_list": lambda s: setstate_then_repr(
        s, [LEAF_ENTRY, (5, 1, "a", None, 1, 2)]
    ),
    "setstate_valid": lambda s: (
        lambda t: (t.__setstate__(treedef_of(s, (1, [2])).__getstate__()), t)[1]
    )(uninitialized_treedef(s)),
    "setstate_initialized": lambda s: setstate_initialized(s),
    "treedef_no_constructor": lambda s: s.mod.PyTreeDef(),
}


# all_leaves / is_node.
ALL_LEAVES_CASES = {
    "all_leaves_non_iterable": lambda s: s.mod.all_leaves(s.regs["full"], 5),
    "all_leaves_none": lambda s: s.mod.all_leaves(s.regs["full"], [None]),
    "all_leaves_none_disabled": lambda s: s.mod.all_leaves(
        s.regs["no_none"], [None, 1]
    ),
    "all_leaves_empty": lambda s: s.mod.all_leaves(s.regs["full"], []),
    "all_leaves_bad_registry": lambda s: s.mod.all_leaves(5, []),
    "is_node_non_type": lambda s: s.regs["full"].is_node(5),
    "is_node_subclass": lambda s: [
        s.regs["full"].is_node(t) for t in (TupleSub, bool, RegB)
    ],
}


# Keys.
KEY_AND_MODULE_CASES = {
    "key_bad_types": lambda s: [
        safe(lambda c=c, a=a: getattr(s.mod, c)(a))
        for c in KEY_CLASSES
        for a in (1.5, "x", None, -1, 2**64)
    ],
    "key_no_args": lambda s: s.mod.SequenceKey(),
    "key_setstate": lambda s: (lambda k: (k.__setstate__((7,)), k)[1])(
        s.mod.SequenceKey.__new__(s.mod.SequenceKey)
    ),
    "key_setstate_bad": lambda s: s.mod.SequenceKey.__new__(
        s.mod.SequenceKey
    ).__setstate__(("a",)),
    "key_eq_across_classes": lambda s: s.mod.SequenceKey(1)
    == s.mod.FlattenedIndexKey(1),
    "key_unhashable": lambda s: hash(s.mod.DictKey([1])),
    "key_match_args_class": lambda s: [
        getattr(s.mod, c).__match_args__ for c in KEY_CLASSES
    ],
    "module_version": lambda s: s.mod.version,
    "default_registry_singleton": lambda s: s.mod.default_registry()
    is s.mod.default_registry(),
}


ERROR_CASES = {
    **REGISTRATION_CASES,
    **FLATTEN_CASES,
    **UNFLATTEN_CASES,
    **FLATTEN_UP_TO_CASES,
    **EQUALITY_CASES,
    **COMPOSE_CASES,
    **NODE_DATA_CASES,
    **WALK_CASES,
    **FROM_ITERABLE_TREE_CASES,
    **PROTO_CASES,
    **PICKLE_CASES,
    **ALL_LEAVES_CASES,
    **KEY_AND_MODULE_CASES,
}
