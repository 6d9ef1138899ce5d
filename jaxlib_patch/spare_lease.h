// A thread's spare working buffer of one kind, lent to one operation at a
// time.
//
// What a flatten needs while it runs (the identity scope, the buffer of its
// leaves) grows with the tree. Made anew for each flatten, it would grow from
// empty every time, its cost moving with the heap's layout, and be freed
// again. Each thread keeps one, emptied, between operations: an operation
// takes it when first needed and hands it back at its end. An operation
// nested inside another (a flatten function that flattens, a finalizer run as
// a flatten releases its objects) finds the spare taken and makes its own.

#ifndef JAXLIB_PATCH_SPARE_LEASE_H_
#define JAXLIB_PATCH_SPARE_LEASE_H_

#include <memory>
#include <utility>

namespace jaxlib_patch {

// T is default-constructible, with `void Clear()`, which empties it and may
// run Python (releasing objects runs their finalizers), and `bool
// KeepAsSpare() const`, whether it is small enough to keep for the thread's
// lifetime.
template <typename T>
class SpareLease {
 public:
  SpareLease() = default;
  SpareLease(const SpareLease&) = delete;
  SpareLease& operator=(const SpareLease&) = delete;

  ~SpareLease() {
    if (!lent_) return;
    // Not the spare until it is empty: the finalizers that Clear runs may
    // take a lease of their own.
    lent_->Clear();
    std::unique_ptr<T>& spare = Spare();
    if (!spare && lent_->KeepAsSpare()) spare = std::move(lent_);
  }

  T& Get() { return lent_ ? *lent_ : Take(); }

 private:
  T& Take() {
    lent_ = std::move(Spare());
    if (!lent_) lent_ = std::make_unique<T>();
    return *lent_;
  }

  // Holds no Python object between operations, so it may outlive the
  // interpreter.
  static std::unique_ptr<T>& Spare() {
    thread_local std::unique_ptr<T> spare;
    return spare;
  }

  std::unique_ptr<T> lent_;
};

}  // namespace jaxlib_patch

#endif  // JAXLIB_PATCH_SPARE_LEASE_H_
