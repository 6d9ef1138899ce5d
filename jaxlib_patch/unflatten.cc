// Building objects from a treedef: PyTreeDef.unflatten, walk and
// from_iterable_tree. All three run the traversal forwards, building each node
// from its children, and build a shared node once.

#include <array>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "jaxlib_patch/pytree.h"

namespace jaxlib_patch {

namespace {

// The objects built so far, each an owned reference. Every position of a
// traversal pushes one object, so a stack of its size never overflows and a
// push needs no check; the trees of most calls fit the inline room, which
// saves an allocation per unflatten. A node takes its children from the top
// (Top), nulling each as it takes it, and they are popped (Pop) once it has
// taken them all; until then the stack releases those it still holds.
class BuildStack {
 public:
  explicit BuildStack(size_t capacity) {
    if (capacity > kInline) {
      // Not zeroed: only the slots below `size_` are ever read.
      heap_.reset(new PyObject*[capacity]);
      data_ = heap_.get();
    }
  }
  BuildStack(const BuildStack&) = delete;
  BuildStack& operator=(const BuildStack&) = delete;
  ~BuildStack() {
    while (size_ > 0) Py_XDECREF(data_[--size_]);
  }

  size_t size() const { return size_; }
  void Push(nb::object object) { data_[size_++] = object.release().ptr(); }
  // For a run of pushes: the slot after the top, and the new top's end once
  // owned references are written up to it.
  PyObject** End() { return data_ + size_; }
  void ExtendTo(PyObject** end) { size_ = end - data_; }
  PyObject** Top(size_t n) { return data_ + size_ - n; }
  void Pop(size_t taken) { size_ -= taken; }
  nb::object Pop() { return nb::steal(data_[--size_]); }

