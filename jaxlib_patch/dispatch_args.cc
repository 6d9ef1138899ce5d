// DispatchArgs: the dynamic arguments of one call of a jitted function,
// flattened once. The stock dispatch registry knows it as a dataclass node
// whose child is `leaves` and whose aux data is `treedef` (hashable, and it
// compares sharing too), so the dispatch's cache is keyed on the sharing.
// `args` and `kwargs` are the call's own arguments, static ones included, for
// the slow path.

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
  nb::object kwargs;
};

PyTypeObject* dispatch_args_type = nullptr;

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
               call_kwargs ? nb::borrow(call_kwargs) : nb::object(nb::dict()))
        .release()
        .ptr();
  } catch (...) {
    SetPythonErrorFromException();
    return nullptr;
  }
}

#define JAXLIB_PATCH_MEMBER(field)                                         \
  {#field, T_OBJECT_EX,                                                    \
   static_cast<Py_ssize_t>(offsetof(DispatchArgsObject, field)), READONLY, \
   nullptr}

PyMemberDef dispatch_args_members[] = {JAXLIB_PATCH_MEMBER(leaves),
                                       JAXLIB_PATCH_MEMBER(treedef),
                                       JAXLIB_PATCH_MEMBER(args),
                                       JAXLIB_PATCH_MEMBER(kwargs),
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
  m.attr("DispatchArgs") =
      nb::borrow(reinterpret_cast<PyObject*>(dispatch_args_type));
}

}  // namespace jaxlib_patch
