// Pickling (__getstate__/__setstate__) and the protocol-buffer format that
// stock jaxlib writes for trees of builtin nodes.
//
// The pickled state is stock's, `(registry, [(kind, arity, node_data, type,
// num_leaves, num_nodes), ...])`, with a seventh item, the distance, on the
// entries of shared references only; so a treedef without sharing pickles
// exactly as stock's does.

#include <string>
#include <unordered_map>
#include <utility>

#include "jaxlib_patch/pytree.h"

namespace jaxlib_patch {

nb::object PyTreeDef::GetState() const {
  registry();  // Raises on a treedef emptied by the garbage collector.
  nb::list nodes;
  for (const Node& node : traversal_) {
    nb::object data = ExportedNodeData(node);
    nb::object type = node.custom != nullptr ? node.custom->type : nb::none();
    if (node.is_reference()) {
      nodes.append(nb::make_tuple(static_cast<int>(node.kind), node.arity, data,
                                  type, node.num_leaves, node.num_nodes,
                                  node.shared_distance));
    } else {
      nodes.append(nb::make_tuple(static_cast<int>(node.kind), node.arity, data,
                                  type, node.num_leaves, node.num_nodes));
    }
  }
  return nb::make_tuple(registry_ref_, nodes);
}

namespace {

[[noreturn]] void FailMalformedState(const std::string& message) {
  throw nb::value_error(("Malformed pickled PyTreeDef: " + message).c_str());
}

}  // namespace

void PyTreeDef::SetState(nb::handle state) {
  if (!PyTuple_Check(state.ptr()) || PyTuple_GET_SIZE(state.ptr()) != 2) {
    FailMalformedState("expected a (registry, nodes) pair");
  }
  nb::handle registry_ref = PyTuple_GET_ITEM(state.ptr(), 0);
  if (!nb::isinstance<PyTreeRegistry>(registry_ref)) {
    FailMalformedState("the first item is not a PyTreeRegistry");
  }
  registry_ = nb::cast<PyTreeRegistry*>(registry_ref);
  registry_ref_ = nb::borrow(registry_ref);
  SetNodes(PyTuple_GET_ITEM(state.ptr(), 1));
}

bool IsStockTreeDef(nb::handle obj) {
  PyTypeObject* type = Py_TYPE(obj.ptr());
  if (std::string_view(type->tp_name) != "PyTreeDef" &&
      std::string_view(type->tp_name) != "jaxlib._jax.pytree.PyTreeDef") {
    return false;
  }
  nb::object module = nb::steal(
      PyObject_GetAttrString(reinterpret_cast<PyObject*>(type), "__module__"));
  if (!module.is_valid()) {
    PyErr_Clear();
    return false;
  }
  return PyUnicode_Check(module.ptr()) &&
         PyUnicode_CompareWithASCIIString(module.ptr(), "jaxlib._jax.pytree") ==
             0;
}

PyTreeDef PyTreeDef::FromStockTreeDef(nb::handle stock) const {
  // Stock's state has the same entries as ours (it has no references); its
  // custom types are looked up in this treedef's registry.
  nb::object state = stock.attr("__getstate__")();
  if (!PyTuple_Check(state.ptr()) || PyTuple_GET_SIZE(state.ptr()) != 2) {
    FailMalformedState("expected a (registry, nodes) pair");
  }
  PyTreeDef converted(registry(), registry_ref_);
  converted.SetNodes(PyTuple_GET_ITEM(state.ptr(), 1));
  return converted;
}

// An integer item of a pickled node entry; `what` names it in the error.
template <typename Int>
static Int IntField(const nb::tuple& fields, size_t i, const char* what) {
  Int value = 0;
  if (!PyLong_Check(fields[i].ptr()) || !nb::try_cast(fields[i], value)) {
    FailMalformedState(std::string(what) +
                       " is not an integer: " + Repr(fields[i]));
  }
  return value;
}

void PyTreeDef::SetNodes(nb::handle nodes) {
  traversal_.clear();
  if (!nb::isinstance<nb::list>(nodes) && !nb::isinstance<nb::tuple>(nodes)) {
    FailMalformedState("the nodes are not a list or tuple");
  }
  for (nb::handle entry : nodes) {
    if (!PyTuple_Check(entry.ptr()) || PyTuple_GET_SIZE(entry.ptr()) < 6 ||
        PyTuple_GET_SIZE(entry.ptr()) > 7) {
      FailMalformedState("a node entry is not a tuple of 6 or 7 items");
    }
    nb::tuple fields = nb::borrow<nb::tuple>(entry);
    Node node;
    const int kind = IntField<int>(fields, 0, "a node kind");
    if (kind < 0 || kind > static_cast<int>(PyTreeKind::kDataclass)) {
      FailMalformedState("unknown node kind " + std::to_string(kind));
    }
    node.kind = static_cast<PyTreeKind>(kind);
    node.arity = IntField<Py_ssize_t>(fields, 1, "an arity");
    if (fields.size() == 7) {
      node.shared_distance =
          IntField<Py_ssize_t>(fields, 6, "a reference distance");
    }
    const bool has_data = node.kind == PyTreeKind::kNamedTuple ||
                          node.kind == PyTreeKind::kCustom ||
                          node.kind == PyTreeKind::kDataclass;
    if (node.kind == PyTreeKind::kDict) {
      if (!PyList_Check(fields[2].ptr()))
        FailMalformedState("a dict's keys are not a list");
      node.dict_keys = DictKeysFrom(fields[2]);
    } else if (has_data && !node.is_reference()) {
      node.node_data = nb::borrow(fields[2]);
    }
    if (node.kind == PyTreeKind::kCustom ||
        node.kind == PyTreeKind::kDataclass) {
      nb::handle type = fields[3];
      node.custom =
          PyType_Check(type.ptr())
              ? registry_->Lookup(reinterpret_cast<PyTypeObject*>(type.ptr()))
              : nullptr;
      if (node.custom == nullptr) {
        FailMalformedState("unknown custom type " + Repr(type));
      }
    }
    traversal_.push_back(std::move(node));
  }
  try {
    Validate();
  } catch (const nb::builtin_exception& error) {
    if (error.type() != nb::exception_type::value_error) throw;
    // Validate's own "Malformed PyTreeDef: ..." told as a malformed state.
    const std::string message = error.what();
    const std::string prefix = "Malformed PyTreeDef: ";
    FailMalformedState(message.compare(0, prefix.size(), prefix) == 0
                           ? message.substr(prefix.size())
                           : message);
  }
}

// ---------------------------------------------------------------------------
// Protocol buffers. The messages, as stock jaxlib defines them:
//   PyTreeDefProto { repeated PyTreeNodeDefProto nodes = 1;
//                    repeated string interned_strings = 2; }
//   PyTreeNodeDefProto { uint64 arity = 1; PyTreeNodeType type = 2;
//                        DictKeysProto dict_keys = 3; }
//   DictKeysProto { repeated uint32 str_id = 1; }  (packed)
// Field numbers and enum values were read off stock's output.

namespace {

enum ProtoNodeType : uint64_t {
  kProtoLeaf = 1,
  kProtoList = 2,
  kProtoNone = 3,
  kProtoTuple = 4,
  kProtoDict = 5,
};

void PutVarint(std::string& out, uint64_t value) {
  while (value >= 0x80) {
    out.push_back(static_cast<char>(value | 0x80));
    value >>= 7;
  }
  out.push_back(static_cast<char>(value));
}

void PutTag(std::string& out, int field, int wire_type) {
  PutVarint(out, (static_cast<uint64_t>(field) << 3) | wire_type);
}

void PutBytesField(std::string& out, int field, const std::string& bytes) {
  PutTag(out, field, 2);
  PutVarint(out, bytes.size());
  out += bytes;
}

// Reads one protobuf message field by field; throws on truncation.
class ProtoReader {
 public:
  explicit ProtoReader(std::string_view data) : data_(data) {}
  bool done() const { return data_.empty(); }

