// A drop-in replacement for the `pytree` submodule of jaxlib._jax, extended
// with relative identities: nodes of classes registered with
// `preserve_relative_identities=True` that occur several times in one flatten
// are recorded once, and every later occurrence becomes a reference to the
// first. Unflattening builds each shared node once and reuses it.
//
// A treedef is a post-order traversal: one `Node` per node or leaf, children
// before their parent. A reference is a node with no children whose
// `shared_distance` says how many positions earlier in the traversal its
// target lies. Distances rather than absolute indices keep a slice of the
// traversal (a child treedef) meaningful, and keep concatenations of slices
// (from_node_data_and_children, treedef_tuple) equal to the original.

#ifndef JAXLIB_PATCH_PYTREE_H_
#define JAXLIB_PATCH_PYTREE_H_

#include <Python.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "jaxlib_patch/exceptions.h"
#include "jaxlib_patch/recycling_allocator.h"
#include "jaxlib_patch/text.h"

namespace jaxlib_patch {

namespace nb = nanobind;

// Values match stock jaxlib: they appear in pickled treedefs.
enum class PyTreeKind : int {
  kLeaf = 0,
  kNone = 1,
  kTuple = 2,
  kNamedTuple = 3,
  kList = 4,
  kDict = 5,
  kCustom = 6,
  kDataclass = 7,
};

// 2^64 divided by the golden ratio: its bits, irregular and half set,
// spread consecutive values over the whole range.
constexpr uint64_t kGoldenRatio = 0x9e3779b97f4a7c15ULL;

// Hashes an object (or type) by address for the maps keyed by pointers. Those
// maps pick a bucket from the hash's low bits, and std::hash of a pointer is
// either the address itself, whose low 4 bits are always 0 (CPython aligns
// objects to 16 bytes), so that most buckets stay empty and the probes grow
// long (libstdc++), or a murmur hash of it, about a hundred instructions on
// the hot path of every leaf (libc++). Multiplying spreads every address bit
// into the high half, folded back down.
struct PointerHash {
  size_t operator()(const void* ptr) const {
    const uint64_t mixed = reinterpret_cast<uintptr_t>(ptr) * kGoldenRatio;
    return static_cast<size_t>(mixed ^ (mixed >> 32));
  }
};

class PyTreeDef;

class PyTreeRegistry {
 public:
  // A class given to OptInRelativeIdentities.
  struct OptedInBase {
    nb::object type;
    // Whether the first object met at two places of a class this base opted
    // in has been reported (ReportInheritedTie). Atomic: flattens on several
    // threads may meet one at once.
    mutable std::atomic<bool> tie_reported = false;
  };

  struct Registration {
    PyTreeKind kind;
    nb::object type;
    // kCustom only.
    nb::object to_iterable;
    nb::object from_iterable;
    nb::object to_iterable_with_keys;  // None when not given.
    // kDataclass only.
    std::vector<nb::str> data_fields;
    std::vector<nb::str> meta_fields;
    // Set at registration, or later by OptInRelativeIdentities (never
    // cleared).
    bool preserve_relative_identities = false;
    // Registered with preserve_relative_identities=False said in so many
    // words: the opt-in of a base class (before or after) passes it by.
    bool declines_relative_identities = false;
    // The proper base class whose opt-in reached this class, null where it
    // was opted in by its own flag or by name (or not at all): its author
    // may have written it for stock's copies, so the first object met at two
    // places of a class a base opted in is reported (ReportInheritedTie).
    const OptedInBase* opted_in_by = nullptr;
    // An unflatten built instances at two places of one tree before the
    // type kept identities: where they were one object, they are two now
    // (OptInRelativeIdentities reports it). Atomic: unflattens on several
    // threads set it.
    mutable std::atomic<bool> built_by_unflatten = false;
    // The inherited_tie_observer declined to tell an object of this class
    // (met where a library aliases it, say): its objects are not handed to
    // it again. Atomic as built_by_unflatten.
    mutable std::atomic<bool> inherited_tie_declined = false;
  };

