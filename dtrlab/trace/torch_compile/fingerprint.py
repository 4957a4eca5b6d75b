"""A training step's fingerprint, taken without tracing: what dynamo will see of a live model, its inputs and its loss.

:func:`step_fingerprint` hashes, in milliseconds, what decides the graph torch.compile traces and can be read
without tracing it: the torch version and the dynamo, functorch and Inductor configurations (what their own
``get_hash`` covers); every submodule's name, class, the source file of each class in its MRO, its training flag,
its plain attributes (numbers, strings, dtypes, a Hugging Face config's ``to_dict()``, a class it holds) and its
hooks' code; every parameter's and buffer's name, shape, strides, dtype, device, ``requires_grad`` and which ones
are shared; the inputs' tree and tensors; and the loss function's code, closure and defaults (positional and
keyword-only).

It is a *key*, not a proof: code the forward reaches outside the classes' own files (a helper module, a global
flag) is not in it. ``dtrlab.compile`` therefore uses it only to find a cached pick, and checks that pick against
the graphs dynamo hands the backend when torch compiles (:func:`dynamo_graph_hash`).
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import os
import types

import torch
from torch import nn

FINGERPRINT_FORMAT = 1
_PLAIN = (bool, int, float, str, type(None), torch.dtype, torch.device)


def step_fingerprint(module: nn.Module, inputs, loss_fn=None) -> str:
    """sha256 of what decides ``loss_fn(module(*inputs))``'s graph, read without tracing (the module docstring)."""
    import torch._dynamo.config as dynamo_config
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    parts: list = [FINGERPRINT_FORMAT, torch.__version__,
                   [_configuration(config) for config in (dynamo_config, functorch_config, inductor_config)]]
    shared: dict[int, str] = {}
    parts.append(_module_parts(module, shared))
    leaves, spec = torch.utils._pytree.tree_flatten(inputs)
    parts.append([str(spec), [_value(leaf, shared, f"input{i}") for i, leaf in enumerate(leaves)]])
    parts.append(_callable(loss_fn, shared))
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()


def dynamo_graph_hash(graph_module, example_inputs) -> str:
    """sha256 of a graph dynamo hands a torch.compile backend: its code (node names are dynamo's, the same from
    one process to the next for one model and torch version) and its example inputs' shapes, strides, dtypes and
    devices. A backend sees it at every compile, also when AOT autograd's or Inductor's caches then answer."""
    parts = [str(graph_module.graph), [_value(value, {}, "") for value in example_inputs]]
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()


def _configuration(config) -> list:
    """A torch configuration module's settings that matter to a compile. Not its own ``get_hash()``: that hashes
    the repr of sets (dynamo's ignore lists), whose order changes from one process to the next."""
    ignored = getattr(config, "_compile_ignored_keys", ())
    return [[key, _ordered(value)] for key, value in sorted(config.get_config_copy().items()) if key not in ignored]


def _ordered(value):
    if isinstance(value, (set, frozenset)):
        return sorted((_ordered(v) for v in value), key=repr)
    if isinstance(value, dict):
        return sorted([repr(k), _ordered(v)] for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return [_ordered(v) for v in value]
    return repr(value)


def _module_parts(module: nn.Module, shared: dict) -> list:
    found = []
    for name, sub in module.named_modules(remove_duplicate=False):
        hooks = [_callable(hook, shared) for table in (sub._forward_pre_hooks, sub._forward_hooks,
                                                       sub._backward_pre_hooks, sub._backward_hooks)
                 for hook in table.values()]
        attributes = {key: _attribute(value) for key, value in sorted(vars(sub).items()) if not key.startswith("_")}
        found.append([name, _class(type(sub)), sub.training, attributes, hooks])
    for name, tensor in (*module.named_parameters(remove_duplicate=False),
                         *module.named_buffers(remove_duplicate=False)):
        found.append([name, _value(tensor, shared, name)])
    return found


def _value(value, shared: dict, name: str):
    """A tensor's shape, strides, dtype, device, requires_grad, and the first name it was seen under (tied
    weights, inputs the loss closes over); a plain value itself; anything else its type."""
    if isinstance(value, torch.Tensor):
        first = shared.setdefault(id(value), name)
        return ["tensor", tuple(value.shape), value.stride(), str(value.dtype), str(value.device),
                value.requires_grad, first]
    return _attribute(value)


def _attribute(value):
    if isinstance(value, _PLAIN):
        return repr(value)
    if isinstance(value, (tuple, list)) and all(isinstance(v, _PLAIN) for v in value):
        return repr(value)
    if isinstance(value, type):  # a class the model instantiates later (``self.act = nn.GELU``): that class
        return ["class", _class(value)]
    to_dict = getattr(value, "to_dict", None)  # a Hugging Face config: what the model was built from
    if callable(to_dict):
        try:
            return json.dumps(to_dict(), sort_keys=True, default=str)
        except Exception:  # a to_dict that needs arguments or fails is not a config's
            pass
    return _class(type(value))


def _class(cls: type) -> list:
    """A class by name and the source of every class in its MRO (the code its methods run)."""
    return [f"{cls.__module__}.{cls.__qualname__}", [_source_hash(base) for base in cls.__mro__ if base is not object]]


def _callable(function, shared: dict):
    if function is None:
        return None
    if isinstance(function, nn.Module):
        return ["module", _module_parts(function, shared)]
    if isinstance(function, functools.partial):
        return ["partial", _callable(function.func, shared),
                [_value(a, shared, f"partial{i}") for i, a in enumerate(function.args)],
                {k: _value(v, shared, k) for k, v in sorted(function.keywords.items())}]
    if isinstance(function, types.MethodType):
        return ["method", _callable(function.__func__, shared), _class(type(function.__self__))]
    code = getattr(function, "__code__", None)
    if code is None:  # a builtin, or an object with __call__
        return [getattr(function, "__qualname__", None) or _class(type(function))]
    closure = [_value(cell.cell_contents, shared, f"{code.co_name}.{name}")
               for name, cell in zip(code.co_freevars, function.__closure__ or ())]
    # Each default under its own name, so that one tensor given twice is told from two tensors.
    defaults = [_value(d, shared, f"{code.co_name}.default{i}") for i, d in enumerate(function.__defaults__ or ())]
    keyword_defaults = {k: _value(v, shared, f"{code.co_name}.{k}")
                        for k, v in sorted((function.__kwdefaults__ or {}).items())}
    return ["function", function.__module__, function.__qualname__, _code_hash(code), closure, defaults,
            keyword_defaults, _source_hash(function)]


def _code_hash(code: types.CodeType) -> str:
    digest = hashlib.sha256(code.co_code)
    for constant in code.co_consts:
        digest.update((_code_hash(constant) if isinstance(constant, types.CodeType) else repr(constant)).encode())
    digest.update(repr((code.co_names, code.co_varnames)).encode())
    return digest.hexdigest()


def _source_hash(obj) -> str | None:
    try:
        path = inspect.getsourcefile(obj)
    except TypeError:  # a builtin
        return None
    try:
        status = os.stat(path) if path else None
    except OSError:
        return None
    return _file_hash(path, status.st_size, status.st_mtime_ns) if status else None


@functools.lru_cache(maxsize=1024)
def _file_hash(path: str, size: int, mtime_ns: int) -> str:
    """sha256 of a source file, read again when its size or modification time changes (a notebook's edit)."""
    with open(path, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()
