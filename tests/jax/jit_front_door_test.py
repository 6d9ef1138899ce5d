"""The object jax.jit returns behaves as stock's PjitFunction.

No class here opts into relative identities: these are plain jax.jit uses,
which must see no difference from stock jax.
"""

import dataclasses
import functools
import gc
import inspect
import traceback
import weakref

import jax

from absl.testing import absltest
import numpy as np

import jax.numpy as jnp
from jax._src import core
from jax._src import dtypes
from jax._src import earray
from jax._src import test_util as jtu
from jax._src.interpreters import pxla


def double(x):
  """Docstring of double."""
  return x * 2


class JitFrontDoorTest(jtu.JaxTestCase):

  def test_a_fresh_jit_of_one_function_reuses_the_cpp_cache(self):
    x = jnp.arange(3.0)
    with jtu.count_pjit_cpp_cache_miss() as misses:
      for _ in range(10):
        jax.jit(double)(x)
    self.assertEqual(misses(), 1)
    self.assertEqual(jax.jit(double)._cache_size(), 1)
    # Other options, other cache; another function, another cache.
    with jtu.count_pjit_cpp_cache_miss() as misses:
      jax.jit(double, donate_argnums=0)(jnp.arange(3.0))
      jax.jit(double, donate_argnums=0)(jnp.arange(3.0))
      jax.jit(lambda x: x * 2)(x)
    self.assertEqual(misses(), 2)

    # Callables that compare equal are still distinct functions: as in
    # stock, the cache is keyed on the function's identity.
    class Scaler:

      def __init__(self, factor):
        self.factor = factor

      def __eq__(self, other):
        return True

      __hash__ = object.__hash__

      def __call__(self, x):
        return x * self.factor

    x = jnp.arange(3.0)
    self.assertArraysEqual(jax.jit(Scaler(2.0))(x), x * 2)
    self.assertArraysEqual(jax.jit(Scaler(3.0))(x), x * 3)

  def test_calls_on_leaves_and_on_trees_of_one_function(self):
    # Calls whose dynamic arguments are all positional leaves take stock's
    # own dispatch as they are; the others cross it as one flatten. Each
    # signature is compiled and cached once, in one of the two.
    f = jax.jit(lambda *args, **kwargs: jax.tree.map(lambda t: t * 2, kwargs))
    x = jnp.arange(3.0)
    calls = [
        ((x,), {}),
        (([x],), {}),
        ((x,), {"k": x}),
        ((x, None), {}),
        ((x, np.float32(2.0)), {}),
    ]
    with jtu.count_pjit_cpp_cache_miss() as misses:
      for _ in range(3):
        for args, kwargs in calls:
          out = f(*args, **kwargs)
          self.assertEqual(out.keys(), kwargs.keys())
          for k in kwargs:
            self.assertArraysEqual(out[k], kwargs[k] * 2)
    self.assertEqual(misses(), len(calls))
    self.assertEqual(f._cache_size(), len(calls))
    f.clear_cache()
    self.assertEqual(f._cache_size(), 0)

  def test_extended_dtype_arrays_stay_on_the_cpp_path(self):
    # An EArray is a leaf to tracing but a node to stock's C++ dispatch,
    # which flattens it to its data: calls on it must find their cache
    # entry there, as on stock, not fall back to Python every time.
    class Scaled(dtypes.extended):
      pass

    class ScaledRules:
      allow_conversion = True

      @staticmethod
      def physical_element_aval(dtype):
        return core.ShapedArray((), np.dtype("float32"))

      @staticmethod
      def global_sharded_result_handler(aval, out_sharding, committed):
        handler = pxla.global_result_handlers[core.ShapedArray](
            core.physical_aval(aval), out_sharding, committed
        )
        return handler.wrap(lambda data: earray.EArray(aval, data))

    @dataclasses.dataclass(frozen=True)
    class ScaledDType(dtypes.ExtendedDType):
      name: str = "scaled"
      _rules: type = ScaledRules
      type: type = Scaled

    x = jax.jit(lambda x: jax.lax.convert_element_type(x, ScaledDType()))(
        jnp.arange(3.0)
    )
    self.assertIsInstance(x, earray.EArray)
    identity = jax.jit(lambda x: x)
    with jtu.count_pjit_cpp_cache_miss() as misses:
      for _ in range(5):
        y = identity(x)
    self.assertEqual(misses(), 1)
    self.assertIsInstance(y.dtype, ScaledDType)

  def test_disable_jit_calls_the_function_with_the_arguments_themselves(self):
    x = jnp.arange(3.0)
    identity = jax.jit(lambda *args, **kwargs: (args, kwargs))
    with jax.disable_jit():
      args, kwargs = identity(x, 1)
      self.assertIs(args[0], x)
      args, kwargs = identity([x], k=x)
      self.assertIs(args[0][0], x)
      self.assertIs(kwargs["k"], x)

  def test_repr_as_stock(self):
    jitted = jax.jit(double)
    self.assertEqual(repr(jitted), f"<PjitFunction of {double!r}>")

    class BadRepr:

      def __call__(self):
        pass

      def __repr__(self):
        raise ValueError("invalid repr")

    jitted = jax.jit(BadRepr())
    self.assertEqual(repr(jitted), "<PjitFunction>")
    del jitted.__wrapped__
    self.assertEqual(repr(jitted), "<PjitFunction>")

  def test_bound_methods_and_weak_references(self):
    # jax.jit(obj.method) stored on obj: a cycle the collector must break.
    class Model:

      def __init__(self):
        self.jitted = jax.jit(self.apply)

      def apply(self, x):
        return x + 1

    model = Model()
    self.assertEqual(model.jitted(1.0), 2.0)
    ref = weakref.ref(model)
    del model
    gc.collect()
    self.assertIsNone(ref())

    # A jitted method binds to its object; a jitted function is weakly
    # referenceable.
    class Static:
      scale = 3.0

      @jax.jit
      def apply(self, x):
        return x * self.scale

    jax.tree_util.register_static(Static)
    self.assertEqual(Static().apply(2.0), 6.0)
    jitted = jax.jit(double)
    ref = weakref.ref(jitted)
    self.assertIs(ref(), jitted)
    del jitted
    gc.collect()
    self.assertIsNone(ref())

  def test_traceback_has_no_extra_frame(self):
    # Between the caller and the traced function, exactly stock's frames
    # (jax 0.10.2), on both dispatches: positional leaves and a list.
    stock_frames = [
        "reraise_with_filtered_traceback",
        "cache_miss",
        "_infer_params",
        "_trace_for_jit",
        "trace_to_jaxpr",
        "f",
    ]
    for arg in (1.0, [1.0]):
      frames = []

      @jax.jit
      def f(x):
        frames.extend(traceback.extract_stack())
        return x

      def caller():
        return f(arg)

      caller()
      names = [frame.name for frame in frames]
      with self.subTest(arg=arg):
        self.assertEqual(names[names.index("caller") + 1 :], stock_frames)

  def test_getstate_names_the_function(self):
    cases = {
        "function": (double, "double"),
        "partial": (functools.partial(double), "double"),
        "nested partial": (
            functools.partial(functools.partial(double)),
            "double",
        ),
        "lambda": (lambda: None, "<lambda>"),
    }
    named = functools.partial(double)
    named.__name__ = "named"
    cases["named partial"] = (named, "named")
    for label, (fun, name) in cases.items():
      with self.subTest(label):
        self.assertEqual(jax.jit(fun).__getstate__()["function_name"], name)

  def test_wraps_copies_no_jit_attribute(self):
    jitted = jax.jit(double)
    wrapper = functools.wraps(jitted)(lambda x: jitted(x + 1))
    for name in (
        "lower",
        "trace",
        "eval_shape",
        "clear_cache",
        "_cache_size",
        "_clear_cache",
    ):
      with self.subTest(name):
        self.assertFalse(hasattr(wrapper, name))
    with self.assertRaisesRegex(AttributeError, "has no attribute 'lower'"):
      wrapper.lower(1.0)
    # The wrapper is a function of its own for the rest of JAX too.
    self.assertEqual(jax.eval_shape(wrapper, 1.0).shape, ())
    self.assertEqual(jax.jit(wrapper)(1.0), 4.0)
    self.assertEqual(jax.jit(jitted)(1.0), 2.0)
    # What the jitted function itself has.
    self.assertIs(jitted.__wrapped__, double)
    self.assertEqual(jitted.__name__, "double")
    self.assertEqual(jitted.__doc__, "Docstring of double.")
    self.assertEqual(inspect.signature(jitted), inspect.signature(double))
    self.assertIs(jitted._fun, double)
    self.assertEqual(jitted.eval_shape(1.0).shape, ())
    self.assertIn("lower", type(jitted).__dict__)

  def test_static_arguments(self):
    # A static argument named like an internal one of the dispatch.
    def f(x, dispatch_args):
      return x * dispatch_args

    jitted = jax.jit(f, static_argnames="dispatch_args")
    for _ in range(2):
      self.assertEqual(jitted(2.0, dispatch_args=3), 6.0)
    self.assertEqual(jitted.lower(2.0, dispatch_args=3).compile()(2.0), 6.0)

    # One rule for a negative index: it counts from the end of the call's
    # positional arguments.
    def f(*args):
      return args[0] * args[-1]

    jitted = jax.jit(f, static_argnums=-1)
    self.assertEqual(jitted(np.float32(2.0), 3), 6.0)
    self.assertEqual(jitted(np.float32(2.0), 5.0, 3), 6.0)
    # An index before the first argument: stock's error, from the slow path.
    with self.assertRaisesRegex(ValueError, "greater than or equal to -len"):
      jax.jit(f, static_argnums=-3)(np.float32(2.0), 3.0)

  def test_calls_and_lower_trace_agree_on_static_arguments(self):
    # Calls split static arguments off in C++; lower, trace and eval_shape
    # (the slow path) split them with the same C++ split. The output's keys
    # name the arguments the function saw as static (not tracers).
    def static_ones(*args, **kwargs):
      named = [(f"args[{i}]", x) for i, x in enumerate(args)]
      named += [(k, x) for k, x in kwargs.items()]
      return {
          name: jnp.zeros(())
          for name, x in named
          if not isinstance(x, jax.core.Tracer)
      }

    def named_static(x, n, *, mode=0):
      return static_ones(x, n, mode=mode)

    x = np.float32(1.0)
    cases = [
        # (jax.jit options, function, args, kwargs, the static ones)
        (dict(static_argnums=-1), static_ones, (x, 2), {}, {"args[1]"}),
        (dict(static_argnums=-1), static_ones, (x, x, 3), {}, {"args[2]"}),
        (dict(static_argnums=(0, -1)), static_ones, (4,), {}, {"args[0]"}),
        (dict(static_argnums=(1, -2)), static_ones, (x, 5, x), {}, {"args[1]"}),
        # An index past the call's positional arguments selects nothing.
        (dict(static_argnums=5), static_ones, (x, x), {}, set()),
        (
            dict(static_argnums=(-1, 7)),
            static_ones,
            (x, 6),
            {"k": x},
            {"args[1]"},
        ),
        (dict(static_argnames="k"), static_ones, (x,), {"k": 7, "j": x}, {"k"}),
        # static_argnames given positionally (jax.jit makes them static
        # positions too) and by keyword.
        (
            dict(static_argnames=("n", "mode")),
            named_static,
            (x, 8),
            {},
            {"args[1]", "mode"},
        ),
        (
            dict(static_argnames=("n", "mode")),
            named_static,
            (x,),
            {"n": 9, "mode": 1},
            {"args[1]", "mode"},
        ),
        (
            dict(static_argnums=1),
            named_static,
            (x,),
            {"n": 10},
            {"args[1]", "mode"},
        ),
    ]
    for options, fun, args, kwargs, expected in cases:
      with self.subTest(options=options, args=args, kwargs=kwargs):
        jitted = jax.jit(fun, **options)
        self.assertEqual(set(jitted(*args, **kwargs)), expected)
        self.assertEqual(set(jitted(*args, **kwargs)), expected)  # cached
        self.assertEqual(set(jitted.trace(*args, **kwargs).out_info), expected)
        self.assertEqual(set(jitted.lower(*args, **kwargs).out_info), expected)
        self.assertEqual(set(jitted.eval_shape(*args, **kwargs)), expected)

    # An index before the first argument: stock's error on every path. (A
    # function of its own: as in stock, jax.jit's global cache would answer
    # the call from the entry `static_argnums=5` made, which has the same
    # dynamic and static arguments.)
    jitted = jax.jit(lambda *args: static_ones(*args), static_argnums=-3)
    for path in (jitted, jitted.trace, jitted.lower, jitted.eval_shape):
      with self.subTest(path=path):
        with self.assertRaisesRegex(
            ValueError, "greater than or equal to -len"
        ):
          path(x, x)


if __name__ == "__main__":
  absltest.main(testLoader=jtu.JaxTestLoader())