  PyTreeRegistry(bool enable_none, bool enable_tuple, bool enable_namedtuple,
                 bool enable_list, bool enable_dict,
                 bool keeps_relative_identities = true);
  // A twin of `registry` (held by `registry_ref`): the same builtin nodes and
  // the very same registrations and opt-ins, read and written through either,
  // laid out with or without relative identities as `keeps_relative_
  // identities` says. JAX flattens its own trees in stock's layout and the
  // user's with identities, through two registries that must never disagree
  // on how a type flattens: one family of registrations, written to every
  // twin's map by the origin, makes that hold by construction, whoever
  // registers on which of them.
  PyTreeRegistry(PyTreeRegistry& registry, nb::object registry_ref,
                 bool keeps_relative_identities);
  ~PyTreeRegistry();
  // Treedefs point into a registry's registrations: it is never copied (and
  // nanobind, seeing it cannot be, binds no copy).
  PyTreeRegistry(const PyTreeRegistry&) = delete;
  PyTreeRegistry& operator=(const PyTreeRegistry&) = delete;

  // `preserve_relative_identities`: true opts the class in, false keeps it
  // out whatever its bases, nullopt follows its bases' opt-ins.
  void RegisterNode(nb::object type, nb::object to_iterable,
                    nb::object from_iterable, nb::object to_iterable_with_keys,
                    std::optional<bool> preserve_relative_identities);
  void RegisterDataclassNode(nb::object type, std::vector<nb::str> data_fields,
                             std::vector<nb::str> meta_fields,
                             std::optional<bool> preserve_relative_identities);

  // The registration of exactly `type` (subclasses are not looked through),
  // or nullptr.
  const Registration* Lookup(PyTypeObject* type) const;

  // How objects of `type` flatten (kLeaf if not at all). Sets `*custom` for
  // kCustom and kDataclass.
  PyTreeKind KindOfType(PyTypeObject* type, const Registration** custom) const;
  PyTreeKind KindOfObject(nb::handle obj, const Registration** custom) const {
    return KindOfType(Py_TYPE(obj.ptr()), custom);
  }

  bool IsNode(nb::handle type) const;

  // Whether this registry's flattens keep relative identities. A registry
  // made without them still records which types opted in (its treedefs equal
  // those of a registry with them wherever nothing is shared), but writes a
  // shared node out at each of its positions, as stock jaxlib does, and its
  // treedefs' flatten_up_to takes a tree that shares as stock takes it.
  bool keeps_relative_identities() const { return keeps_relative_identities_; }
  // `self` (this registry's Python object), or the family's origin where it
  // keeps relative identities and `treedef` was made by a registry that
  // keeps them or shares nodes: whose flattens come out in its layout.
  nb::object InLayoutOf(nb::handle self, const PyTreeDef& treedef) const;
  // Whether a flatten with this registry keeps relative identities now, on
  // this thread: as the registry says, but never inside a stock-layout
  // section (a custom derivative rule runs as on stock, so that the trees
  // it builds from the copies it is given never tie them again).
  bool keeps_relative_identities_now() const {
    return keeps_relative_identities_ && stock_layout_depth == 0;
  }
  // How many stock-layout sections this thread is in (module.cc's
  // enter_stock_layout and exit_stock_layout).
  static inline thread_local int stock_layout_depth = 0;
  // How many stock-layout sections are open on all threads: read before
  // stock_layout_depth where every call would pay for it (unflatten and ==
  // of any treedef), since a thread-local variable of a shared library is
  // read through a call to the TLS resolver. A thread in a section counts
  // in it, so it never sees zero there.
  static inline std::atomic<int> open_stock_layout_sections = 0;
  // How many times this thread unflattened or compared a treedef with
  // shared nodes inside a stock-layout section (module.cc's
  // tied_treedefs_met): a structure traced on a caller's tied trees, met
  // where copies of them are handed out.
  static inline thread_local Py_ssize_t tied_treedefs_met = 0;

  // Registrations are never removed, and each one, in any registry, moves
  // this process-wide count: while it stands, no type has changed how it
  // flattens in any registry. One count for all registries, so that the jit
  // front door's leaf memo checks it with a single load.
  static size_t registration_epoch() {
    return registration_epoch_.load(std::memory_order_relaxed);
  }

  // Whether any class keeps relative identities in this registry's family of
  // twins: one registered with the flag, or a class or base given to
  // OptInRelativeIdentities. Never false again once true (opt-ins are never
  // taken back). While false no flatten with it can share a node, so the jit
  // front door sends calls as they are to the stock dispatch.
  bool has_opt_ins() const {
    return origin_->has_opt_ins_.load(std::memory_order_relaxed);
  }

