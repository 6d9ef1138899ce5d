// The calls of the object `jax.jit` returns (its type is in
// jit_function_type.cc, the `DispatchArgs` it hands to the stock C++ dispatch
// in dispatch_args.cc).
//
// The stock dispatch (`_jax.pjit`, a `PjitFunction`) flattens its arguments
// with the stock registry, which cannot express sharing. A `JitFunction`
// stands in front of it: a call splits off the static arguments, flattens the
// dynamic ones once, as `(args, kwargs)`, with the tracing registry (one
// identity scope), and calls the dispatch with one `DispatchArgs` followed by
// the static arguments, all in C++ (no Python frame). A call whose dynamic
// arguments hold nothing that could be shared (`f(x)` on arrays, the common
// call, but also None, builtin containers and dataclasses not opted in, and
// any tree while no class is opted in at all, with at most one keyword
// argument: LeafDispatchTakes) goes as it is to a second stock dispatch, built
// with the user's own static arguments, so that it costs what stock's call
// costs. Which of the two a call takes is fixed by its signature (and, for
// trees a walk does not open, by whether anything is opted in yet), so each
// signature is cached in one of them only until the first opt-in. Its `repr`,
// descriptor binding, weak references, `__dict__` and `__signature__` are those
// of the stock `PjitFunction`, so that the rest of JAX and its users see no
// difference; `lower`, `trace`, `eval_shape` and `clear_cache` are set on the
// type from Python, as stock sets them on `PjitFunction`.

#include <Python.h>

#include <cstddef>
#include <exception>
#include <new>
#include <optional>
#include <utility>
#include <vector>

#include "jaxlib_patch/jit_function.h"
#include "jaxlib_patch/pytree.h"

