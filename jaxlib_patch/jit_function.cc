// The object `jax.jit` returns (the `DispatchArgs` it hands to the stock C++
// dispatch are in dispatch_args.cc).
//
// The stock dispatch (`_jax.pjit`, a `PjitFunction`) flattens its arguments
// with the stock registry, which cannot express sharing. A `JitFunction`
// stands in front of it: a call splits off the static arguments, flattens the
// dynamic ones once, as `(args, kwargs)`, with the tracing registry (one
// identity scope), and calls the dispatch with one `DispatchArgs` followed by
// the static arguments, all in C++ (no Python frame). A call whose dynamic
// arguments are all positional leaves (`f(x)` on arrays, the common call) has
// nothing that could be shared: it goes as it is to a second stock dispatch,
// built with the user's own static arguments, so that it costs what stock's
// call costs. Which of the two a call takes is fixed by its signature, so
// each signature is cached in one of them only. Its `repr`, descriptor
// binding, weak references, `__dict__` and `__signature__` are those of the
// stock `PjitFunction`, so that the rest of JAX and its users see no
// difference; `lower`, `trace`, `eval_shape` and `clear_cache` are set on the
// type from Python, as stock sets them on `PjitFunction`.

#include <Python.h>
#include <structmember.h>

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

struct JitFunctionObject {
  PyObject_HEAD vectorcallfunc vectorcall;
  PyObject* dict;      // Owned; the instance __dict__ (functools.wraps).
  PyObject* weakrefs;  // Managed by CPython.
  // The user's function; what builds the stock dispatch (a PjitFunction that
  // takes a DispatchArgs); the tracing registry. Null only while being built
  // or after tp_clear.
  nb::object fun;
  nb::object make_dispatch;
  nb::object registry;
  // The C++ object of `registry`, looked up once: nb::inst_ptr is an
  // out-of-line call, and DynamicArgsArePositionalLeaves reads it on every
  // call that the memoized leaf type does not settle.
  const PyTreeRegistry* registry_instance = nullptr;
  // The stock dispatch, built by `make_dispatch` when first needed: a
  // function called only on leaves never needs it, and `jax.jit(f)(x)`
  // written inline builds a jitted function per call. Null until then.
  nb::object dispatch;
  // A second stock dispatch, with the user's own static arguments, for the
  // calls whose dynamic arguments are all positional leaves: nothing in them
  // can be shared, so they skip our flatten and the DispatchArgs and reach
  // stock's own fast path as they are. Null if there is none.
  nb::object leaf_dispatch;
  // Its vectorcall function, read once: the calls on arrays jump straight to
  // it, with none of PyObject_Vectorcall's lookup and result check (CPython
  // checks what this function returns). Null where IsMemoizedLeafCall cannot
  // decide a call (no leaf dispatch, no vectorcall in it, static argnums, or
  // after tp_clear); then `vectorcall` is CallThroughFrontDoor, which never
  // reads it.
  vectorcallfunc leaf_vectorcall = nullptr;
  // As given to jax.jit (a negative index counts from the end of a call's
  // positional arguments); the names as a tuple of str.
  std::vector<Py_ssize_t> static_argnums;
  nb::object static_argnames;
  // The treedef (a PyTreeDef object) of the last call's dynamic arguments.
  // A call whose treedef equals it passes this very object to the dispatch,
  // whose cache then finds its key by identity instead of calling
  // PyTreeDef.__eq__, and no new treedef object is made. Null before the
  // first call.
  nb::object last_treedef;
  // The type of the last dynamic argument found to be a leaf, and the
  // registration epoch then (PyTreeRegistry::registration_epoch): while it
  // stands, no type has become a node, so a call on arguments of this type
  // (the common one: jax Arrays) skips the registry lookup. Held, so that no
  // other type can take its address. Null before the first such call.
  nb::object leaf_type;
  size_t leaf_type_epoch = 0;
};

PyTypeObject* jit_function_type = nullptr;

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