  // Opts `type` and every subclass of it, registered now or later, in to
  // relative identities. `type` itself need not be registered.
  // Returns the classes it opted in now whose instances an unflatten built
  // before (a late opt-in: the caller tells the user).
  nb::list OptInRelativeIdentities(nb::handle type);
  // Whether nodes of `type` keep relative identities: it is registered with
  // them, or it or a base class was opted in by OptInRelativeIdentities.
  bool HasRelativeIdentities(nb::handle type) const;

  // Hands `node`, of a class opted in by a base (Registration::opted_in_by)
  // that a flatten of `tree` met at two places, to `registry`'s (this
  // registry's Python object) `inherited_tie_observer`, if it has one and
  // no object of that base's classes was reported before:
  // observer(tree, node, base). Whether and how the user is told is the
  // observer's to say; a result of False declines this object (not the
  // user's tie), and the base's next one is handed over, of another class.
  static void ReportInheritedTie(nb::handle registry, nb::handle tree,
                                 nb::handle node,
                                 const Registration& registration);

  int Traverse(visitproc visit, void* arg) const;

 private:
  // `preserve_relative_identities` as RegisterNode takes it (nullopt for the
  // builtin nodes, which never inherit an opt-in).
  void Insert(std::unique_ptr<Registration> registration,
              std::optional<bool> preserve_relative_identities = std::nullopt);
  // Whether `type` derives from (or is) a class given to
  // OptInRelativeIdentities.
  bool InheritsOptIn(PyTypeObject* type) const;
  // The entry of `type` itself in opted_in_bases_, or null.
  const OptedInBase* NamedForOptIn(PyTypeObject* type) const;
  // The first entry of opted_in_bases_ that is a proper base of `type`, or
  // null.
  const OptedInBase* OptedInProperBase(PyTypeObject* type) const;

  bool enable_none_, enable_tuple_, enable_list_, enable_dict_;
  bool keeps_relative_identities_;
  // A family of twins has one origin: the registry the first twin was made
  // from, which every twin keeps alive (`origin_ref_`). The origin owns the
  // registrations and the opt-ins, and alone visits them for the garbage
  // collector, so that each reference is visited once.
  PyTreeRegistry* origin_ = this;
  nb::object origin_ref_;
  // The origin's: its twins, whose maps it writes with its own.
  std::vector<PyTreeRegistry*> twins_;
  // The origin's: every registration of the family. Registrations are never
  // removed, so the pointers handed out stay valid for the registry's
  // lifetime (treedefs keep their registry alive).
  std::vector<std::unique_ptr<Registration>> owned_;
  // Each registry's own map of the family's registrations, kept equal by the
  // origin: a lookup, made for every leaf of every flatten, reads a member
  // of the registry it is made on, as stock's does, not the origin's.
  std::unordered_map<PyTypeObject*, Registration*, PointerHash> registrations_;
  // The origin's: the classes given to OptInRelativeIdentities, in call
  // order; never removed, so registrations may point at them.
  std::vector<std::unique_ptr<OptedInBase>> opted_in_bases_;
  // The origin's: has_opt_ins().
  std::atomic<bool> has_opt_ins_{false};
  // Defined here, not in registry.cc: a definition the reader's unit sees is
  // read with one RIP-relative load, not through the GOT.
  static inline std::atomic<size_t> registration_epoch_{0};
};

inline bool KeepsIdentity(const PyTreeRegistry::Registration* custom) {
  return custom != nullptr && custom->preserve_relative_identities;
}

struct Node {
  PyTreeKind kind = PyTreeKind::kLeaf;
  Py_ssize_t arity = 0;
  // tuple/list/None/dict: null. namedtuple: its type. custom: the aux data.
  // dataclass: the tuple of meta field values. A reference: null (the
  // target holds it).
  nb::object node_data;
  // dict: its keys, sorted. Held one by one (not as a list) so that the
  // garbage collector sees each key as the treedef's referent, as in stock.
  std::vector<nb::object> dict_keys;
  const PyTreeRegistry::Registration* custom = nullptr;
  Py_ssize_t num_leaves = 0;
  Py_ssize_t num_nodes = 0;
  // 0 for an ordinary node; d > 0 for a reference to the node d positions
  // earlier. A reference whose target lies before the start of its own
  // treedef (a child treedef cut out of a larger one) is "external".
  Py_ssize_t shared_distance = 0;

