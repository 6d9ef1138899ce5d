// Taking one node of a Python tree apart, with stock's checks and messages:
// shared by flatten (flatten.cc, where these are defined), flatten_up_to and
// the one-level flatten.

#ifndef JAXLIB_PATCH_FLATTEN_COMMON_H_
#define JAXLIB_PATCH_FLATTEN_COMMON_H_

#include <utility>

#include "jaxlib_patch/pytree.h"

namespace jaxlib_patch {

// What a custom node's to_iterable (or, `with_keys`, to_iterable_with_keys)
// returns for `obj`. Called directly: nanobind's call would hold and release
// the argument and check the result once more, on every custom node.
nb::object ToIterable(const PyTreeRegistry::Registration& registration,
                      nb::handle obj, bool with_keys);

// Unpacks what a custom node's to_iterable (or, `with_keys`,
// to_iterable_with_keys) returned: (iterator over the children, aux_data).
std::pair<nb::object, nb::object> UnpackChildrenAndAux(nb::handle result,
                                                       bool with_keys);

// Raises ValueError unless `pair` is a (key, child) pair.
void CheckKeyChildPair(nb::handle pair);

// A namedtuple's `_fields`, checked against its items.
nb::object NamedTupleFields(nb::handle tuple);

// A GetAttrKey for field `i` of checked `fields`.
nb::object FieldKey(nb::handle fields, Py_ssize_t i);

nb::object GetAttr(nb::handle obj, const nb::str& name);

// The tuple of a dataclass node's meta field values.
nb::object MetaFields(nb::handle obj,
                      const PyTreeRegistry::Registration& registration);

// Calls `visit(item)` for each item an iterator yields.
template <typename Visit>
void ForEach(nb::handle iterator, Visit&& visit) {
  while (PyObject* item = PyIter_Next(iterator.ptr())) {
    visit(nb::steal(item));
  }
  if (PyErr_Occurred()) throw nb::python_error();
}

}  // namespace jaxlib_patch

#endif  // JAXLIB_PATCH_FLATTEN_COMMON_H_
