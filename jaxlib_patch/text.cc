// Python text as C++ strings and back (see text.h).

#include "jaxlib_patch/text.h"

namespace jaxlib_patch {

namespace {

std::string Utf8(nb::handle text) {
  nb::object bytes = nb::steal(
      PyUnicode_AsEncodedString(text.ptr(), "utf-8", "surrogatepass"));
  if (!bytes.is_valid()) throw nb::python_error();
  return std::string(PyBytes_AS_STRING(bytes.ptr()),
                     PyBytes_GET_SIZE(bytes.ptr()));
}

}  // namespace

std::string Str(nb::handle obj) { return Utf8(nb::str(obj)); }
std::string Repr(nb::handle obj) { return Utf8(nb::repr(obj)); }

nb::str FromUtf8(const std::string& text) {
  PyObject* str =
      PyUnicode_DecodeUTF8(text.data(), text.size(), "surrogatepass");
  if (str == nullptr) throw nb::python_error();
  return nb::steal<nb::str>(str);
}

std::string TypeName(nb::handle type) { return Str(type.attr("__name__")); }

}  // namespace jaxlib_patch