  bool is_reference() const { return shared_distance != 0; }
};

// A treedef's nodes, in post-order.
using Traversal = std::vector<Node, RecyclingAllocator<Node>>;

// Mixes `value` into `seed` (boost's hash_combine).
inline size_t HashCombine(size_t seed, size_t value) {
  return seed ^ (value + kGoldenRatio + (seed << 6) + (seed >> 2));
}

// Whether two nodes are the same kind of node with equal node data (their
// sharing aside, and whichever registries made them): what treedef equality
// compares per position, and what a tree prefix must match.
bool NodesEqual(const Node& a, const Node& b);

// Marker returned by `node_data()` for a treedef whose root is a reference:
// `(type, SharedReference(distance))`. `from_node_data_and_children` turns it
// back into a reference.
struct SharedReference {
  Py_ssize_t distance;
};

class PyTreeDef {
 public:
  PyTreeDef(PyTreeRegistry* registry, nb::object registry_ref)
      : registry_(registry),
        registry_ref_(std::move(registry_ref)),
        origin_(NewOrigin()) {}

  // Which node of which treedef a node stands for: `origin` names the treedef
  // (unique per treedef built), `index` the position there of the node
  // itself or, for a reference, of its target.
  struct NodeKey {
    uint64_t origin;
    Py_ssize_t index;
    bool operator==(const NodeKey& other) const {
      return origin == other.origin && index == other.index;
    }
  };
  struct NodeKeyHash {
    size_t operator()(const NodeKey& key) const {
      return HashCombine(std::hash<uint64_t>()(key.origin),
                         std::hash<Py_ssize_t>()(key.index));
    }
  };

  // A place where a flatten that writes a shared node out at each of its
  // places (a registry without relative identities) met an object it had
  // met before: the traversal index of the node written out there, and of
  // the node of the object's first place.
  struct WrittenOutTie {
    Py_ssize_t copy;
    Py_ssize_t first;
  };

  // --- flatten.cc
  // PyTreeRegistry.flatten (leaves) and, with kWithPath, flatten_with_path
  // ((key path, leaf) pairs); `registry` is the registry's Python object.
  template <bool kWithPath>
  static std::pair<nb::list, nb::object> Flatten(
      nb::handle registry, nb::handle tree,
      const std::optional<nb::callable>& leaf_predicate);
  // The same with the treedef left unwrapped (a caller may keep an equal
  // one it wrapped before instead), the list of leaves stored in `leaves`,
  // and room made for `expected_num_nodes` nodes up front; Flatten is this,
  // wrapped.
  template <bool kWithPath>
  static PyTreeDef FlattenUnwrapped(
      nb::handle registry, nb::handle tree,
      const std::optional<nb::callable>& leaf_predicate, nb::object& leaves,
      size_t expected_num_nodes);

  // --- flatten_up_to.cc
  nb::list FlattenUpTo(nb::handle tree) const;

  // --- unflatten.cc
  // Builds the tree; where the treedef records written-out ties, each
  // object built for a later place of an object, beside the one built for
  // its first place, is handed to the registry's `tie_split_observer`
  // attribute if it has one.
  nb::object Unflatten(nb::iterable leaves) const;
  nb::object Walk(const nb::callable& f_node, nb::handle f_leaf,
                  nb::iterable leaves) const;
  nb::object FromIterableTree(nb::handle tree) const;

  // --- treedef_equality.cc
  bool Equals(const PyTreeDef& other) const;
  size_t Hash() const;

  // --- treedef_repr.cc
  nb::str ToString() const;

  // --- treedef_build.cc
  std::vector<nb::object> Children() const;
  nb::object Compose(const PyTreeDef& inner) const;
  static nb::object FromNodeDataAndChildren(
      nb::handle_t<PyTreeRegistry> registry_ref,
      std::optional<std::pair<nb::type_object, nb::object>> node_data,
      nb::iterable children);
  // Takes a list, as stock does, whatever its signature says.
  static nb::object Tuple(nb::handle_t<PyTreeRegistry> registry_ref,
                          nb::list treedefs);

  // --- treedef_ops.cc
  Py_ssize_t num_leaves() const;
  Py_ssize_t num_nodes() const { return traversal_.size(); }
  nb::object NodeData() const;
  // Sharing facts, read off the references (see docs/api.md).
  // Some node is the target of a reference inside this treedef.
  bool HasSharedNodes() const;
  // Counts this treedef in PyTreeRegistry::tied_treedefs_met if it has
  // shared nodes and the thread is in a stock-layout section.
  void NoteIfTiedInStockLayout() const;
  // Some reference's target lies before this treedef's first node (it was
  // cut out of a larger treedef).
  bool HasExternalReferences() const;
  // Whether this treedef remembers places that were one opted-in object,
  // written out at each (the ties its unflatten reports; see
  // written_out_ties_).
  bool HasWrittenOutTies() const { return !written_out_ties_.empty(); }
  // The root is a reference.
  bool IsReference() const;
  // {reference index: target index}, traversal indices counted from this
  // treedef's first node; an external target's index is negative.
  nb::dict SharedReferences() const;

