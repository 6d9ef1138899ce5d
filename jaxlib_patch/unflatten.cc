// Building objects from a treedef: PyTreeDef.unflatten, walk and
// from_iterable_tree. All three run the traversal forwards, building each node
// from its children, and build a shared node once.

#include <algorithm>
#include <map>
#include <string>
#include <unordered_map>
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
// built for an opted-in node is remembered, and every reference to it gets
// that same object.
template <typename LeafFn, typename NodeFn>
nb::object BuildBottomUp(const Traversal& traversal, LeafFn&& leaf,
                         NodeFn&& node_fn) {
  std::vector<nb::object> agenda;
  // The stack never holds more than every position: one allocation, where
  // growing by doubling cost several on the small trees of every call.
  agenda.reserve(traversal.size());
  // Indexed by position; allocated at the first opted-in node, which comes
  // before any reference to it.
  std::vector<nb::object> shared;
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

namespace {

// Unflatten of a treedef that records written-out ties. The leaves are read
// up front, so that a place can be compared with the object's other places
// before anything is built under it. Going forwards, at the first node of a
// copy's subtree the copy (the outermost one first, where several start
// there) takes the object built at the first of the object's places whose
// leaves are the very objects under it: nothing in the values tells those
// places apart, so they stay one object, as a tree map keeps them. A copy
// whose leaves differ from those of every place before it is built apart,
// and reported beside the object of the first place.
class RetyingBuilder {
 public:
  RetyingBuilder(const Traversal& traversal,
                 const std::vector<PyTreeDef::WrittenOutTie>& ties,
                 std::vector<nb::object> leaves)
      : traversal_(traversal), ties_(ties), leaves_(std::move(leaves)) {
    built_.resize(traversal.size());
    first_leaf_.resize(traversal.size() + 1);
    // first_leaf_[i]: how many leaves come before node i's subtree.
    Py_ssize_t leaves_so_far = 0;
    for (size_t i = 0; i < traversal.size(); ++i) {
      leaves_so_far += traversal[i].kind == PyTreeKind::kLeaf ? 1 : 0;
      first_leaf_[i] = leaves_so_far - traversal[i].num_leaves;
    }
    for (size_t t = 0; t < ties.size(); ++t) {
      const Node& copy = traversal[ties[t].copy];
      starting_.push_back({ties[t].copy - copy.num_nodes + 1, t});
      first_of_copy_[ties[t].copy] = ties[t].first;
    }
    // By start, and the outermost copy (the one ending last) first.
    std::sort(
        starting_.begin(), starting_.end(), [&](const auto& a, const auto& b) {
          return a.first != b.first ? a.first < b.first
                                    : ties[a.second].copy > ties[b.second].copy;
        });
  }

  nb::object Build() {
    std::vector<nb::object> agenda;
    agenda.reserve(traversal_.size());
    size_t next_start = 0;
    Py_ssize_t leaf = 0;
    for (Py_ssize_t i = 0; i < static_cast<Py_ssize_t>(traversal_.size());
         ++i) {
      for (; next_start < starting_.size() && starting_[next_start].first < i;
           ++next_start) {
      }
      const auto [kept, like] = KeptCopyStartingAt(i, next_start);
      if (kept >= 0) {
        const PyTreeDef::WrittenOutTie& tie = ties_[kept];
        agenda.push_back(built_[like]);
        leaf += traversal_[tie.copy].num_leaves;
        i = tie.copy;
        continue;
      }
      const Node& node = traversal_[i];
      if (node.kind == PyTreeKind::kLeaf) {
        agenda.push_back(leaves_[leaf++]);
        continue;
      }
      JAXLIB_PATCH_EXPECT(!node.is_reference(),
                          "A reference in a written-out layout");
      JAXLIB_PATCH_EXPECT(static_cast<Py_ssize_t>(agenda.size()) >= node.arity,
                          "Too few elements for PyTreeDef node");
      nb::object made =
          MakeNode(node, agenda.data() + agenda.size() - node.arity);
      agenda.resize(agenda.size() - node.arity);
      if (KeepsIdentity(node.custom)) built_[i] = made;
      const auto copy_of = first_of_copy_.find(i);
      if (copy_of != first_of_copy_.end()) {
        built_apart_[copy_of->second].push_back(i);
      }
      agenda.push_back(std::move(made));
    }
    JAXLIB_PATCH_EXPECT(agenda.size() == 1,
                        "A validated traversal built other than one root");
    return std::move(agenda.back());
  }

  // The first place's object and each other object built for the same
  // object's places.
  nb::list SplitPairs() const {
    nb::list pairs;
    for (const auto& [first, copies] : built_apart_) {
      for (Py_ssize_t copy : copies) {
        pairs.append(nb::make_tuple(built_[first], built_[copy]));
      }
    }
    return pairs;
  }

 private:
  // The tie whose copy starts at node `i` and can take the object of an
  // earlier place, and that place's index, among the ties from
  // `starting_[from]` on; {-1, -1} if none.
  std::pair<Py_ssize_t, Py_ssize_t> KeptCopyStartingAt(Py_ssize_t i,
                                                       size_t from) const {
    for (size_t k = from; k < starting_.size() && starting_[k].first == i;
         ++k) {
      const PyTreeDef::WrittenOutTie& tie = ties_[starting_[k].second];
      if (!built_[tie.first].is_valid()) continue;
      if (SameLeaves(tie.first, tie.copy))
        return {starting_[k].second, tie.first};
      const auto apart = built_apart_.find(tie.first);
      if (apart == built_apart_.end()) continue;
      for (Py_ssize_t place : apart->second) {
        if (SameLeaves(place, tie.copy)) return {starting_[k].second, place};
      }
    }
    return {-1, -1};
  }

  // Whether the leaves under the nodes at `a` and `b` are the very same
  // objects.
  bool SameLeaves(Py_ssize_t a, Py_ssize_t b) const {
    const Py_ssize_t n = traversal_[b].num_leaves;
    if (traversal_[a].num_leaves != n) return false;
    const Py_ssize_t from_a = first_leaf_[a], from_b = first_leaf_[b];
    for (Py_ssize_t k = 0; k < n; ++k) {
      if (!leaves_[from_a + k].is(leaves_[from_b + k])) return false;
    }
    return true;
  }

  const Traversal& traversal_;
  const std::vector<PyTreeDef::WrittenOutTie>& ties_;
  const std::vector<nb::object> leaves_;
  // The object built at each opted-in node's place (a kept copy's stays
  // unset, and so does every node under it).
  std::vector<nb::object> built_;
  std::vector<Py_ssize_t> first_leaf_;
  // (first node of a copy's subtree, index of its tie), sorted.
  std::vector<std::pair<Py_ssize_t, size_t>> starting_;
  // The first place of each copy, by the copy's index.
  std::unordered_map<Py_ssize_t, Py_ssize_t> first_of_copy_;
  // The places built apart of each object, by its first place; ordered, so
  // that the pairs are reported in the traversal's order.
  std::map<Py_ssize_t, std::vector<Py_ssize_t>> built_apart_;
};

}  // namespace

nb::object PyTreeDef::Unflatten(nb::iterable leaves) const {
  registry();  // Raises on a treedef emptied by the garbage collector.
  LeafReader reader(leaves, num_leaves(), /*with_counts=*/true);
  if (!written_out_ties_.empty()) {
    std::vector<nb::object> read;
    read.reserve(num_leaves());
    for (Py_ssize_t k = 0; k < num_leaves(); ++k) read.push_back(reader.Next());
    reader.CheckExhausted();
    RetyingBuilder builder(traversal_, written_out_ties_, std::move(read));
    nb::object tree = builder.Build();
    nb::list split = builder.SplitPairs();
    if (PyList_GET_SIZE(split.ptr()) > 0) {
      nb::object observer =
          nb::getattr(registry_ref_, "tie_split_observer", nb::none());
      if (!observer.is_none()) observer(split);
    }
    return tree;
  }
  nb::object tree = BuildBottomUp(
      traversal_, [&](size_t) { return reader.Next(); },
      [](const Node& node, nb::object* children) {
        return MakeNode(node, children);
      });
  reader.CheckExhausted();
  return tree;
}

nb::object PyTreeDef::Walk(const nb::callable& f_node, nb::handle f_leaf,
                           nb::iterable leaves) const {
  registry();  // Raises on a treedef emptied by the garbage collector.
  LeafReader reader(leaves, num_leaves(), /*with_counts=*/false);
  nb::object tree = BuildBottomUp(
      traversal_, [&](size_t) { return f_leaf(reader.Next()); },
      [&](const Node& node, nb::object* children) {
        nb::object tuple = TupleOf(children, node.arity);
        return f_node(tuple, ExportedNodeData(node));
      });
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
  return BuildBottomUp(
      traversal_, [&](size_t i) { return std::move(at[i]); },
      [](const Node& node, nb::object* children) {
        return MakeNode(node, children);
      });
}

}  // namespace jaxlib_patch
