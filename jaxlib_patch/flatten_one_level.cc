// One level at a time: PyTreeRegistry.flatten_one_level(_with_keys) and
// all_leaves.

#include "jaxlib_patch/flatten_common.h"
#include "jaxlib_patch/keys.h"
#include "jaxlib_patch/pytree.h"

namespace jaxlib_patch {

namespace {

// The (key, child) pairs of `children` as a list, keyed by `make_key(i)`.
template <typename MakeKey>
nb::list PairsWithKeys(nb::handle children, MakeKey&& make_key) {
  nb::list pairs;
  Py_ssize_t i = 0;
  for (nb::handle child : nb::iter(children)) {
    pairs.append(nb::make_tuple(make_key(i++), child));
  }
  return pairs;
}

template <bool kWithKeys>
nb::object FlattenOneLevelImpl(const PyTreeRegistry& registry,
                               nb::handle tree) {
  const PyTreeRegistry::Registration* custom = nullptr;
  switch (registry.KindOfObject(tree, &custom)) {
    case PyTreeKind::kLeaf: return nb::none();
    case PyTreeKind::kNone: return nb::make_tuple(nb::tuple(), nb::none());
    case PyTreeKind::kTuple:
    case PyTreeKind::kList:
      if constexpr (kWithKeys) {
        return nb::make_tuple(nb::tuple(PairsWithKeys(tree, MakeSequenceKey)),
                              nb::none());
      } else {
        return nb::make_tuple(tree, nb::none());
      }
    case PyTreeKind::kNamedTuple: {
      nb::handle type(reinterpret_cast<PyObject*>(Py_TYPE(tree.ptr())));
      if constexpr (kWithKeys) {
        nb::object fields = NamedTupleFields(tree);
        return nb::make_tuple(
            PairsWithKeys(tree,
                          [&](Py_ssize_t i) { return FieldKey(fields, i); }),
            type);
      } else {
        return nb::make_tuple(nb::list(tree), type);
      }
    }
    case PyTreeKind::kDict: {
      nb::list keys = SortedDictKeys(tree);
      nb::list values;
      for (nb::handle key : keys) values.append(tree[key]);
      if constexpr (kWithKeys) {
        nb::list pairs = PairsWithKeys(
            values, [&](Py_ssize_t i) { return MakeDictKey(keys[i]); });
        return nb::make_tuple(nb::tuple(pairs), nb::tuple(keys));
      } else {
        return nb::make_tuple(nb::tuple(values), nb::tuple(keys));
      }
    }
    case PyTreeKind::kCustom: {
      if (kWithKeys && !custom->to_iterable_with_keys.is_none()) {
        auto [iterator, aux] =
            UnpackChildrenAndAux(ToIterable(*custom, tree, true), true);
        nb::list pairs;
        ForEach(iterator, [&](nb::object pair) {
          CheckKeyChildPair(pair);
          pairs.append(pair);
        });
        return nb::make_tuple(pairs, aux);
      }
      nb::object result = ToIterable(*custom, tree, false);
      if constexpr (kWithKeys) {
        auto [children, aux] = UnpackChildrenAndAux(result, false);
        return nb::make_tuple(PairsWithKeys(children, MakeFlattenedIndexKey),
                              aux);
      } else {
        // The children as the flatten function gave them (a generator stays
        // a generator), once checked to be iterable, as in stock jaxlib.
        auto [iterator, aux] = UnpackChildrenAndAux(result, false);
        return nb::make_tuple(nb::handle(PyTuple_GET_ITEM(result.ptr(), 0)),
                              aux);
      }
    }
    case PyTreeKind::kDataclass: {
      nb::object meta = MetaFields(tree, *custom);
      nb::list values;
      for (const nb::str& field : custom->data_fields) {
        values.append(GetAttr(tree, field));
      }
      if constexpr (kWithKeys) {
        return nb::make_tuple(
            PairsWithKeys(values,
                          [&](Py_ssize_t i) {
                            return MakeGetAttrKey(custom->data_fields[i]);
                          }),
            meta);
      } else {
        return nb::make_tuple(values, meta);
      }
    }
  }
  JAXLIB_PATCH_INTERNAL_ERROR("Unknown PyTreeKind");
}

}  // namespace

nb::object FlattenOneLevel(const PyTreeRegistry& registry, nb::handle tree) {
  return FlattenOneLevelImpl<false>(registry, tree);
}

nb::object FlattenOneLevelWithKeys(const PyTreeRegistry& registry,
                                   nb::handle tree) {
  return FlattenOneLevelImpl<true>(registry, tree);
}

bool AllLeaves(const PyTreeRegistry& registry, nb::iterable objects) {
  for (nb::handle obj : objects) {
    const PyTreeRegistry::Registration* custom = nullptr;
    if (registry.KindOfObject(obj, &custom) != PyTreeKind::kLeaf) return false;
  }
  return true;
}

}  // namespace jaxlib_patch
