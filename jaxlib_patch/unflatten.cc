// Building objects from a treedef: PyTreeDef.unflatten, walk and
// from_iterable_tree. All three run the traversal forwards, building each node
// from its children, and build a shared node once.

#include <array>
#include <string>
#include <utility>
#include <vector>

#include "jaxlib_patch/pytree.h"

namespace jaxlib_patch {

// Moves `children[0:n]` into a new tuple.
static nb::object TupleOf(nb::object* children, Py_ssize_t n) {
  nb::object tuple = nb::steal(PyTuple_New(n));
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyTuple_SET_ITEM(tuple.ptr(), i, children[i].release().ptr());
  }
  return tuple;
}

// Marks the registrations of types that one unflatten builds at two places
// or more, while they do not keep identities: where the tree held one object
// there, the user now has two (a later opt-in cannot tie them again). Types
// built once per tree (a library's wrappers) are not marked. The types seen
// once are kept inline, no allocation on jit's output path; past kCapacity
// types, new ones go unseen (the mark only feeds a warning).
class BuiltTwice {
 public:
  void Note(const PyTreeRegistry::Registration* registration) {
    if (registration->preserve_relative_identities ||
        registration->built_by_unflatten.load(std::memory_order_relaxed)) {
      return;
    }
    for (size_t i = 0; i < size_; ++i) {
      if (seen_[i] == registration) {
        registration->built_by_unflatten.store(true, std::memory_order_relaxed);
        return;
      }
    }
    if (size_ < kCapacity) seen_[size_++] = registration;
  }

 private:
  static constexpr size_t kCapacity = 16;
  std::array<const PyTreeRegistry::Registration*, kCapacity> seen_;
  size_t size_ = 0;
};

static nb::object MakeNode(const Node& node, nb::object* children) {
  switch (node.kind) {
    case PyTreeKind::kNone: return nb::none();
    case PyTreeKind::kTuple: return TupleOf(children, node.arity);
    case PyTreeKind::kList: {
      nb::object list = nb::steal(PyList_New(node.arity));
      for (Py_ssize_t i = 0; i < node.arity; ++i) {
        PyList_SET_ITEM(list.ptr(), i, children[i].release().ptr());
      }
      return list;
    }
    case PyTreeKind::kDict: {
      nb::dict dict;
      for (Py_ssize_t i = 0; i < node.arity; ++i) {
        dict[node.dict_keys[i]] = children[i];
      }
      return std::move(dict);
    }
    case PyTreeKind::kNamedTuple: {
      nb::object args = TupleOf(children, node.arity);
      PyObject* result =
          PyObject_Call(node.node_data.ptr(), args.ptr(), nullptr);
      if (result == nullptr) throw nb::python_error();
      return nb::steal(result);
    }
    case PyTreeKind::kCustom: {
      nb::object args = TupleOf(children, node.arity);
      return node.custom->from_iterable(node.node_data, args);
    }
    case PyTreeKind::kDataclass: {
      nb::dict kwargs;
      const auto& data_fields = node.custom->data_fields;
      const auto& meta_fields = node.custom->meta_fields;
      for (size_t i = 0; i < data_fields.size(); ++i) {
        kwargs[data_fields[i]] = children[i];
      }
      for (size_t i = 0; i < meta_fields.size(); ++i) {
        kwargs[meta_fields[i]] =
            nb::handle(PyTuple_GET_ITEM(node.node_data.ptr(), i));
      }
      PyObject* empty = PyTuple_New(0);
      PyObject* result =
          PyObject_Call(node.custom->type.ptr(), empty, kwargs.ptr());
      Py_DECREF(empty);
      if (result == nullptr) throw nb::python_error();
      return nb::steal(result);
    }
    case PyTreeKind::kLeaf: break;
  }
  JAXLIB_PATCH_INTERNAL_ERROR("MakeNode called on a leaf");
}

