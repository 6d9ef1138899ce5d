"""Offline stand-in for @rules_java//java:defs.bzl.

@bazel_tools//tools/jdk (which Bazel 4 loads while resolving toolchains, even
for a pure C++ build) does `load("@rules_java//java:defs.bzl", ...)`.  The
rules are native in Bazel 4, so re-export them unchanged.
"""

java_binary = native.java_binary
java_import = native.java_import
java_library = native.java_library
java_lite_proto_library = native.java_lite_proto_library
java_package_configuration = native.java_package_configuration
java_plugin = native.java_plugin
java_proto_library = native.java_proto_library
java_runtime = native.java_runtime
java_test = native.java_test
java_toolchain = native.java_toolchain