// Whether every dynamic argument of a call is positional and a leaf of the
// tracing registry: then the call is one the leaf dispatch takes as it is.
bool DynamicArgsArePositionalLeaves(JitFunctionObject* self,
                                    PyObject* const* args, Py_ssize_t nargs,
                                    PyObject* kwnames) {
  const Py_ssize_t nkwargs = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
  for (Py_ssize_t k = 0; k < nkwargs; ++k) {
    if (!IsStaticName(self->static_argnames.ptr(),
                      PyTuple_GET_ITEM(kwnames, k))) {
      return false;
    }
  }
  const PyTreeRegistry& registry = *self->registry_instance;
  const size_t epoch = PyTreeRegistry::registration_epoch();
  for (Py_ssize_t i = 0; i < nargs; ++i) {
    if (IsStaticPosition(self->static_argnums, i, nargs)) continue;
    PyTypeObject* type = Py_TYPE(args[i]);
    if (self->leaf_type.ptr() == reinterpret_cast<PyObject*>(type) &&
        self->leaf_type_epoch == epoch) {
      continue;
    }
    const PyTreeRegistry::Registration* custom = nullptr;
    if (registry.KindOfType(type, &custom) != PyTreeKind::kLeaf) return false;
    self->leaf_type = nb::borrow(reinterpret_cast<PyObject*>(type));
    self->leaf_type_epoch = epoch;
  }
  return true;
}

JitFunctionObject* Self(PyObject* self) {
  auto* o = reinterpret_cast<JitFunctionObject*>(self);
  if (!o->make_dispatch.is_valid()) {
    throw nb::value_error(
        "This jitted function was cleared by the garbage "
        "collector.");
  }
  return o;
}