namespace {

[[noreturn]] void ThrowExternalReference() {
  throw nb::value_error(
      "This PyTreeDef refers to a shared node outside of it (it was cut out "
      "of a larger treedef by children()); rebuild the whole treedef with "
      "from_node_data_and_children or treedef_tuple before using it.");
}

// Runs the traversal forwards: `leaf(i)` gives the object of the leaf at
// position i, `node(n, children)` builds a node from its children. The object
// built for an opted-in node is remembered in `shared`, by position, and
// every reference to it gets that same object.
template <typename LeafFn, typename NodeFn>
nb::object BuildBottomUp(const Traversal& traversal, LeafFn&& leaf,
                         NodeFn&& node_fn, std::vector<nb::object>& shared) {
  std::vector<nb::object> agenda;
  // The stack never holds more than every position: one allocation, where
  // growing by doubling cost several on the small trees of every call.
  agenda.reserve(traversal.size());
  // `shared` is allocated at the first opted-in node, which comes before any
  // reference to it.
  for (size_t i = 0; i < traversal.size(); ++i) {
    const Node& node = traversal[i];
    if (node.kind == PyTreeKind::kLeaf) {
      agenda.push_back(leaf(i));
      continue;
    }
    if (node.is_reference()) {
      if (node.shared_distance > static_cast<Py_ssize_t>(i)) {
        ThrowExternalReference();
      }
      const size_t target = i - node.shared_distance;
      JAXLIB_PATCH_EXPECT(target < shared.size() && shared[target].is_valid(),
                          "Reference to a node that was not built");
      agenda.push_back(shared[target]);
      continue;
    }
    JAXLIB_PATCH_EXPECT(static_cast<Py_ssize_t>(agenda.size()) >= node.arity,
                        "Too few elements for PyTreeDef node");
    nb::object built =
        node_fn(node, agenda.data() + agenda.size() - node.arity);
    agenda.resize(agenda.size() - node.arity);
    if (KeepsIdentity(node.custom)) {
      if (shared.empty()) shared.resize(traversal.size());
      shared[i] = built;
    }
    agenda.push_back(std::move(built));
  }
  JAXLIB_PATCH_EXPECT(agenda.size() == 1,
                      "A validated traversal built other than one root");
  return std::move(agenda.back());
}

// Hands out the leaves one at a time, as stock jaxlib reads them: a list or
// tuple by index; any other iterable through its iterator, fetching the next
// item as soon as one is taken (so an iterator that fails after the last leaf
// fails before the nodes above that leaf are built). Running out, or having
// some left at the end, raises ValueError with stock's messages (unflatten's
// give the counts, walk's do not).
class LeafReader {
 public:
  LeafReader(nb::handle leaves, Py_ssize_t expected, bool with_counts)
      : expected_(expected), with_counts_(with_counts) {
    if (PyList_CheckExact(leaves.ptr()) || PyTuple_CheckExact(leaves.ptr())) {
      sequence_ = nb::borrow(leaves);
    } else {
      iterator_ = nb::steal(PyObject_GetIter(leaves.ptr()));
      if (!iterator_.is_valid()) throw nb::python_error();
    }
  }

  nb::object Next() {
    if (sequence_.is_valid()) {
      if (read_ < PySequence_Fast_GET_SIZE(sequence_.ptr())) {
        return nb::borrow(PySequence_Fast_GET_ITEM(sequence_.ptr(), read_++));
      }
      ThrowTooFew();
    }
    if (!fetched_) Fetch();
    if (!pending_.is_valid()) ThrowTooFew();
    nb::object leaf = std::move(pending_);
    ++read_;
    Fetch();
    return leaf;
  }

  void CheckExhausted() {
    bool more;
    if (sequence_.is_valid()) {
      more = read_ < PySequence_Fast_GET_SIZE(sequence_.ptr());
    } else {
      if (!fetched_) Fetch();
      more = pending_.is_valid();
    }
    if (more) {
      throw nb::value_error(with_counts_
                                ? ("Too many leaves for PyTreeDef; expected " +
                                   std::to_string(expected_) + ".")
                                      .c_str()
                                : "Too many leaves for PyTreeDef");
    }
  }