  // --- treedef_paths.cc
  // A walk's way down from the root: for each node it passed (a traversal
  // index, never a reference's), which of the node's children it took.
  using Steps = std::vector<std::pair<Py_ssize_t, size_t>>;
  Steps StepsTo(Py_ssize_t index) const;
  // The key path of `steps`, keyed as flatten_with_path keys `tree`, a tree
  // of this structure: a custom node's keys are known only to its
  // flatten_with_keys. Without a tree, the one this treedef unflattens to
  // with None leaves stands in (stock's prefix errors read keys off such a
  // placeholder tree). Where the objects cannot say, a custom node's
  // children are named by their flat index.
  nb::tuple KeyPath(const Steps& steps, nb::handle tree = nb::handle()) const;

  // --- prefix.cc
  // The prefix's leaves broadcast over this treedef's leaves, one value per
  // leaf, each shared node's once (SharedPrefixError where its occurrences
  // get different values; ValueError if `prefix` is not a prefix).
  nb::list BroadcastFlattenedPrefix(const PyTreeDef& prefix,
                                    nb::handle prefix_leaves) const;

  // --- sharing.cc
  // This tree with every reference replaced by a copy of its target's
  // subtree: what stock jaxlib records for the same tree.
  PyTreeDef Unshared() const;
  // For each leaf of `finer`, the index of this treedef's leaf at the same
  // place. `finer` is this tree, sharing where this one does or less
  // (ValueError otherwise, naming the place).
  std::vector<Py_ssize_t> ExpansionIndices(const PyTreeDef& finer) const;
  // The leaves of `finer` from `leaves`, one per leaf of this treedef: each
  // written at each of its places in `finer` (ValueError on another count).
  nb::list ExpandLeaves(const PyTreeDef& finer, nb::handle leaves) const;
  // The tree of this treedef and `other` (the same tree but for sharing, else
  // ValueError), sharing a node only where both do.
  PyTreeDef CommonSharing(const PyTreeDef& other) const;
  // The first place, in pre-order, where this treedef and `other` (the same
  // tree but for sharing, else ValueError) differ in sharing: (its key path,
  // the node's type, the key path of the earlier place that is the same node
  // here or None, the same there or None); None if they share alike. With
  // `every`, a list of all such places but those inside a differing node's
  // subtree (pre-order), empty if they share alike.
  nb::object SharingDifference(const PyTreeDef& other,
                               bool every = false) const;
  // This tree, sharing a node only where this treedef shares it and each
  // occurrence holds leaves of the same classes; `leaf_classes` has one class
  // per leaf of the tree laid out without sharing (Unshared()). Positions
  // whose values cannot tell them apart stay one node.
  PyTreeDef SharingWhereLeavesAgree(
      const std::vector<int64_t>& leaf_classes) const;
  // Whether this treedef's registry keeps relative identities.
  bool keeps_relative_identities() const {
    return registry()->keeps_relative_identities();
  }

  // --- serialization.cc
  nb::object GetState() const;
  void SetState(nb::handle state);
  // A stock jaxlib PyTreeDef (see IsStockTreeDef) as a treedef on this one's
  // registry, for equality across the two modules. ValueError if a node type
  // is not registered here.
  PyTreeDef FromStockTreeDef(nb::handle stock) const;
  nb::bytes SerializeUsingProto() const;
  static nb::object DeserializeUsingProto(
      nb::handle_t<PyTreeRegistry> registry_ref, nb::bytes data);

  // --- gc.cc
  int Traverse(visitproc visit, void* arg) const;
  void Clear();

  const Traversal& traversal() const { return traversal_; }
  // The registry; ValueError for a treedef the garbage collector emptied
  // (Clear), so every operation that reads the nodes asks it first.
  PyTreeRegistry* registry() const {
    if (registry_ == nullptr) ThrowCleared();
    return registry_;
  }
  [[noreturn]] static void ThrowCleared();
  const nb::object& registry_ref() const { return registry_ref_; }