namespace jaxlib_patch {

namespace {

// Whether keyword `name` is one of `static_argnames` (a tuple of str).
bool IsStaticName(PyObject* static_argnames, PyObject* name) {
  const Py_ssize_t n = PyTuple_GET_SIZE(static_argnames);
  for (Py_ssize_t i = 0; i < n; ++i) {
    if (PyTuple_GET_ITEM(static_argnames, i) == name) return true;
  }
  for (Py_ssize_t i = 0; i < n; ++i) {
    const int equal =
        PyUnicode_Compare(PyTuple_GET_ITEM(static_argnames, i), name);
    if (equal == -1 && PyErr_Occurred()) throw nb::python_error();
    if (equal == 0) return true;
  }
  return false;
}

// Whether positional argument `i` of a call with `nargs` of them is static.
// The one rule of jax.jit, for calls and for `lower`/`trace` (through
// `split_static_args`): a negative index counts from the end; one that lands
// outside the call's positional arguments makes nothing static.
bool IsStaticPosition(const std::vector<Py_ssize_t>& static_argnums,
                      Py_ssize_t i, Py_ssize_t nargs) {
  for (Py_ssize_t index : static_argnums) {
    if ((index < 0 ? index + nargs : index) == i) return true;
  }
  return false;
}

// `self` as the object it is, for the free-threaded build's locks: the
// memo and the last treedef are written under the object's lock, since two
// threads may call one jitted function at once. (The memo's reads compare
// addresses only, of types it holds.)
nb::handle AsHandle(JitFunctionObject* self) {
  return nb::handle(reinterpret_cast<PyObject*>(self));
}

void RememberLeafType(JitFunctionObject* self, PyTypeObject* type,
                      size_t epoch) {
  nb::ft_object_guard guard(AsHandle(self));
  self->leaf_types.Remember(type, epoch);
}

void RememberNamedTupleType(JitFunctionObject* self, PyTypeObject* type,
                            size_t epoch) {
  nb::ft_object_guard guard(AsHandle(self));
  self->leaf_types.RememberNamedTuple(type, epoch);
}

// The most objects (nodes and leaves) the dynamic arguments of a call may
// hold and still go to the leaf dispatch. Past it the general path costs
// less: our flatten is cheaper per object than stock's, which then meets one
// list of leaves (a dict of 100 arrays costs 0.96x of stock's instructions
// that way), while a call of a few objects would pay mostly the general
// path's fixed cost.
constexpr int kPlainTreeBudget = 32;

bool IsPlainTree(JitFunctionObject* self, PyObject* tree, int& budget,
                 size_t epoch);

// Whether `child` is a plain tree: one of a memoized leaf type is taken
// here, without a call (most children of most calls are arrays); any other
// is held while it is walked, since a dataclass field read below may run
// code that mutates the container it came from.
inline bool IsPlainChild(JitFunctionObject* self, PyObject* child, int& budget,
                         size_t epoch) {
  const LeafTypeMemo& memo = self->leaf_types;
  if (memo.epoch == epoch && memo.Knows(Py_TYPE(child))) return --budget >= 0;
  nb::object held = nb::borrow(child);
  return IsPlainTree(self, held.ptr(), budget, epoch);
}

// Whether the children of a tuple, list or namedtuple are plain trees. One
// longer than the budget left is answered at once, as a dict's is, and not
// after walking as far as the budget goes. The size is read again each step:
// a list may be mutated by a field read below.
bool AreItemsPlain(JitFunctionObject* self, PyObject* sequence, int& budget,
                   size_t epoch) {
  if (PySequence_Fast_GET_SIZE(sequence) > budget) return false;
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(sequence); ++i) {
    if (!IsPlainChild(self, PySequence_Fast_GET_ITEM(sequence, i), budget,
                      epoch)) {
      return false;
    }
  }
  return true;
}

// Whether the values of a dict are plain trees. The free-threaded build
// iterates a copy: PyDict_Next is safe there only under the dict's critical
// section, which a field read below could suspend.
bool AreValuesPlain(JitFunctionObject* self, PyObject* dict, int& budget,
                    size_t epoch) {
  if (PyDict_GET_SIZE(dict) > budget) return false;
#ifdef Py_GIL_DISABLED
  nb::object values = nb::steal(PyDict_Values(dict));
  if (!values.is_valid()) {
    PyErr_Clear();
    return false;
  }
  return AreItemsPlain(self, values.ptr(), budget, epoch);
#else
  Py_ssize_t position = 0;
  PyObject *key, *value;
  while (PyDict_Next(dict, &position, &key, &value)) {
    if (!IsPlainChild(self, value, budget, epoch)) return false;
  }
  return true;
#endif
}

// Whether `tree`, within `budget` objects (spent as they are visited), holds
// only leaves and nodes that keep no identity: None, tuples, lists, dicts,
// namedtuples and dataclasses not opted in. Stock's dispatch registry lays
// such a tree out exactly as the slow path's flatten does, and nothing in it
// can be shared, so the leaf dispatch may take it as it is. A custom node
// answers false (its children are known only by running its flatten
// function), as does an opted-in dataclass. Never raises: a field that
// cannot be read answers false, and the general path's flatten raises.
bool IsPlainTree(JitFunctionObject* self, PyObject* tree, int& budget,
                 size_t epoch) {
  if (--budget < 0) return false;
  PyTypeObject* type = Py_TYPE(tree);
  const LeafTypeMemo& memo = self->leaf_types;
  if (memo.epoch == epoch) {
    if (memo.Knows(type)) return true;
    if (memo.KnowsNamedTuple(type)) {
      return AreItemsPlain(self, tree, budget, epoch);
    }
  }
  const PyTreeRegistry::Registration* registration = nullptr;
  switch (self->registry_instance->KindOfType(type, &registration)) {
    case PyTreeKind::kLeaf:
    case PyTreeKind::kNone: RememberLeafType(self, type, epoch); return true;
    case PyTreeKind::kNamedTuple:
      RememberNamedTupleType(self, type, epoch);
      return AreItemsPlain(self, tree, budget, epoch);
    case PyTreeKind::kTuple:
    case PyTreeKind::kList: return AreItemsPlain(self, tree, budget, epoch);
    case PyTreeKind::kDict: return AreValuesPlain(self, tree, budget, epoch);
    case PyTreeKind::kDataclass:
      if (KeepsIdentity(registration)) return false;
      for (const nb::str& field : registration->data_fields) {
        nb::object child = nb::steal(PyObject_GetAttr(tree, field.ptr()));
        if (!child.is_valid()) {
          PyErr_Clear();
          return false;
        }
        if (!IsPlainChild(self, child.ptr(), budget, epoch)) return false;
      }
      return true;
    case PyTreeKind::kCustom: return false;
  }
  return false;
}

// Whether the leaf dispatch takes a call as it is: at most one of its dynamic
// arguments is a keyword argument, since stock's dispatch orders keyword
// arguments by their names' addresses and the slow path's flatten by name,
// which agree only for one; and nothing in them can be shared, because no
// class keeps relative identities in the registry (the call is then
// stock's, whatever its nodes and size) or because they are plain trees
// (IsPlainTree, all within one budget).
bool LeafDispatchTakes(JitFunctionObject* self, PyObject* const* args,
                       Py_ssize_t nargs, PyObject* kwnames) {
  const size_t epoch = PyTreeRegistry::registration_epoch();
  const bool walk = self->registry_instance->has_opt_ins();
  int budget = kPlainTreeBudget;
  bool dynamic_keyword_seen = false;
  const Py_ssize_t nkwargs = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
  for (Py_ssize_t k = 0; k < nkwargs; ++k) {
    if (IsStaticName(self->static_argnames.ptr(),
                     PyTuple_GET_ITEM(kwnames, k))) {
      continue;
    }
    if (dynamic_keyword_seen ||
        (walk && !IsPlainTree(self, args[nargs + k], budget, epoch))) {
      return false;
    }
    dynamic_keyword_seen = true;
  }
  if (!walk) return true;
  for (Py_ssize_t i = 0; i < nargs; ++i) {
    if (IsStaticPosition(self->static_argnums, i, nargs)) continue;
    if (!IsPlainTree(self, args[i], budget, epoch)) return false;
  }
  return true;
}

// The dict flattened as the keyword arguments of a call without any: one
// empty dict for all such calls, never handed out nor written to, so that a
// cached call makes none (the treedef keeps no reference to a dict).
PyObject* NoKeywordArguments() {
  static PyObject* const empty = PyDict_New();
  if (empty == nullptr) throw nb::python_error();
  return empty;
}

// The static argnums of the dispatch that takes a DispatchArgs: a call
// gives it the DispatchArgs first, then its static positional arguments in
// their order, at most one per index in `static_argnums`.
nb::tuple DispatchStaticArgnums(const JitFunctionObject* self) {
  nb::list argnums;
  for (size_t k = 1; k <= self->static_argnums.size(); ++k) argnums.append(k);
  return nb::tuple(argnums);
}

nb::object CallJitFunction(JitFunctionObject* self, PyObject* const* args,
                           size_t nargsf, PyObject* kwnames) {
  const Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  const Py_ssize_t nkwargs = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
  nb::object call_args = nb::steal(PyTuple_New(nargs));
  if (!call_args.is_valid()) throw nb::python_error();
  for (Py_ssize_t i = 0; i < nargs; ++i) {
    PyTuple_SET_ITEM(call_args.ptr(), i, Py_NewRef(args[i]));
  }
  // Null without keyword arguments: the DispatchArgs makes the dict if read.
  nb::object call_kwargs;
  if (nkwargs > 0) {
    call_kwargs = nb::steal(PyDict_New());
    if (!call_kwargs.is_valid()) throw nb::python_error();
    for (Py_ssize_t k = 0; k < nkwargs; ++k) {
      if (PyDict_SetItem(call_kwargs.ptr(), PyTuple_GET_ITEM(kwnames, k),
                         args[nargs + k]) < 0) {
        throw nb::python_error();
      }
    }
  }

  // The dispatch's arguments: the DispatchArgs, then the static positional
  // ones, then the static keyword ones' values. Small calls need no heap.
  constexpr Py_ssize_t kOnStack = 16;
  PyObject* stack_buffer[kOnStack];
  std::vector<PyObject*> heap_buffer;
  PyObject** dispatch_args = stack_buffer;
  if (1 + nargs + nkwargs > kOnStack) {
    heap_buffer.resize(1 + nargs + nkwargs);
    dispatch_args = heap_buffer.data();
  }
  Py_ssize_t num_dispatch_args = 1;

  nb::object dynamic_args = call_args;
  if (!self->static_argnums.empty() && nargs > 0) {
    for (Py_ssize_t i = 0; i < nargs; ++i) {
      if (IsStaticPosition(self->static_argnums, i, nargs)) {
        dispatch_args[num_dispatch_args++] = args[i];
      }
    }
    if (num_dispatch_args > 1) {
      dynamic_args = nb::steal(PyTuple_New(nargs - (num_dispatch_args - 1)));
      if (!dynamic_args.is_valid()) throw nb::python_error();
      Py_ssize_t next = 0;
      for (Py_ssize_t i = 0; i < nargs; ++i) {
        if (!IsStaticPosition(self->static_argnums, i, nargs)) {
          PyTuple_SET_ITEM(dynamic_args.ptr(), next++, Py_NewRef(args[i]));
        }
      }
    }
  }
  nb::object dynamic_kwargs =
      nkwargs > 0 ? call_kwargs : nb::borrow(NoKeywordArguments());
  nb::object static_kwnames;
  if (nkwargs > 0 && PyTuple_GET_SIZE(self->static_argnames.ptr()) > 0) {
    Py_ssize_t num_static_kwargs = 0;
    for (Py_ssize_t k = 0; k < nkwargs; ++k) {
      num_static_kwargs += IsStaticName(self->static_argnames.ptr(),
                                        PyTuple_GET_ITEM(kwnames, k));
    }
    if (num_static_kwargs > 0) {
      nb::dict dynamic;
      static_kwnames = nb::steal(PyTuple_New(num_static_kwargs));
      if (!static_kwnames.is_valid()) throw nb::python_error();
      Py_ssize_t next = 0;
      for (Py_ssize_t k = 0; k < nkwargs; ++k) {
        PyObject* name = PyTuple_GET_ITEM(kwnames, k);
        if (IsStaticName(self->static_argnames.ptr(), name)) {
          PyTuple_SET_ITEM(static_kwnames.ptr(), next++, Py_NewRef(name));
          dispatch_args[num_dispatch_args++] = args[nargs + k];
        } else if (PyDict_SetItem(dynamic.ptr(), name, args[nargs + k]) < 0) {
          throw nb::python_error();
        }
      }
      dynamic_kwargs = std::move(dynamic);
    }
  }

  // Held here: a node's __eq__ run by Equals may call this function again
  // and replace `self->last_treedef`, as may another thread's call (read and
  // replaced under the object's lock on the free-threaded build).
  nb::object last_treedef;
  {
    nb::ft_object_guard guard(AsHandle(self));
    last_treedef = self->last_treedef;
  }
  const PyTreeDef* last =
      last_treedef.is_valid() ? nb::inst_ptr<PyTreeDef>(last_treedef) : nullptr;
  nb::object leaves;
  PyTreeDef treedef = PyTreeDef::FlattenUnwrapped<false>(
      self->registry, nb::make_tuple(dynamic_args, dynamic_kwargs),
      std::nullopt, leaves, last != nullptr ? last->num_nodes() : 0);
  // The dispatch uses the treedef only as (part of) its cache key, so an
  // equal one stands for it.
  if (last == nullptr || !last->Equals(treedef)) {
    last_treedef = WrapTreeDef(std::move(treedef));
    nb::object replaced;  // Dropped after the lock: its release runs code.
    nb::ft_object_guard guard(AsHandle(self));
    replaced = std::exchange(self->last_treedef, last_treedef);
  }
  nb::object dispatch_arg = MakeDispatchArgs(
      std::move(leaves), std::move(last_treedef), call_args, call_kwargs);
  dispatch_args[0] = dispatch_arg.ptr();
  const Py_ssize_t num_static_kwargs =
      static_kwnames.is_valid() ? PyTuple_GET_SIZE(static_kwnames.ptr()) : 0;
  PyObject* result = PyObject_Vectorcall(
      Dispatch(self).ptr(), dispatch_args,
      num_dispatch_args - num_static_kwargs,
      static_kwnames.is_valid() ? static_kwnames.ptr() : nullptr);
  if (result == nullptr) throw nb::python_error();
  return nb::steal(result);
}

// Whether a call goes straight to the leaf dispatch: no keywords, and every
// argument of a memoized leaf type while no type has been registered since,
// or no class keeps relative identities in the registry at all. The check of
// every cached call on arrays, so kept to a few loads and compares, with
// nothing that can fail; slot 0 first, which holds the type of the first leaf
// argument found, so that a call on jax Arrays only costs one compare per
// argument. Only JitFunctionVectorcall asks, and only objects with a leaf
// vectorcall (no static argnums) have it in their slot.
bool GoesStraightToLeafDispatch(const JitFunctionObject* self,
                                PyObject* const* args, Py_ssize_t nargs,
                                PyObject* kwnames) {
  if (kwnames != nullptr) return false;
  const LeafTypeMemo& memo = self->leaf_types;
  if (memo.epoch == PyTreeRegistry::registration_epoch()) {
    // Last to first: the count is its own index, one register less to keep;
    // it ends at -1 only if every argument's type is known.
    while (nargs-- > 0 && memo.Knows(Py_TYPE(args[nargs]))) {
    }
    if (nargs < 0) return true;
  }
  // Where nothing is opted in the walk never runs, so the memo stays empty.
  return !self->registry_instance->has_opt_ins();
}

}  // namespace