 private:
  void Fetch() {
    fetched_ = true;
    pending_ = nb::steal(PyIter_Next(iterator_.ptr()));
    if (!pending_.is_valid() && PyErr_Occurred()) throw nb::python_error();
  }

  [[noreturn]] void ThrowTooFew() const {
    throw nb::value_error(with_counts_
                              ? ("Too few leaves for PyTreeDef; expected " +
                                 std::to_string(expected_) + ", got " +
                                 std::to_string(read_))
                                    .c_str()
                              : "Too few leaves for PyTreeDef");
  }

  nb::object sequence_, iterator_;
  nb::object pending_;  // The iterator's next item, once fetched.
  bool fetched_ = false;
  Py_ssize_t read_ = 0;
  const Py_ssize_t expected_;
  const bool with_counts_;
};

}  // namespace

nb::object PyTreeDef::Unflatten(nb::iterable leaves) const {
  registry();  // Raises on a treedef emptied by the garbage collector.
  LeafReader reader(leaves, num_leaves(), /*with_counts=*/true);
  std::vector<nb::object> built;
  BuiltTwice built_twice;
  nb::object tree = BuildBottomUp(
      traversal_, [&](size_t) { return reader.Next(); },
      [&](const Node& node, nb::object* children) {
        if (node.custom != nullptr) built_twice.Note(node.custom);
        return MakeNode(node, children);
      },
      built);
  reader.CheckExhausted();
  if (!written_out_ties_.empty()) ReportWrittenOutTies(built);
  return tree;
}

void PyTreeDef::ReportWrittenOutTies(
    const std::vector<nb::object>& built) const {
  // Built as stock builds them, a copy per place: the values are stock's
  // whatever reads the result's sharing later (cotangents count one object
  // once). Whether the copies matter is for the observer to say.
  nb::object observer =
      nb::getattr(registry_ref_, "tie_split_observer", nb::none());
  if (observer.is_none()) return;
  nb::list pairs;
  for (const WrittenOutTie& tie : written_out_ties_) {
    pairs.append(nb::make_tuple(built[tie.first], built[tie.copy]));
  }
  observer(pairs);
}

nb::object PyTreeDef::Walk(const nb::callable& f_node, nb::handle f_leaf,
                           nb::iterable leaves) const {
  registry();  // Raises on a treedef emptied by the garbage collector.
  LeafReader reader(leaves, num_leaves(), /*with_counts=*/false);
  std::vector<nb::object> built;
  nb::object tree = BuildBottomUp(
      traversal_, [&](size_t) { return f_leaf(reader.Next()); },
      [&](const Node& node, nb::object* children) {
        nb::object tuple = TupleOf(children, node.arity);
        return f_node(tuple, ExportedNodeData(node));
      },
      built);
  reader.CheckExhausted();
  return tree;
}

nb::object PyTreeDef::FromIterableTree(nb::handle tree) const {
  registry();  // Raises on a treedef emptied by the garbage collector.
  // First, top-down, the object that stands at each position of the
  // traversal; then the objects are built bottom-up as by unflatten.
  std::vector<nb::object> at(traversal_.size());
  std::vector<nb::object> agenda;
  agenda.push_back(nb::borrow(tree));
  for (Py_ssize_t i = traversal_.size() - 1; i >= 0; --i) {
    const Node& node = traversal_[i];
    at[i] = std::move(agenda.back());
    agenda.pop_back();
    if (node.kind == PyTreeKind::kLeaf || node.is_reference()) continue;
    std::vector<nb::object> items;
    for (nb::handle item : nb::iter(at[i])) items.push_back(nb::borrow(item));
    if (static_cast<Py_ssize_t>(items.size()) != node.arity) {
      throw nb::value_error("Arity mismatch between trees");
    }
    for (nb::object& item : items) agenda.push_back(std::move(item));
  }
  std::vector<nb::object> built;
  return BuildBottomUp(
      traversal_, [&](size_t i) { return std::move(at[i]); },
      [](const Node& node, nb::object* children) {
        return MakeNode(node, children);
      },
      built);
}

}  // namespace jaxlib_patch
