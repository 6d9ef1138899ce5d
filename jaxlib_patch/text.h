// Python text as C++ strings and back, for reprs and error messages.

#ifndef JAXLIB_PATCH_TEXT_H_
#define JAXLIB_PATCH_TEXT_H_

#include <string>

#include <nanobind/nanobind.h>

namespace jaxlib_patch {

namespace nb = nanobind;

// Python text as UTF-8, for reprs and messages. Lone surrogates (legal in a
// Python str, not in UTF-8) pass through, so no key or type name can make a
// repr fail; FromUtf8 turns such text back into a Python str.
std::string Str(nb::handle obj);
std::string Repr(nb::handle obj);
nb::str FromUtf8(const std::string& text);

// The `__name__` of a type, used by repr and errors.
std::string TypeName(nb::handle type);

}  // namespace jaxlib_patch

#endif  // JAXLIB_PATCH_TEXT_H_
