// DispatchArgs: the dynamic arguments of one call of a jitted function,
// flattened once. The stock dispatch registry knows it as a dataclass node
// whose child is `leaves` and whose aux data is `treedef` (hashable, and it
// compares sharing too), so the dispatch's cache is keyed on the sharing.
// `args` and `kwargs` are the call's own arguments, static ones included, for
// the slow path.
//
// The dispatch reads `leaves` and `treedef` at every call, so they are found
// by the interned names' addresses before the generic lookup (about 140
// instructions a read); a call without keyword arguments makes its `kwargs`
// dict only if something reads it (the slow path, `disable_jit`, the NaN
// check), which a cached call never does.

#include <Python.h>
#include <structmember.h>

#include <cstddef>
#include <new>
#include <utility>

#include "jaxlib_patch/exceptions.h"
#include "jaxlib_patch/jit_function.h"

namespace jaxlib_patch {

namespace {

struct DispatchArgsObject {
  PyObject_HEAD nb::object leaves;
  nb::object treedef;
  nb::object args;
  nb::object kwargs;  // Null for a call without keyword arguments, until read.
};

PyTypeObject* dispatch_args_type = nullptr;
// The interned names of the two fields the stock dispatch reads.
PyObject* leaves_name = nullptr;
PyObject* treedef_name = nullptr;

void DispatchArgsDealloc(PyObject* self) {
  PyTypeObject* type = Py_TYPE(self);
  PyObject_GC_UnTrack(self);
  auto* o = reinterpret_cast<DispatchArgsObject*>(self);
  o->~DispatchArgsObject();
  type->tp_free(self);
  Py_DECREF(type);
}

// The GC slots follow gc.cc's rule: they never throw and never call into
// Python, since the collector runs them at any allocation.
int DispatchArgsTraverse(PyObject* self, visitproc visit, void* arg) {
  auto* o = reinterpret_cast<DispatchArgsObject*>(self);
  Py_VISIT(Py_TYPE(self));
  Py_VISIT(o->leaves.ptr());
  Py_VISIT(o->treedef.ptr());
  Py_VISIT(o->args.ptr());
  Py_VISIT(o->kwargs.ptr());
  return 0;
}

int DispatchArgsClear(PyObject* self) {
  auto* o = reinterpret_cast<DispatchArgsObject*>(self);
  o->leaves.reset();
  o->treedef.reset();
  o->args.reset();
  o->kwargs.reset();
  return 0;
}

PyObject* DispatchArgsNew(PyTypeObject*, PyObject* args, PyObject* kwargs) {
  static const char* names[] = {"leaves", "treedef", "args", "kwargs", nullptr};
  PyObject *leaves, *treedef, *call_args = nullptr, *call_kwargs = nullptr;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|OO:DispatchArgs",
                                   const_cast<char**>(names), &leaves, &treedef,
                                   &call_args, &call_kwargs)) {
    return nullptr;
  }
  try {
    return MakeDispatchArgs(
               nb::borrow(leaves), nb::borrow(treedef),
               call_args ? nb::borrow(call_args) : nb::object(nb::tuple()),
               call_kwargs ? nb::borrow(call_kwargs) : nb::object())
        .release()
        .ptr();
  } catch (...) {
    SetPythonErrorFromException();
    return nullptr;
  }
}

PyObject* DispatchArgsGetAttr(PyObject* self, PyObject* name) {
  auto* o = reinterpret_cast<DispatchArgsObject*>(self);
  // Null only after tp_clear: the generic lookup then raises AttributeError.
  if (name == leaves_name && o->leaves.is_valid()) {
    return Py_NewRef(o->leaves.ptr());
  }
  if (name == treedef_name && o->treedef.is_valid()) {
    return Py_NewRef(o->treedef.ptr());
  }
  return PyObject_GenericGetAttr(self, name);
}

// `kwargs`: one dict, made at the first read if the call had no keyword
// arguments.
PyObject* DispatchArgsKwargs(PyObject* self, void*) {
  auto* o = reinterpret_cast<DispatchArgsObject*>(self);
  nb::ft_object_guard guard{nb::handle(self)};
  if (!o->kwargs.is_valid()) {
    PyObject* kwargs = PyDict_New();
    if (kwargs == nullptr) return nullptr;
    o->kwargs = nb::steal(kwargs);
  }
  return Py_NewRef(o->kwargs.ptr());
}

PyGetSetDef dispatch_args_getset[] = {
    {"kwargs", DispatchArgsKwargs, nullptr, nullptr, nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

#define JAXLIB_PATCH_MEMBER(field)                                         \
  {#field, T_OBJECT_EX,                                                    \
   static_cast<Py_ssize_t>(offsetof(DispatchArgsObject, field)), READONLY, \
   nullptr}

PyMemberDef dispatch_args_members[] = {JAXLIB_PATCH_MEMBER(leaves),
                                       JAXLIB_PATCH_MEMBER(treedef),
                                       JAXLIB_PATCH_MEMBER(args),
                                       {nullptr, 0, 0, 0, nullptr}};

PyType_Slot dispatch_args_slots[] = {
    {Py_tp_doc,
     const_cast<char*>("DispatchArgs(leaves, treedef, args=(), kwargs={})\n\n"
                       "The dynamic arguments of a call of a jitted function, "
                       "flattened once (one identity scope), as the stock C++ "
                       "dispatch receives them; `args` and `kwargs` are the "
                       "call's own arguments.")},
    {Py_tp_new, reinterpret_cast<void*>(DispatchArgsNew)},
    {Py_tp_dealloc, reinterpret_cast<void*>(DispatchArgsDealloc)},
    {Py_tp_traverse, reinterpret_cast<void*>(DispatchArgsTraverse)},
    {Py_tp_clear, reinterpret_cast<void*>(DispatchArgsClear)},
    {Py_tp_members, dispatch_args_members},
    {Py_tp_getset, dispatch_args_getset},
    {Py_tp_getattro, reinterpret_cast<void*>(DispatchArgsGetAttr)},
    {0, nullptr}};

PyType_Spec dispatch_args_spec = {
    "jaxlib_patch.pytree.jit.DispatchArgs", sizeof(DispatchArgsObject), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC, dispatch_args_slots};

}  // namespace

nb::object MakeDispatchArgs(nb::object leaves, nb::object treedef,
                            nb::object args, nb::object kwargs) {
  PyObject* self = dispatch_args_type->tp_alloc(dispatch_args_type, 0);
  if (self == nullptr) throw nb::python_error();
  auto* o = reinterpret_cast<DispatchArgsObject*>(self);
  // tp_alloc zeroes the memory: the handles are constructed over nulls.
  new (&o->leaves) nb::object(std::move(leaves));
  new (&o->treedef) nb::object(std::move(treedef));
  new (&o->args) nb::object(std::move(args));
  new (&o->kwargs) nb::object(std::move(kwargs));
  return nb::steal(self);
}

void BindDispatchArgs(nb::module_& m) {
  dispatch_args_type =
      reinterpret_cast<PyTypeObject*>(PyType_FromSpec(&dispatch_args_spec));
  if (dispatch_args_type == nullptr) throw nb::python_error();
  leaves_name = PyUnicode_InternFromString("leaves");
  treedef_name = PyUnicode_InternFromString("treedef");
  if (leaves_name == nullptr || treedef_name == nullptr) {
    throw nb::python_error();
  }
  m.attr("DispatchArgs") =
      nb::borrow(reinterpret_cast<PyObject*>(dispatch_args_type));
}

}  // namespace jaxlib_patch
