// The leaves of one flatten, collected as new references and made into a
// list once, at its final size (flatten.cc).

#ifndef JAXLIB_PATCH_LEAF_COLLECTOR_H_
#define JAXLIB_PATCH_LEAF_COLLECTOR_H_

#include <Python.h>

#include <algorithm>
#include <cstddef>
#include <memory>
#include <utility>

#include "jaxlib_patch/pytree.h"
#include "jaxlib_patch/spare_lease.h"

namespace jaxlib_patch {

// Room for the leaves past the first kInlineLeaves of a flatten
// (LeafCollector) until they become its list. Appended to a Python list one
// at a time, they would grow it by an eighth at a time, each step a realloc
// that copies the whole list wherever the heap has no room after it: several
// copies of the final list per flatten, more or fewer with the heap's
// layout. This room keeps its size from one flatten to the next
// (SpareLease), and the list is made once, at its final size. It is storage
// only: the collector owns the references it writes here.
class LeafBuffer {
 public:
  LeafBuffer() = default;
  LeafBuffer(const LeafBuffer&) = delete;
  LeafBuffer& operator=(const LeafBuffer&) = delete;

  PyObject** slots() const { return slots_.get(); }
  size_t capacity() const { return capacity_; }

  // At least twice the room (and at least kMinLeaves), the first `used`
  // slots kept.
  void Grow(size_t used) {
    const size_t capacity = std::max(kMinLeaves, 2 * capacity_);
    auto slots = std::make_unique<PyObject*[]>(capacity);
    std::copy(slots_.get(), slots_.get() + used, slots.get());
    slots_ = std::move(slots);
    capacity_ = capacity;
  }

  // Holds no reference, so there is nothing to release.
  void Clear() {}

  // A buffer grown past 131,072 leaves (1 MiB) is freed rather than kept
  // for the thread's lifetime.
  bool KeepAsSpare() const { return capacity_ <= kMaxSpareLeaves; }

 private:
  static constexpr size_t kMinLeaves = 64;
  static constexpr size_t kMaxSpareLeaves = size_t{1} << 17;

  std::unique_ptr<PyObject*[]> slots_;
  size_t capacity_ = 0;
};

// The leaves of one flatten, as new references. Most flattens have a few (a
// call's arguments, a sharding spec): they stay in `inline_`, and only a
// flatten of more takes the thread's LeafBuffer, which costs two
// thread-local lookups. Either way an append is a store at `cursor_`, and
// only the end of the room (`limit_`) takes the out-of-line step.
class LeafCollector {
 public:
  LeafCollector() = default;
  LeafCollector(const LeafCollector&) = delete;
  LeafCollector& operator=(const LeafCollector&) = delete;
  // Releases the leaves of a flatten that failed; the lease of the buffer is
  // handed back after, so that finalizers run here make their own.
  ~LeafCollector() {
    for (Py_ssize_t k = 0; k < num_inline(); ++k) Py_DECREF(inline_[k]);
    if (run_ != nullptr) {
      for (PyObject** leaf = run_; leaf != cursor_; ++leaf) Py_DECREF(*leaf);
    }
  }

  // A count of its own, not derived from `cursor_`: the flatten reads it
  // twice a node, and it costs one increment a leaf.
  Py_ssize_t size() const { return size_; }

  void Append(nb::handle leaf) { Append(nb::borrow(leaf)); }
  void Append(nb::object&& leaf) {
    if (cursor_ == limit_) MakeRoom();
    *cursor_++ = leaf.release().ptr();
    ++size_;
  }

  // The leaves as a new list, which takes over the references.
  nb::list TakeList() {
    nb::list list = nb::steal<nb::list>(PyList_New(size_));
    if (!list.is_valid()) throw nb::python_error();
    PyObject** slots = PySequence_Fast_ITEMS(list.ptr());
    // A loop, not std::copy: for the few leaves of most flattens a call of
    // memmove costs more than the copy.
    for (Py_ssize_t k = 0; k < num_inline(); ++k) slots[k] = inline_[k];
    if (run_ != nullptr) std::copy(run_, cursor_, slots + kInlineLeaves);
    size_ = 0;
    run_ = nullptr;
    return list;
  }

 private:
  static constexpr Py_ssize_t kInlineLeaves = 16;

  Py_ssize_t num_inline() const { return std::min(size_, kInlineLeaves); }

  // Out of line, so that the appends stay small enough to inline.
  [[gnu::noinline]] void MakeRoom() {
    LeafBuffer& buffer = buffer_.Get();
    const size_t used = run_ != nullptr ? cursor_ - run_ : 0;
    if (used == buffer.capacity()) buffer.Grow(used);
    run_ = buffer.slots();
    cursor_ = run_ + used;
    limit_ = run_ + buffer.capacity();
  }

  PyObject* inline_[kInlineLeaves];
  // Where the next leaf goes and where its room ends: in `inline_`, then
  // in the buffer, whose leaves start at `run_` (null before).
  PyObject** cursor_ = inline_;
  PyObject** limit_ = inline_ + kInlineLeaves;
  PyObject** run_ = nullptr;
  Py_ssize_t size_ = 0;
  SpareLease<LeafBuffer> buffer_;
};

}  // namespace jaxlib_patch

#endif  // JAXLIB_PATCH_LEAF_COLLECTOR_H_