// For each positional argument of a call with `num_args` of them, whether it
// is static: tracing marks the arguments that calls split off.
nb::tuple PositionalStatics(Py_ssize_t num_args,
                            const std::vector<Py_ssize_t>& static_argnums) {
  nb::list statics;
  for (Py_ssize_t i = 0; i < num_args; ++i) {
    statics.append(nb::bool_(IsStaticPosition(static_argnums, i, num_args)));
  }
  return nb::tuple(statics);
}

// `static_argnames` as the tuple IsStaticName searches, interned so that the
// call's keyword names (interned by CPython) mostly match by identity.
nb::tuple StaticArgnamesTuple(std::vector<nb::str> static_argnames) {
  nb::tuple names = nb::steal<nb::tuple>(PyTuple_New(static_argnames.size()));
  if (!names.is_valid()) throw nb::python_error();
  for (size_t k = 0; k < static_argnames.size(); ++k) {
    PyObject* name = static_argnames[k].release().ptr();
    PyUnicode_InternInPlace(&name);
    PyTuple_SET_ITEM(names.ptr(), k, name);
  }
  return names;
}

// A call's arguments split as a JitFunction call splits them: (dynamic args,
// dynamic kwargs, static args, static kwargs), each in the call's order, the
// static ones as the dispatch gets them after the DispatchArgs.
nb::tuple SplitStaticArgs(nb::tuple args, nb::dict kwargs,
                          std::vector<Py_ssize_t> static_argnums,
                          std::vector<nb::str> static_argnames) {
  nb::tuple names = StaticArgnamesTuple(std::move(static_argnames));
  const Py_ssize_t nargs = static_cast<Py_ssize_t>(args.size());
  nb::list dynamic_args, static_args;
  for (Py_ssize_t i = 0; i < nargs; ++i) {
    (IsStaticPosition(static_argnums, i, nargs) ? static_args : dynamic_args)
        .append(args[i]);
  }
  nb::dict dynamic_kwargs, static_kwargs;
  for (auto [name, value] : kwargs) {
    if (!PyUnicode_Check(name.ptr())) {
      throw nb::type_error(
          ("Keyword argument names must be str, got " + Repr(name) + ".")
              .c_str());
    }
    (IsStaticName(names.ptr(), name.ptr()) ? static_kwargs
                                           : dynamic_kwargs)[name] = value;
  }
  auto as_tuple = [](const nb::list& list) {
    PyObject* tuple = PyList_AsTuple(list.ptr());
    if (tuple == nullptr) throw nb::python_error();
    return nb::steal<nb::tuple>(tuple);
  };
  return nb::make_tuple(as_tuple(dynamic_args), dynamic_kwargs,
                        as_tuple(static_args), static_kwargs);
}