  uint64_t Varint() {
    uint64_t value = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (data_.empty()) Fail();
      const uint8_t byte = data_.front();
      data_.remove_prefix(1);
      value |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if ((byte & 0x80) == 0) return value;
    }
    Fail();
  }

  std::string_view Bytes() {
    const uint64_t size = Varint();
    if (size > data_.size()) Fail();
    std::string_view bytes = data_.substr(0, size);
    data_.remove_prefix(size);
    return bytes;
  }

  // Skips a field of a wire type this reader does not interpret.
  void Skip(int wire_type) {
    switch (wire_type) {
      case 0: Varint(); return;
      case 1: Take(8); return;
      case 2: Bytes(); return;
      case 5: Take(4); return;
      default: Fail();
    }
  }

  [[noreturn]] static void Fail() {
    throw nb::value_error("Could not deserialize PyTreeDefProto.");
  }

 private:
  void Take(size_t n) {
    if (n > data_.size()) Fail();
    data_.remove_prefix(n);
  }
  std::string_view data_;
};

}  // namespace

nb::bytes PyTreeDef::SerializeUsingProto() const {
  registry();  // Raises on a treedef emptied by the garbage collector.
  std::string nodes;
  std::vector<std::string> interned;
  std::unordered_map<std::string, uint32_t> string_ids;
  for (const Node& node : traversal_) {
    uint64_t type = 0;
    std::string message;
    std::string keys;
    switch (node.kind) {
      case PyTreeKind::kLeaf: type = kProtoLeaf; break;
      case PyTreeKind::kList: type = kProtoList; break;
      case PyTreeKind::kNone: type = kProtoNone; break;
      case PyTreeKind::kTuple: type = kProtoTuple; break;
      case PyTreeKind::kDict:
        type = kProtoDict;
        for (const nb::object& key : node.dict_keys) {
          if (!PyUnicode_Check(key.ptr())) {
            throw nb::value_error(
                "Only string keys are supported in proto pytree "
                "serialization.");
          }
          // Proto strings are UTF-8: a key with a lone surrogate raises
          // UnicodeEncodeError (a ValueError).
          Py_ssize_t size;
          const char* utf8 = PyUnicode_AsUTF8AndSize(key.ptr(), &size);
          if (utf8 == nullptr) throw nb::python_error();
          auto [it, inserted] =
              string_ids.try_emplace(std::string(utf8, size), interned.size());
          if (inserted) interned.push_back(it->first);
          PutVarint(keys, it->second);
        }
        break;
      default:
        throw nb::value_error(
            "User-defined nodes are not supported when serializing pytrees as "
            "protocol buffers. You should either convert the user-defined "
            "nodes to another type or use pickle instead.");
    }
    if (node.arity != 0) {
      PutTag(message, 1, 0);
      PutVarint(message, node.arity);
    }
    PutTag(message, 2, 0);
    PutVarint(message, type);
    if (!keys.empty()) {  // Stock leaves an empty dict's keys out.
      std::string dict_keys;
      PutBytesField(dict_keys, 1, keys);
      PutBytesField(message, 3, dict_keys);
    }
    PutBytesField(nodes, 1, message);
  }
  for (const std::string& s : interned) PutBytesField(nodes, 2, s);
  return nb::bytes(nodes.data(), nodes.size());
}

