// The type of the object `jax.jit` returns, PjitFunction: its lifetime and
// garbage-collector slots, its repr and method binding, `__signature__`,
// the methods that reach the stock dispatches' caches, its pickled state,
// its construction (make_jit_function) and the module's bindings of the
// front door. Its calls are in jit_function.cc.

#include <Python.h>
#include <structmember.h>

#include <cstddef>
#include <new>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "jaxlib_patch/jit_function.h"
#include "jaxlib_patch/pytree.h"

namespace jaxlib_patch {

namespace {

PyTypeObject* jit_function_type = nullptr;

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
  o->leaf_types.~LeafTypeMemo();
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
  for (const nb::object& type : o->leaf_types.types) Py_VISIT(type.ptr());
  for (const nb::object& type : o->leaf_types.namedtuple_types) {
    Py_VISIT(type.ptr());
  }
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
  LeafTypeMemo leaf_types = std::move(o->leaf_types);
  Py_CLEAR(o->dict);
  return 0;
}

// A PjitFunction with no function, as `PjitFunction.__new__` makes one (as
// stock's, for unpickling and copying: __setstate__ gives it its function);
// calling it raises until then. tp_alloc zeroes the memory: the members are
// constructed over it.
PyObject* JitFunctionNew(PyTypeObject* type, PyObject*, PyObject*) {
  PyObject* self = type->tp_alloc(type, 0);
  if (self == nullptr) return nullptr;
  auto* o = reinterpret_cast<JitFunctionObject*>(self);
  o->vectorcall = CallThroughFrontDoor;
  new (&o->fun) nb::object();
  new (&o->make_dispatch) nb::object();
  new (&o->dispatch) nb::object();
  new (&o->registry) nb::object();
  new (&o->leaf_dispatch) nb::object();
  new (&o->static_argnums) std::vector<Py_ssize_t>();
  new (&o->static_argnames) nb::object();
  new (&o->last_treedef) nb::object();
  new (&o->leaf_types) LeafTypeMemo();
  return self;
}

// Gives `o` its function and dispatches, in place of any it had (and of the
// caches built from them: the dispatch, the last treedef, the leaf types).
void Initialize(JitFunctionObject* o, nb::object fun, nb::object make_dispatch,
                nb::handle registry, std::vector<Py_ssize_t> static_argnums,
                std::vector<nb::str> static_argnames,
                nb::object leaf_dispatch) {
  if (!nb::isinstance<PyTreeRegistry>(registry)) {
    throw nb::type_error(
        ("Expected a PyTreeRegistry, got " + Repr(registry) + ".").c_str());
  }
  nb::tuple names = StaticArgnamesTuple(std::move(static_argnames));
  // As in JitFunctionClear: calls meanwhile take the out-of-line path, and
  // the old references drop only once every member is in place, since
  // dropping one can run code that calls this object.
  o->vectorcall = CallThroughFrontDoor;
  o->leaf_vectorcall = nullptr;
  nb::object old[] = {std::exchange(o->fun, std::move(fun)),
                      std::exchange(o->make_dispatch, std::move(make_dispatch)),
                      std::exchange(o->dispatch, nb::object()),
                      std::exchange(o->registry, nb::borrow(registry)),
                      std::exchange(o->leaf_dispatch, std::move(leaf_dispatch)),
                      std::exchange(o->static_argnames, std::move(names)),
                      std::exchange(o->last_treedef, nb::object())};
  LeafTypeMemo old_leaf_types = std::exchange(o->leaf_types, LeafTypeMemo());
  o->registry_instance = nb::inst_ptr<PyTreeRegistry>(o->registry);
  o->static_argnums = std::move(static_argnums);
  if (o->leaf_dispatch.is_valid() && o->static_argnums.empty()) {
    o->leaf_vectorcall = PyVectorcall_Function(o->leaf_dispatch.ptr());
  }
  o->vectorcall =
      o->leaf_vectorcall ? JitFunctionVectorcall : CallThroughFrontDoor;
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

// The stock dispatch whose state and cache-miss callable are stock's own
// (the user's arguments as they are): the leaf dispatch, else the one that
// takes a DispatchArgs.
nb::object StockShapedDispatch(JitFunctionObject* o) {
  return o->leaf_dispatch.is_valid() ? o->leaf_dispatch : Dispatch(o);
}

// The version of the state below; __setstate__ refuses any other.
constexpr int kStateVersion = 1;

// What a copy or a pickle keeps, as stock's PjitFunction keeps its function,
// its cache-miss callable and its options: the function, what builds the
// dispatches and the registry, not the caches built from them (a loaded copy
// builds its own) nor the instance __dict__ (stock's copies have none
// either); and, read only, the function's name as stock's state gives it.
PyObject* JitFunctionGetState(PyObject* self, PyObject*) {
  return Guarded([&] {
    JitFunctionObject* o = Self(self);
    nb::dict state;
    state["version"] = kStateVersion;
    state["fun"] = o->fun;
    state["make_dispatch"] = o->make_dispatch;
    state["registry"] = o->registry;
    state["static_argnums"] = nb::cast(o->static_argnums);
    state["static_argnames"] =
        nb::steal(PySequence_List(o->static_argnames.ptr()));
    state["leaf_dispatch"] =
        o->leaf_dispatch.is_valid() ? o->leaf_dispatch : nb::none();
    // As stock's state names the function: the name its dispatch was given
    // (a stock PjitFunction's state has it).
    nb::object dispatch_state = StockShapedDispatch(o).attr("__getstate__")();
    if (PyDict_Check(dispatch_state.ptr())) {
      PyObject* name =  // Borrowed.
          PyDict_GetItemString(dispatch_state.ptr(), "function_name");
      if (name != nullptr) state["function_name"] = nb::handle(name);
    }
    return nb::object(state);
  });
}

// Field `key` of a state, as a T: a KeyError if it is missing (as on
// stock), a TypeError that names it if it is not a T.
template <typename T>
T StateField(const nb::dict& state, const char* key) {
  PyObject* value = PyDict_GetItemString(state.ptr(), key);  // Borrowed.
  if (value == nullptr) {
    PyErr_SetString(PyExc_KeyError, key);
    throw nb::python_error();
  }
  T field{};
  if (!nb::try_cast(nb::handle(value), field)) {
    throw nb::type_error((std::string("The PjitFunction state's \"") + key +
                          "\" is " + Repr(value) + ", of the wrong type.")
                             .c_str());
  }
  return field;
}

// The inverse of __getstate__, on an object that PjitFunction.__new__ made
// (or on any, which then takes the state's function).
PyObject* JitFunctionSetState(PyObject* self, PyObject* state) {
  return Guarded([&] {
    if (!PyDict_Check(state)) {
      throw nb::type_error(
          ("A PjitFunction's state is a dict, got " + Repr(state) + ".")
              .c_str());
    }
    nb::dict fields = nb::borrow<nb::dict>(state);
    if (StateField<int>(fields, "version") != kStateVersion) {
      throw nb::value_error(
          ("Unknown PjitFunction state version " + Repr(fields["version"]) +
           "; this jaxlib reads version " + std::to_string(kStateVersion) + ".")
              .c_str());
    }
    nb::object leaf_dispatch = StateField<nb::object>(fields, "leaf_dispatch");
    Initialize(reinterpret_cast<JitFunctionObject*>(self),
               StateField<nb::object>(fields, "fun"),
               StateField<nb::object>(fields, "make_dispatch"),
               StateField<nb::object>(fields, "registry"),
               StateField<std::vector<Py_ssize_t>>(fields, "static_argnums"),
               StateField<std::vector<nb::str>>(fields, "static_argnames"),
               leaf_dispatch.is_none() ? nb::object() : leaf_dispatch);
    return nb::none();
  });
}

// As stock's: what a cache miss of the user's arguments calls.
PyObject* JitFunctionCacheMiss(PyObject* self, void*) {
  return Guarded([&] {
    return nb::object(StockShapedDispatch(Self(self)).attr("_cache_miss"));
  });
}

PyMethodDef jit_function_methods[] = {
    {"_cache_size", JitFunctionCacheSize, METH_NOARGS,
     "The number of entries of the C++ dispatch's cache."},
    {"_clear_cache", JitFunctionClearCache, METH_NOARGS,
     "Clears the C++ dispatch's cache."},
    {"__getstate__", JitFunctionGetState, METH_NOARGS, nullptr},
    {"__setstate__", JitFunctionSetState, METH_O, nullptr},
    {nullptr, nullptr, 0, nullptr}};

PyGetSetDef jit_function_getset[] = {
    {"__signature__", JitFunctionSignature, nullptr, nullptr, nullptr},
    {"_cache_miss", JitFunctionCacheMiss, nullptr, nullptr, nullptr},
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
    {Py_tp_new, reinterpret_cast<void*>(JitFunctionNew)},
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
    "jaxlib_patch.pytree.jit.PjitFunction", sizeof(JitFunctionObject), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    jit_function_slots};

nb::object MakeJitFunction(nb::callable fun, nb::callable make_dispatch,
                           nb::handle registry,
                           std::vector<Py_ssize_t> static_argnums,
                           std::vector<nb::str> static_argnames,
                           std::optional<nb::callable> leaf_dispatch) {
  nb::object self =
      nb::steal(JitFunctionNew(jit_function_type, nullptr, nullptr));
  if (!self.is_valid()) throw nb::python_error();
  Initialize(reinterpret_cast<JitFunctionObject*>(self.ptr()), std::move(fun),
             std::move(make_dispatch), registry, std::move(static_argnums),
             std::move(static_argnames),
             leaf_dispatch ? std::move(*leaf_dispatch) : nb::object());
  return self;
}

}  // namespace

void BindJitFunction(nb::module_& parent) {
  nb::module_ m = parent.def_submodule(
      "jit",
      "jax.jit's front door: the object jax.jit returns, the DispatchArgs it "
      "hands to the stock dispatch, and the one rule that splits a call's "
      "arguments into dynamic and static ones.");
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