JitFunctionObject* Self(PyObject* self) {
  auto* o = reinterpret_cast<JitFunctionObject*>(self);
  if (!o->make_dispatch.is_valid()) {
    throw nb::value_error(
        "This jitted function has no function: it was made by "
        "PjitFunction.__new__ and not given a state (__setstate__), or the "
        "garbage collector cleared it.");
  }
  return o;
}

// The stock dispatch that takes a DispatchArgs, built on first use.
nb::object Dispatch(JitFunctionObject* self) {
  if (self->dispatch.is_valid()) return self->dispatch;
  // make_dispatch runs Python, which may hand the GIL to a thread that
  // builds one too: the first one stored wins, the other is dropped unused.
  nb::object built =
      self->make_dispatch(DispatchStaticArgnums(self), self->static_argnames);
  if (!self->dispatch.is_valid()) self->dispatch = std::move(built);
  return self->dispatch;
}

// Every call GoesStraightToLeafDispatch does not take, and the vectorcall slot
// itself of objects without a leaf vectorcall. Kept out of line, so that the
// memoized call pays none of its frame.
[[gnu::noinline]] PyObject* CallThroughFrontDoor(PyObject* callable,
                                                 PyObject* const* args,
                                                 size_t nargsf,
                                                 PyObject* kwnames) {
  auto* self = reinterpret_cast<JitFunctionObject*>(callable);
  try {
    if (self->leaf_dispatch.is_valid() &&
        LeafDispatchTakes(self, args, PyVectorcall_NARGS(nargsf), kwnames)) {
      return self->leaf_vectorcall != nullptr
                 ? self->leaf_vectorcall(self->leaf_dispatch.ptr(), args,
                                         nargsf, kwnames)
                 : PyObject_Vectorcall(self->leaf_dispatch.ptr(), args, nargsf,
                                       kwnames);
    }
    return CallJitFunction(Self(callable), args, nargsf, kwnames)
        .release()
        .ptr();
  } catch (...) {
    SetPythonErrorFromException();
    return nullptr;
  }
}

// The calls on leaves go to the leaf dispatch before anything else runs: on
// the cached call on arrays the front door costs only
// GoesStraightToLeafDispatch and a jump.
PyObject* JitFunctionVectorcall(PyObject* callable, PyObject* const* args,
                                size_t nargsf, PyObject* kwnames) {
  auto* self = reinterpret_cast<JitFunctionObject*>(callable);
  if (GoesStraightToLeafDispatch(self, args, PyVectorcall_NARGS(nargsf),
                                 kwnames)) {
    return self->leaf_vectorcall(self->leaf_dispatch.ptr(), args, nargsf,
                                 kwnames);
  }
  return CallThroughFrontDoor(callable, args, nargsf, kwnames);
}

}  // namespace jaxlib_patch
