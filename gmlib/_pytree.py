"""The pytree protocol shared by gmlib's frozen dataclasses (mixtures, problems, head parameters)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


def validated_pytree(cls):
    """Register a frozen dataclass whose ``__init__`` validates its inputs as a JAX pytree.

    The leaves are the dataclass fields, in order. Unflattening bypasses ``__init__``
    (:func:`unchecked`): inside ``jit``, ``vmap`` or ``grad`` the leaves may be tracers or
    sentinels, which cannot (and need not) be validated again. The class also gets an
    ``astype(dtype)`` method (unless it defines its own): the same object with every
    floating leaf cast to ``dtype``.
    """
    names = tuple(f.name for f in dataclasses.fields(cls))

    def tree_flatten(self):
        return tuple(getattr(self, name) for name in names), None

    def tree_unflatten(klass, aux, leaves):
        return unchecked(klass, *leaves)

    def astype(self, dtype):
        """The same object with every floating leaf cast to ``dtype`` (itself when nothing changes)."""
        leaves = tree_flatten(self)[0]
        cast = [hasattr(a, "dtype") and jnp.issubdtype(a.dtype, jnp.floating) and a.dtype != dtype for a in leaves]
        if not any(cast):
            return self
        return unchecked(type(self), *(a.astype(dtype) if c else a for a, c in zip(leaves, cast)))

    cls.tree_flatten = tree_flatten
    cls.tree_unflatten = classmethod(tree_unflatten)
    if "astype" not in cls.__dict__:
        cls.astype = astype
    return jax.tree_util.register_pytree_node_class(cls)


def unchecked(cls, *leaves):
    """An instance of the validated dataclass ``cls`` with fields ``leaves``, without validating them.

    For leaves that are already valid (derived from a validated instance) or cannot be
    validated (tracers). Example: ``unchecked(GaussianMixture, weights, means, covs)``.
    """
    fields = dataclasses.fields(cls)
    obj = object.__new__(cls)
    for field, leaf in zip(fields, leaves, strict=True):
        object.__setattr__(obj, field.name, leaf)
    return obj