// The static argnums of the dispatch that takes a DispatchArgs: a call
// gives it the DispatchArgs first, then its static positional arguments in
// their order, at most one per index in `static_argnums`.
nb::tuple DispatchStaticArgnums(const JitFunctionObject* self) {
  nb::list argnums;
  for (size_t k = 1; k <= self->static_argnums.size(); ++k) argnums.append(k);
  return nb::tuple(argnums);
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

nb::object CallJitFunction(JitFunctionObject* self, PyObject* const* args,
                           size_t nargsf, PyObject* kwnames) {
  const Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  const Py_ssize_t nkwargs = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
  nb::object call_args = nb::steal(PyTuple_New(nargs));
  if (!call_args.is_valid()) throw nb::python_error();
  for (Py_ssize_t i = 0; i < nargs; ++i) {
    PyTuple_SET_ITEM(call_args.ptr(), i, Py_NewRef(args[i]));
  }
  nb::dict call_kwargs;
  for (Py_ssize_t k = 0; k < nkwargs; ++k) {
    if (PyDict_SetItem(call_kwargs.ptr(), PyTuple_GET_ITEM(kwnames, k),
                       args[nargs + k]) < 0) {
      throw nb::python_error();
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
  nb::object dynamic_kwargs = call_kwargs;
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
  // and replace `self->last_treedef`.
  nb::object last_treedef = self->last_treedef;
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
    self->last_treedef = last_treedef;
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

// Whether a call is one the last leaf check already answered: no keywords,
// and every argument of the memoized leaf type while no type has been
// registered since. The check of every cached call on arrays, so kept to a
// few loads and compares, with nothing that can fail. Only
// JitFunctionVectorcall asks, and only objects with a leaf vectorcall (no
// static argnums) have it in their slot.
bool IsMemoizedLeafCall(const JitFunctionObject* self, PyObject* const* args,
                        Py_ssize_t nargs, PyObject* kwnames) {
  if (kwnames != nullptr ||
      self->leaf_type_epoch != PyTreeRegistry::registration_epoch()) {
    return false;
  }
  PyObject* leaf_type = self->leaf_type.ptr();
  // Last to first: the count is its own index, one register less to keep.
  while (nargs-- > 0) {
    if (reinterpret_cast<PyObject*>(Py_TYPE(args[nargs])) != leaf_type) {
      return false;
    }
  }
  return true;
}

// Every call IsMemoizedLeafCall does not take, and the vectorcall slot itself
// of objects without a leaf vectorcall. Kept out of line, so that the
// memoized call pays none of its frame.
[[gnu::noinline]] PyObject* CallThroughFrontDoor(PyObject* callable,
                                                 PyObject* const* args,
                                                 size_t nargsf,
                                                 PyObject* kwnames) {
  auto* self = reinterpret_cast<JitFunctionObject*>(callable);
  try {
    if (self->leaf_dispatch.is_valid() &&
        DynamicArgsArePositionalLeaves(self, args, PyVectorcall_NARGS(nargsf),
                                       kwnames)) {
      return PyObject_Vectorcall(self->leaf_dispatch.ptr(), args, nargsf,
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
// the cached call on arrays the front door costs only IsMemoizedLeafCall and
// a jump.
PyObject* JitFunctionVectorcall(PyObject* callable, PyObject* const* args,
                                size_t nargsf, PyObject* kwnames) {
  auto* self = reinterpret_cast<JitFunctionObject*>(callable);
  if (IsMemoizedLeafCall(self, args, PyVectorcall_NARGS(nargsf), kwnames)) {
    return self->leaf_vectorcall(self->leaf_dispatch.ptr(), args, nargsf,
                                 kwnames);
  }
  return CallThroughFrontDoor(callable, args, nargsf, kwnames);
}

void JitFunctionDealloc(PyObject* self) {
  PyTypeObject* type = Py_TYPE(self);
  PyObject_GC_UnTrack(self);
  auto* o = reinterpret_cast<JitFunctionObject*>(self);
  if (o->weakrefs != nullptr) PyObject_ClearWeakRefs(self);
  Py_CLEAR(o->dict);
  o->fun.~object();
  o->make_dispatch.~object();
  o->dispatch.~object();
  o->registry.~object();
  o->leaf_dispatch.~object();
  o->static_argnums.~vector();
  o->static_argnames.~object();
  o->last_treedef.~object();
  o->leaf_type.~object();
  type->tp_free(self);
  Py_DECREF(type);
}

// The GC slots never throw and never call into Python (the rule of gc.cc):
// the collector runs them at any allocation. `jax.jit(obj.method)` stored on
// `obj` is a cycle through `fun` and the dispatches.
int JitFunctionTraverse(PyObject* self, visitproc visit, void* arg) {
  auto* o = reinterpret_cast<JitFunctionObject*>(self);
  Py_VISIT(Py_TYPE(self));
  Py_VISIT(o->dict);
  Py_VISIT(o->fun.ptr());
  Py_VISIT(o->make_dispatch.ptr());
  Py_VISIT(o->dispatch.ptr());
  Py_VISIT(o->registry.ptr());
  Py_VISIT(o->leaf_dispatch.ptr());
  Py_VISIT(o->static_argnames.ptr());
  Py_VISIT(o->last_treedef.ptr());
  Py_VISIT(o->leaf_type.ptr());
  return 0;
}

int JitFunctionClear(PyObject* self) {
  auto* o = reinterpret_cast<JitFunctionObject*>(self);
  // Dropping a reference can run code (a finalizer, a weak reference's
  // callback) that calls this object, so it is cleared before anything is
  // dropped: calls take the out-of-line path, which finds no leaf dispatch
  // and no make_dispatch and raises. The references move out, then drop.
  o->vectorcall = CallThroughFrontDoor;
  o->leaf_vectorcall = nullptr;
  nb::object fun = std::move(o->fun);
  nb::object make_dispatch = std::move(o->make_dispatch);
  nb::object dispatch = std::move(o->dispatch);
  nb::object registry = std::move(o->registry);
  nb::object leaf_dispatch = std::move(o->leaf_dispatch);
  nb::object static_argnames = std::move(o->static_argnames);
  nb::object last_treedef = std::move(o->last_treedef);
  nb::object leaf_type = std::move(o->leaf_type);
  Py_CLEAR(o->dict);
  return 0;
}

// As stock: the repr of `__wrapped__`, and a bare one if that fails.
PyObject* JitFunctionRepr(PyObject* self) {
  PyObject* wrapped = PyObject_GetAttrString(self, "__wrapped__");
  PyObject* text = nullptr;
  if (wrapped != nullptr) {
    text = PyUnicode_FromFormat("<PjitFunction of %R>", wrapped);
    Py_DECREF(wrapped);
  }
  if (text == nullptr) {
    PyErr_Clear();
    text = PyUnicode_FromString("<PjitFunction>");
  }
  return text;
}

// Methods bind like functions': `obj.method` is a bound method of it.
PyObject* JitFunctionDescrGet(PyObject* self, PyObject* obj, PyObject*) {
  if (obj == nullptr || obj == Py_None) return Py_NewRef(self);
  return PyMethod_New(self, obj);
}

template <typename F>
PyObject* Guarded(F&& f) {
  try {
    return f().release().ptr();
  } catch (...) {
    SetPythonErrorFromException();
    return nullptr;
  }
}

PyObject* JitFunctionSignature(PyObject* self, void*) {
  return Guarded([&] {
    return nb::module_::import_("inspect").attr("signature")(Self(self)->fun);
  });
}

// The dispatches built so far.
std::vector<nb::object> BuiltDispatches(JitFunctionObject* self) {
  std::vector<nb::object> built;
  for (const nb::object& dispatch : {self->leaf_dispatch, self->dispatch}) {
    if (dispatch.is_valid()) built.push_back(dispatch);
  }
  return built;
}

// The entries of the dispatches' caches.
PyObject* JitFunctionCacheSize(PyObject* self, PyObject*) {
  return Guarded([&] {
    Py_ssize_t size = 0;
    for (const nb::object& dispatch : BuiltDispatches(Self(self))) {
      size += nb::cast<Py_ssize_t>(dispatch.attr("_cache_size")());
    }
    return nb::int_(size);
  });
}

PyObject* JitFunctionClearCache(PyObject* self, PyObject*) {
  return Guarded([&] {
    for (const nb::object& dispatch : BuiltDispatches(Self(self))) {
      dispatch.attr("_clear_cache")();
    }
    return nb::none();
  });
}

// The stock dispatch's state, with the user's function and static argument
// indices and names in place of the dispatch's own.
PyObject* JitFunctionGetState(PyObject* self, PyObject*) {
  return Guarded([&] {
    JitFunctionObject* o = Self(self);
    nb::object state = Dispatch(o).attr("__getstate__")();
    state["fun"] = o->fun;
    state["static_argnums"] = nb::cast(o->static_argnums);
    state["static_argnames"] = o->static_argnames;
    return state;
  });
}

PyMethodDef jit_function_methods[] = {
    {"_cache_size", JitFunctionCacheSize, METH_NOARGS,
     "The number of entries of the C++ dispatch's cache."},
    {"_clear_cache", JitFunctionClearCache, METH_NOARGS,
     "Clears the C++ dispatch's cache."},
    {"__getstate__", JitFunctionGetState, METH_NOARGS, nullptr},
    {nullptr, nullptr, 0, nullptr}};

PyGetSetDef jit_function_getset[] = {
    {"__signature__", JitFunctionSignature, nullptr, nullptr, nullptr},
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, nullptr,
     nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

PyMemberDef jit_function_members[] = {
    {"__vectorcalloffset__", T_PYSSIZET,
     static_cast<Py_ssize_t>(offsetof(JitFunctionObject, vectorcall)), READONLY,
     nullptr},
    {"__dictoffset__", T_PYSSIZET,
     static_cast<Py_ssize_t>(offsetof(JitFunctionObject, dict)), READONLY,
     nullptr},
    {"__weaklistoffset__", T_PYSSIZET,
     static_cast<Py_ssize_t>(offsetof(JitFunctionObject, weakrefs)), READONLY,
     nullptr},
    {nullptr, 0, 0, 0, nullptr}};

PyType_Slot jit_function_slots[] = {
    {Py_tp_doc,
     const_cast<char*>("What jax.jit returns: flattens the dynamic arguments "
                       "once with the tracing registry and calls the stock C++ "
                       "dispatch with them.")},
    {Py_tp_dealloc, reinterpret_cast<void*>(JitFunctionDealloc)},
    {Py_tp_traverse, reinterpret_cast<void*>(JitFunctionTraverse)},
    {Py_tp_clear, reinterpret_cast<void*>(JitFunctionClear)},
    {Py_tp_call, reinterpret_cast<void*>(PyVectorcall_Call)},
    {Py_tp_repr, reinterpret_cast<void*>(JitFunctionRepr)},
    {Py_tp_descr_get, reinterpret_cast<void*>(JitFunctionDescrGet)},
    {Py_tp_methods, jit_function_methods},
    {Py_tp_getset, jit_function_getset},
    {Py_tp_members, jit_function_members},
    {0, nullptr}};

// Named PjitFunction like stock's, so that messages that name the type read
// the same; the module tells them apart.
PyType_Spec jit_function_spec = {
    "jaxlib_patch.pytree.PjitFunction", sizeof(JitFunctionObject), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL |
        Py_TPFLAGS_DISALLOW_INSTANTIATION,  // make_jit_function builds them
    jit_function_slots};

nb::object MakeJitFunction(nb::callable fun, nb::callable make_dispatch,
                           nb::handle registry,
                           std::vector<Py_ssize_t> static_argnums,
                           std::vector<nb::str> static_argnames,
                           std::optional<nb::callable> leaf_dispatch) {
  if (!nb::isinstance<PyTreeRegistry>(registry)) {
    throw nb::type_error(
        ("Expected a PyTreeRegistry, got " + Repr(registry) + ".").c_str());
  }
  nb::tuple names = StaticArgnamesTuple(std::move(static_argnames));
  PyObject* self = jit_function_type->tp_alloc(jit_function_type, 0);
  if (self == nullptr) throw nb::python_error();
  auto* o = reinterpret_cast<JitFunctionObject*>(self);
  // tp_alloc zeroes the memory: the members are constructed over it.
  new (&o->fun) nb::object(std::move(fun));
  new (&o->make_dispatch) nb::object(std::move(make_dispatch));
  new (&o->dispatch) nb::object();
  new (&o->registry) nb::object(nb::borrow(registry));
  o->registry_instance = nb::inst_ptr<PyTreeRegistry>(registry);
  new (&o->leaf_dispatch)
      nb::object(leaf_dispatch ? std::move(*leaf_dispatch) : nb::object());
  new (&o->static_argnums) std::vector<Py_ssize_t>(std::move(static_argnums));
  if (o->leaf_dispatch.is_valid() && o->static_argnums.empty()) {
    o->leaf_vectorcall = PyVectorcall_Function(o->leaf_dispatch.ptr());
  }
  o->vectorcall =
      o->leaf_vectorcall ? JitFunctionVectorcall : CallThroughFrontDoor;
  new (&o->static_argnames) nb::object(std::move(names));
  new (&o->last_treedef) nb::object();
  new (&o->leaf_type) nb::object();
  return nb::steal(self);
}

}  // namespace

void BindJitFunction(nb::module_& m) {
  BindDispatchArgs(m);
  jit_function_type =
      reinterpret_cast<PyTypeObject*>(PyType_FromSpec(&jit_function_spec));
  if (jit_function_type == nullptr) throw nb::python_error();
  m.attr("PjitFunction") =
      nb::borrow(reinterpret_cast<PyObject*>(jit_function_type));
  m.def("make_jit_function", &MakeJitFunction, nb::arg("fun"),
        nb::arg("make_dispatch"), nb::arg("registry"),
        nb::arg("static_argnums"), nb::arg("static_argnames"),
        nb::arg("leaf_dispatch").none() = nb::none(),
        "The object jax.jit returns: calls of it flatten the dynamic "
        "arguments once with `registry` and call the dispatch that "
        "`make_dispatch(static_argnums, static_argnames)` returns when first "
        "needed with one DispatchArgs followed by the static arguments: a "
        "stock PjitFunction made with the static argnums and names given "
        "(1, 2, ..., one per index of `static_argnums`, and "
        "`static_argnames`). `static_argnums` as given to jax.jit; a "
        "negative one counts from the end of a call's positional arguments. "
        "A call whose dynamic arguments are all positional leaves of "
        "`registry` goes to `leaf_dispatch` instead, if given, as it is: a "
        "stock PjitFunction with `static_argnums` and `static_argnames` of "
        "its own.");
  m.def("split_static_args", &SplitStaticArgs, nb::arg("args"),
        nb::arg("kwargs"), nb::arg("static_argnums"),
        nb::arg("static_argnames"),
        "(dynamic_args, dynamic_kwargs, static_args, static_kwargs): a "
        "call's `args` (a tuple) and `kwargs` (a dict) split as a call of "
        "a jitted function splits them (make_jit_function), so that "
        "`lower` and `trace` see the arguments as calls do.");
  m.def("positional_statics", &PositionalStatics, nb::arg("num_args"),
        nb::arg("static_argnums"),
        "A tuple of `num_args` bools: whether each positional argument of a "
        "call with `num_args` of them is static, as a call of a jitted "
        "function (make_jit_function) splits them.");
}

}  // namespace jaxlib_patch
