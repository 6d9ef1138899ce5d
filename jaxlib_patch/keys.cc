// Key classes of flatten_with_path paths, matching stock jaxlib's in
// constructor, attributes, ==, hash, repr, str, pickling and __match_args__.

#include "jaxlib_patch/keys.h"

#include <string>

namespace jaxlib_patch {

namespace {

// Binds the parts every key class shares: pickling through a one-item tuple,
// == on the same class, and __match_args__.
template <typename Key, typename Value, typename Class>
void BindCommon(Class& cls, const char* field, Value Key::* member) {
  cls.def("__getstate__",
          [member](const Key& self) { return nb::make_tuple(self.*member); })
      .def("__setstate__",
           [](Key& self, nb::tuple state) {
             if (state.size() != 1) {
               throw nb::value_error("Expected a 1-tuple as key state.");
             }
             new (&self) Key{nb::cast<Value>(state[0])};
           })
      .def("__eq__", [member](const Key& self, nb::handle other) {
        if (!nb::isinstance<Key>(other)) return false;
        const Key& rhs = nb::cast<const Key&>(other);
        if constexpr (std::is_same_v<Value, int>) {
          return self.*member == rhs.*member;
        } else {
          return nb::handle(self.*member).equal(rhs.*member);
        }
      });
  cls.attr("__match_args__") = nb::make_tuple(field);
}

}  // namespace

nb::object MakeSequenceKey(Py_ssize_t idx) {
  return nb::cast(SequenceKey{static_cast<int>(idx)});
}
nb::object MakeDictKey(nb::handle key) {
  return nb::cast(DictKey{nb::borrow(key)});
}
nb::object MakeGetAttrKey(nb::handle name) {
  return nb::cast(GetAttrKey{nb::borrow<nb::str>(name)});
}
nb::object MakeFlattenedIndexKey(Py_ssize_t key) {
  return nb::cast(FlattenedIndexKey{static_cast<int>(key)});
}

nb::object ChildKey(const Node& node, size_t k) {
  switch (node.kind) {
    case PyTreeKind::kDict: return MakeDictKey(node.dict_keys[k]);
    case PyTreeKind::kNamedTuple: {
      // A forged (unpickled) treedef may name a type with fewer fields.
      nb::object fields = node.node_data.attr("_fields");
      return k < static_cast<size_t>(nb::len(fields))
                 ? MakeGetAttrKey(fields[k])
                 : MakeSequenceKey(k);
    }
    case PyTreeKind::kDataclass:
      return MakeGetAttrKey(node.custom->data_fields[k]);
    case PyTreeKind::kCustom: return MakeFlattenedIndexKey(k);
    default: return MakeSequenceKey(k);
  }
}

std::string KeyPathText(nb::handle key_path) {
  std::string text = "tree";
  for (nb::handle key : key_path) text += Str(key);
  return text;
}

void BindKeys(nb::module_& m) {
  auto sequence_key = nb::class_<SequenceKey>(
      m, "SequenceKey", nb::sig("class SequenceKey(Hashable)"));
  sequence_key.def(nb::init<int>(), nb::arg("idx"))
      .def_ro("idx", &SequenceKey::idx)
      .def("__str__",
           [](const SequenceKey& k) {
             return "[" + std::to_string(k.idx) + "]";
           })
      .def("__repr__",
           [](const SequenceKey& k) {
             return "SequenceKey(idx=" + std::to_string(k.idx) + ")";
           })
      .def("__hash__", [](const SequenceKey& k) {
        return nb::hash(nb::int_(k.idx + SequenceKey::kHashSalt));
      });
  BindCommon(sequence_key, "idx", &SequenceKey::idx);

  auto dict_key =
      nb::class_<DictKey>(m, "DictKey", nb::sig("class DictKey(Hashable)"),
                          nb::type_slots(dict_key_gc_slots));
  dict_key.def(nb::init<nb::object>(), nb::arg("key").none())
      .def_ro("key", &DictKey::key)
      .def("__str__",
           [](const DictKey& k) { return FromUtf8("[" + Repr(k.key) + "]"); })
      .def("__repr__",
           [](const DictKey& k) {
             return FromUtf8("DictKey(key=" + Repr(k.key) + ")");
           })
      .def("__hash__", [](const DictKey& k) { return nb::hash(k.key); });
  BindCommon(dict_key, "key", &DictKey::key);

  auto get_attr_key = nb::class_<GetAttrKey>(
      m, "GetAttrKey", nb::sig("class GetAttrKey(Hashable)"));
  get_attr_key.def(nb::init<nb::str>(), nb::arg("name"))
      .def_ro("name", &GetAttrKey::name)
      .def("__str__",
           [](const GetAttrKey& k) { return FromUtf8("." + Str(k.name)); })
      .def("__repr__",
           [](const GetAttrKey& k) {
             return FromUtf8("GetAttrKey(name='" + Str(k.name) + "')");
           })
      .def("__hash__", [](const GetAttrKey& k) { return nb::hash(k.name); });
  BindCommon(get_attr_key, "name", &GetAttrKey::name);

  auto flattened_index_key = nb::class_<FlattenedIndexKey>(
      m, "FlattenedIndexKey", nb::sig("class FlattenedIndexKey(Hashable)"));
  flattened_index_key.def(nb::init<int>(), nb::arg("key"))
      .def_ro("key", &FlattenedIndexKey::key)
      .def("__str__",
           [](const FlattenedIndexKey& k) {
             return "[<flat index " + std::to_string(k.key) + ">]";
           })
      .def("__repr__",
           [](const FlattenedIndexKey& k) {
             return "FlattenedIndexKey(key=" + std::to_string(k.key) + ")";
           })
      .def("__hash__", [](const FlattenedIndexKey& k) {
        return nb::hash(nb::int_(k.key + FlattenedIndexKey::kHashSalt));
      });
  BindCommon(flattened_index_key, "key", &FlattenedIndexKey::key);
}

}  // namespace jaxlib_patch