nb::object PyTreeDef::DeserializeUsingProto(
    nb::handle_t<PyTreeRegistry> registry_ref, nb::bytes data) {
  PyTreeDef treedef(nb::cast<PyTreeRegistry*>(registry_ref),
                    nb::borrow(registry_ref));
  std::vector<std::vector<uint32_t>> dict_key_ids;  // Per node.
  std::vector<std::string> interned;
  ProtoReader reader(std::string_view(data.c_str(), data.size()));
  while (!reader.done()) {
    const uint64_t tag = reader.Varint();
    const int field = tag >> 3, wire_type = tag & 7;
    if (field == 2 && wire_type == 2) {
      interned.emplace_back(reader.Bytes());
      continue;
    }
    if (field != 1 || wire_type != 2) {
      reader.Skip(wire_type);
      continue;
    }
    Node node;
    std::vector<uint32_t> key_ids;
    uint64_t type = 0;
    ProtoReader message(reader.Bytes());
    while (!message.done()) {
      const uint64_t node_tag = message.Varint();
      const int node_field = node_tag >> 3, node_wire = node_tag & 7;
      if (node_field == 1 && node_wire == 0) {
        node.arity = static_cast<Py_ssize_t>(message.Varint());
      } else if (node_field == 2 && node_wire == 0) {
        type = message.Varint();
      } else if (node_field == 3 && node_wire == 2) {
        ProtoReader keys_message(message.Bytes());
        while (!keys_message.done()) {
          const uint64_t key_tag = keys_message.Varint();
          if (key_tag == ((1 << 3) | 2)) {  // Packed.
            ProtoReader packed(keys_message.Bytes());
            while (!packed.done()) key_ids.push_back(packed.Varint());
          } else if (key_tag == ((1 << 3) | 0)) {
            key_ids.push_back(keys_message.Varint());
          } else {
            keys_message.Skip(key_tag & 7);
          }
        }
      } else {
        message.Skip(node_wire);
      }
    }
    switch (type) {
      case kProtoLeaf: node.kind = PyTreeKind::kLeaf; break;
      case kProtoList: node.kind = PyTreeKind::kList; break;
      case kProtoNone: node.kind = PyTreeKind::kNone; break;
      case kProtoTuple: node.kind = PyTreeKind::kTuple; break;
      case kProtoDict: node.kind = PyTreeKind::kDict; break;
      default:
        throw nb::value_error("Malformed pytree proto (invalid node type)");
    }
    treedef.traversal_.push_back(std::move(node));
    dict_key_ids.push_back(std::move(key_ids));
  }
  for (size_t i = 0; i < treedef.traversal_.size(); ++i) {
    Node& node = treedef.traversal_[i];
    if (node.kind != PyTreeKind::kDict) continue;
    for (uint32_t id : dict_key_ids[i]) {
      if (id >= interned.size()) ProtoReader::Fail();
      PyObject* key = PyUnicode_DecodeUTF8(interned[id].data(),
                                           interned[id].size(), nullptr);
      if (key == nullptr) {  // No serialized treedef holds other than UTF-8.
        PyErr_Clear();
        ProtoReader::Fail();
      }
      node.dict_keys.push_back(nb::steal(key));
    }
  }
  treedef.Validate();
  return WrapTreeDef(std::move(treedef));
}

}  // namespace jaxlib_patch