 private:
  static constexpr size_t kInline = 32;
  PyObject* inline_[kInline];
  PyObject** data_ = inline_;
  std::unique_ptr<PyObject*[]> heap_;
  size_t size_ = 0;
};

}  // namespace

// Steals `children[0:n]` into a new tuple or list.
template <nb::object (*kNew)(Py_ssize_t)>
static nb::object SequenceOf(PyObject** children, Py_ssize_t n) {
  nb::object sequence = kNew(n);
  PyObject** items = PySequence_Fast_ITEMS(sequence.ptr());
  for (Py_ssize_t i = 0; i < n; ++i)
    items[i] = std::exchange(children[i], nullptr);
  return sequence;
}

static nb::object NewTuple(Py_ssize_t n) {
  PyObject* tuple = PyTuple_New(n);
  if (tuple == nullptr) throw nb::python_error();
  return nb::steal(tuple);
}

static nb::object NewList(Py_ssize_t n) {
  PyObject* list = PyList_New(n);
  if (list == nullptr) throw nb::python_error();
  return nb::steal(list);
}

static nb::object TupleOf(PyObject** children, Py_ssize_t n) {
  return SequenceOf<NewTuple>(children, n);
}

// Takes `children[0:n]` once a node holds references of its own.
static void ReleaseChildren(PyObject** children, Py_ssize_t n) {
  for (Py_ssize_t i = 0; i < n; ++i) Py_CLEAR(children[i]);
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

static nb::object MakeNode(const Node& node, PyObject** children) {
  switch (node.kind) {
    case PyTreeKind::kNone: return nb::none();
    case PyTreeKind::kTuple: return TupleOf(children, node.arity);
    case PyTreeKind::kList: return SequenceOf<NewList>(children, node.arity);
    case PyTreeKind::kDict: {
      // At its final size from the start: grown one insertion at a time, a
      // dict of n keys is rebuilt about log(n) times on the way.
      nb::object dict = nb::steal(_PyDict_NewPresized(node.arity));
      if (!dict.is_valid()) throw nb::python_error();
      for (Py_ssize_t i = 0; i < node.arity; ++i) {
        if (PyDict_SetItem(dict.ptr(), node.dict_keys[i].ptr(), children[i]) <
            0) {
          throw nb::python_error();
        }
      }
      ReleaseChildren(children, node.arity);
      return dict;
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
      // Called directly: nanobind's call would hold and release each
      // argument and check the result once more, on every custom node.
      PyObject* call_args[] = {node.node_data.ptr(), args.ptr()};
      PyObject* result = PyObject_Vectorcall(node.custom->from_iterable.ptr(),
                                             call_args, 2, nullptr);
      if (result == nullptr) throw nb::python_error();
      return nb::steal(result);
    }
    case PyTreeKind::kDataclass: {
      nb::dict kwargs;
      const auto& data_fields = node.custom->data_fields;
      const auto& meta_fields = node.custom->meta_fields;
      for (size_t i = 0; i < data_fields.size(); ++i) {
        kwargs[data_fields[i]] = nb::handle(children[i]);
      }
      ReleaseChildren(children, node.arity);
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

// Runs the traversal forwards: `push_leaves(i, stack)` pushes the object of
// the leaf at position i (and may push those of the positions after it) and
// returns the position after the last it pushed; `node(n, children)` builds a
// node from its children. The object built for an opted-in node is remembered
// in `shared`, by position, and every reference to it gets that same object.
template <typename PushLeavesFn, typename NodeFn>
nb::object BuildBottomUp(const Traversal& traversal, PushLeavesFn&& push_leaves,
                         NodeFn&& node_fn, std::vector<nb::object>& shared) {
  BuildStack stack(traversal.size());
  // `shared` is allocated at the first opted-in node, which comes before any
  // reference to it.
  for (size_t i = 0; i < traversal.size();) {
    const Node& node = traversal[i];
    if (node.kind == PyTreeKind::kLeaf) {
      i = push_leaves(i, stack);
      continue;
    }
    if (node.is_reference()) {
      if (node.shared_distance > static_cast<Py_ssize_t>(i)) {
        ThrowExternalReference();
      }
      const size_t target = i - node.shared_distance;
      JAXLIB_PATCH_EXPECT(target < shared.size() && shared[target].is_valid(),
                          "Reference to a node that was not built");
      stack.Push(shared[target]);
      ++i;
      continue;
    }
    JAXLIB_PATCH_EXPECT(static_cast<Py_ssize_t>(stack.size()) >= node.arity,
                        "Too few elements for PyTreeDef node");
    nb::object built = node_fn(node, stack.Top(node.arity));
    stack.Pop(node.arity);
    if (KeepsIdentity(node.custom)) {
      if (shared.empty()) shared.resize(traversal.size());
      shared[i] = built;
    }
    stack.Push(std::move(built));
    ++i;
  }
  JAXLIB_PATCH_EXPECT(stack.size() == 1,
                      "A validated traversal built other than one root");
  return stack.Pop();
}

// Hands out the leaves one at a time, as stock jaxlib reads them: through an
// iteration that fetches the next item as soon as one is taken (so an
// iterator that fails after the last leaf fails before the nodes above that
// leaf are built, and a list that a node's from_iterable shortens or extends
// is read as its iterator would read it). A list or tuple is read in place, as
// its own iterator reads it: by index, against its length at each fetch, and
// over for good once an index is past it. Running out, or having some left at
// the end, raises ValueError with stock's messages (unflatten's give the
// counts, walk's do not).
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
    if (!fetched_) Fetch();
    if (!pending_.is_valid()) ThrowTooFew();
    nb::object leaf = std::move(pending_);
    ++read_;
    Fetch();
    return leaf;
  }

  // Pushes the leaf at position `i` of `traversal` and, from a list or tuple,
  // the leaves and None nodes that follow it there up to the next other
  // node; returns the position after the last one pushed. A run is most of
  // the positions of most trees (a list of arrays, a layer's weights), and
  // no Python code runs while one is read, so its items are read in place.
  size_t PushRun(const Traversal& traversal, size_t i, BuildStack& stack) {
    if (!sequence_.is_valid()) {
      stack.Push(Next());
      return i + 1;
    }
    if (!fetched_) Fetch();
    {
      // Under the list's lock on the free-threaded build, as its iterator
      // reads it; nothing in the loop can block or run Python code.
      nb::ft_object_guard guard(sequence_);
      PyObject* const* items = PySequence_Fast_ITEMS(sequence_.ptr());
      const Py_ssize_t size = PySequence_Fast_GET_SIZE(sequence_.ptr());
      // The loop holds the pending item in a register: it throws nothing,
      // and hands everything back to the members after.
      PyObject* pending = pending_.release().ptr();
      Py_ssize_t next_index = next_index_;
      Py_ssize_t read = read_;
      PyObject** end = stack.End();
      const Node* const nodes = traversal.data();
      const size_t num_nodes = traversal.size();
      for (; i < num_nodes; ++i) {
        const Node& node = nodes[i];
        if (node.kind == PyTreeKind::kLeaf) {
          if (pending == nullptr) break;
          *end++ = pending;
          ++read;
          pending =
              next_index < size ? Py_NewRef(items[next_index++]) : nullptr;
        } else if (node.kind == PyTreeKind::kNone && !node.is_reference()) {
          *end++ = Py_NewRef(Py_None);
        } else {
          break;
        }
      }
      stack.ExtendTo(end);
      pending_ = nb::steal(pending);
      next_index_ = next_index;
      read_ = read;
    }
    if (i < traversal.size() && traversal[i].kind == PyTreeKind::kLeaf) {
      ThrowTooFew();
    }
    return i;
  }

  void CheckExhausted() {
    if (!fetched_) Fetch();
    if (pending_.is_valid()) {
      throw nb::value_error(with_counts_
                                ? ("Too many leaves for PyTreeDef; expected " +
                                   std::to_string(expected_) + ".")
                                      .c_str()
                                : "Too many leaves for PyTreeDef");
    }
  }

 private:
  // Called once at first and then only after a leaf is taken, so that a
  // fetch that finds nothing ends the reading.
  void Fetch() {
    fetched_ = true;
    if (sequence_.is_valid()) {
      nb::ft_object_guard guard(sequence_);
      if (next_index_ < PySequence_Fast_GET_SIZE(sequence_.ptr())) {
        pending_ = nb::borrow(
            PySequence_Fast_GET_ITEM(sequence_.ptr(), next_index_++));
      }
      return;
    }
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
  nb::object pending_;  // The next item, once fetched; null once none is.
  bool fetched_ = false;
  Py_ssize_t next_index_ = 0;  // A list's or tuple's, of the next fetch.
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
      traversal_,
      [&](size_t i, BuildStack& stack) {
        return reader.PushRun(traversal_, i, stack);
      },
      [&](const Node& node, PyObject** children) {
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
      traversal_,
      [&](size_t i, BuildStack& stack) {
        stack.Push(f_leaf(reader.Next()));
        return i + 1;
      },
      [&](const Node& node, PyObject** children) {
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
      traversal_,
      [&](size_t i, BuildStack& stack) {
        stack.Push(std::move(at[i]));
        return i + 1;
      },
      [](const Node& node, PyObject** children) {
        return MakeNode(node, children);
      },
      built);
}

}  // namespace jaxlib_patch