  // Indices of the roots of the children of the node at `index`, in order.
  std::vector<Py_ssize_t> ChildIndices(Py_ssize_t index) const;

 private:
  // Checks that every reference lands on a node that can be shared (or
  // outside the traversal), and recomputes each node's counts from the arities;
  // raises ValueError on a malformed traversal. For traversals assembled from
  // untrusted pieces (pickles, protos, children).
  void Validate();
  // Part of Validate(): the reference at `i` is well-formed.
  void ValidateReference(size_t i) const;
  // The traversal from the entries of a pickled state, on registry_.
  void SetNodes(nb::handle nodes);
  static uint64_t NewOrigin();
  // Unflatten's part: hands the pairs of objects built for the places of
  // each written-out tie (`built`, by position) to the observer.
  void ReportWrittenOutTies(const std::vector<nb::object>& built) const;
  // Appends the root of a concatenation, with its key if keys are kept.
  void AppendRoot(Node root);
  NodeKey KeyOf(size_t index) const;
  // from_node_data_and_children and treedef_tuple: the children's traversals
  // one after the other, references re-aimed by their keys (see provenance_).
  static PyTreeDef Concatenate(PyTreeRegistry* registry,
                               nb::object registry_ref,
                               const std::vector<const PyTreeDef*>& children);

  PyTreeRegistry* registry_;
  nb::object registry_ref_;
  Traversal traversal_;
  uint64_t origin_;
  // Empty, or one key per node of the traversal: set on the treedefs that
  // `children()` cuts out of a treedef with references, and on those
  // assembled from such children. It lets the assembly re-aim a reference at
  // its target when the target's position changes, as when a sibling between
  // them is left out; positions alone would land on the wrong node. Empty
  // means node i stands for itself (key {origin_, i}).
  std::vector<NodeKey> provenance_;
  // Set by flatten alone, ordered by `copy`, and read by unflatten alone:
  // equality, hashing, pickling and the treedefs derived from this one
  // ignore it, as stock's treedef of the same tree has no such record.
  std::vector<WrittenOutTie> written_out_ties_;
};

// Whether `obj` is a stock jaxlib._jax.pytree.PyTreeDef: jax's dispatch
// registry, a stock one, makes those.
bool IsStockTreeDef(nb::handle obj);

// The GC slots of the PyTreeDef and PyTreeRegistry types (gc.cc).
extern PyType_Slot treedef_gc_slots[];
extern PyType_Slot registry_gc_slots[];

// Wraps a PyTreeDef built in C++ into its Python object.
nb::object WrapTreeDef(PyTreeDef&& treedef);

// Raises TypeError unless `obj` is a PyTreeDef; returns it.
const PyTreeDef& CastTreeDef(nb::handle obj);

// Sorts a dict's keys the way every operation here orders them.
nb::list SortedDictKeys(nb::handle dict);

// A new list with the items of `sequence`. (Spelled out: nanobind's
// `nb::list(x)` borrows instead of copying when `x` is an accessor.)
nb::list CopyToList(nb::handle sequence);

// A node's data as handed to Python code: a dict's keys as a new list; other
// data as is.
nb::object ExportedNodeData(const Node& node);

// Whether a dict node's `keys` equal the `size` keys `key_at(i)` gives, as
// Python compares two lists of them (== item by item, identity first).
template <typename KeyAt>
bool SameDictKeys(const std::vector<nb::object>& keys, size_t size,
                  KeyAt&& key_at) {
  if (keys.size() != size) return false;
  for (size_t i = 0; i < size; ++i) {
    const int equal = PyObject_RichCompareBool(keys[i].ptr(), key_at(i), Py_EQ);
    if (equal < 0) throw nb::python_error();
    if (equal == 0) return false;
  }
  return true;
}

// A dict node's keys from a list or tuple of them (pickles, node_data).
std::vector<nb::object> DictKeysFrom(nb::handle sequence);

// PyTreeRegistry.flatten_one_level(_with_keys) and all_leaves
// (flatten_one_level.cc).
nb::object FlattenOneLevel(const PyTreeRegistry& registry, nb::handle tree);
nb::object FlattenOneLevelWithKeys(const PyTreeRegistry& registry,
                                   nb::handle tree);
bool AllLeaves(const PyTreeRegistry& registry, nb::iterable objects);

// Adds the SharedPrefixError exception type to the module.
void BindSharedPrefixError(nb::module_& m);

}  // namespace jaxlib_patch

#endif  // JAXLIB_PATCH_PYTREE_H_
