"""dtrlab.trace.torch_compile.fingerprint: a step's fingerprint is equal when what decides the graph is equal and
differs when one thing its module docstring lists differs; the hash of a graph dynamo hands a backend. The expected
outcome of each pair is that list (what torch.compile's graph depends on), or the helpers' outputs written out
by hand."""

from __future__ import annotations

import functools
import os

import pytest

torch = pytest.importorskip("torch")
# What step_fingerprint reads, imported here once (seconds): not in each test process mutmut forks after collection.
import torch._dynamo.config  # noqa: E402,F401
import torch._inductor.config  # noqa: E402,F401
from torch import nn  # noqa: E402

from dtrlab.trace.torch_compile import fingerprint  # noqa: E402
from dtrlab.trace.torch_compile.fingerprint import dynamo_graph_hash, step_fingerprint  # noqa: E402

X = torch.zeros(2, 4)


class Holder(nn.Module):
    """A linear layer and whatever plain attributes a test gives it."""

    def __init__(self, **attributes):
        super().__init__()
        self.linear = nn.Linear(4, 4)
        for key, value in attributes.items():
            setattr(self, key, value)

    def forward(self, x):
        return self.linear(x)


def prints_of(build) -> tuple[str, str]:
    """The fingerprints of two models ``build()`` makes, on the same inputs and loss."""
    return step_fingerprint(build(), (X,), None), step_fingerprint(build(), (X,), None)


def key(**attributes) -> str:
    return step_fingerprint(Holder(**attributes), (X,), None)


class Config:
    """A stand-in for a Hugging Face config: ``to_dict()`` is what the model was built from."""

    def __init__(self, **values):
        self.values = values

    def to_dict(self):
        return dict(self.values)


class Opaque:
    """An attribute without a ``to_dict`` (or with one that fails): only its class is part of the key."""

    def __init__(self, hidden=0, fails=False):
        self.hidden = hidden
        if fails:
            self.to_dict = self._fails

    def _fails(self):
        raise RuntimeError("not a config")


class OtherOpaque:
    """Another class without a to_dict."""


def test_each_kind_of_plain_attribute_is_part_of_the_key():
    pairs = {"int": (2, 3), "float": (0.5, 0.25), "str": ("mul", "add"), "bool": (True, False), "None": (None, 0),
             "dtype": (torch.float32, torch.float16), "device": (torch.device("cpu"), torch.device("meta")),
             "tuple": ((1, 1), (2, 2)), "list": ([1, "a"], [1, "b"]), "config": (Config(a=1), Config(a=2)),
             "config's dtype": (Config(dtype=torch.float32), Config(dtype=torch.float16))}
    same = [kind for kind, (a, b) in pairs.items() if key(value=a) == key(value=b)]
    assert same == []
    assert key(value=2) == key(value=2) and key(value=Config(a=1, b=2)) == key(value=Config(b=2, a=1))


def test_what_is_not_plain_is_keyed_by_its_class_only():
    """Two instances of a class whose state the key cannot read give one key (nothing process-specific such as an
    address enters it); another class gives another."""
    assert key(value=Opaque(1)) == key(value=Opaque(2)) != key(value=Config())
    assert key(value=Opaque()) != key(value=OtherOpaque()) != key(value=None)
    assert key(value=Opaque(1, fails=True)) == key(value=Opaque(2, fails=True)) == key(value=Opaque())
    assert key(value=(1, Opaque(1))) == key(value=(1, Opaque(2)))  # a tuple holding an object: the tuple's class
    # A class as an attribute (one the model instantiates later) is keyed as that class, not as `type`, and its
    # to_dict is no config's.
    assert key(value=Config) == key(value=Config) != key(value=Opaque)
    assert key(value=nn.GELU) != key(value=nn.ReLU) != key(value=nn.ReLU())
    assert key(_private=1) == key(_private=2) == key()  # torch's own bookkeeping is not read


def test_the_order_attributes_were_set_in_does_not_matter():
    first, second = Holder(), Holder()
    first.p, first.q = 1, 2
    second.q, second.p = 2, 1
    assert step_fingerprint(first, (X,)) == step_fingerprint(second, (X,))


@pytest.mark.parametrize("register", ["register_forward_pre_hook", "register_forward_hook",
                                      "register_full_backward_pre_hook", "register_full_backward_hook"])
def test_each_kind_of_hook_is_part_of_the_key(register):
    hooked = Holder()
    getattr(hooked.linear, register)(lambda *args: None)
    assert step_fingerprint(hooked, (X,)) != step_fingerprint(Holder(), (X,))


def test_a_hooks_code_and_what_it_closes_over_are_part_of_the_key():
    scale, other = torch.ones(4), torch.ones(4)

    def hooked(hook):
        model = Holder()
        model.linear.register_forward_hook(hook)
        return step_fingerprint(model, (X,))
    assert hooked(lambda module, args, out: out * 2) != hooked(lambda module, args, out: out * 3)
    assert hooked(lambda module, args, out: out * scale) != hooked(lambda module, args, out: out * other)


def test_shared_submodules_parameters_and_buffers():
    """A stateless submodule under two names is the same step as two of them; a bias (or buffer) tied to another
    module's is not the same step as none."""
    relu = nn.ReLU()
    assert step_fingerprint(nn.Sequential(relu, relu), (X,)) == step_fingerprint(nn.Sequential(nn.ReLU(), nn.ReLU()),
                                                                                  (X,))
    tied = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    tied[1].bias = tied[0].bias
    none = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4, bias=False))
    assert step_fingerprint(tied, (X,)) != step_fingerprint(none, (X,))

    def buffered(shared: bool):
        model = nn.Sequential(nn.Identity(), nn.Identity())
        model[0].register_buffer("scale", torch.ones(4))
        model[1].register_buffer("scale", model[0].scale if shared else None)
        return step_fingerprint(model, (X,))
    assert buffered(True) != buffered(False)


def test_submodules_classes_and_training_flags():
    assert step_fingerprint(nn.Sequential(nn.Linear(4, 4), nn.ReLU()), (X,)) != \
        step_fingerprint(nn.Sequential(nn.Linear(4, 4), nn.GELU()), (X,))
    model = Holder()
    model.linear.eval()  # the submodule only
    assert step_fingerprint(model, (X,)) != step_fingerprint(Holder(), (X,))


def test_inputs_tree_tensors_and_plain_leaves():
    y = torch.zeros(2, 4)
    model = Holder()
    keys = {"two tensors": (X, y), "one tensor twice": (X, X), "nested": ((X, y),), "a meta tensor": (X, y.to("meta")),
            "a plain leaf": (X, {"scale": 2}), "another plain leaf": (X, {"scale": 3}), "an int tensor": (X, y.long())}
    prints = {what: step_fingerprint(model, inputs) for what, inputs in keys.items()}
    assert len(set(prints.values())) == len(prints)
    assert step_fingerprint(model, (torch.ones(2, 4), torch.ones(2, 4))) == prints["two tensors"]


def test_a_loss_closing_over_a_parameter_is_told_from_one_closing_over_a_copy():
    model = Holder()
    weight = model.linear.weight
    copy = weight.detach().clone().requires_grad_(True)
    assert step_fingerprint(model, (X,), lambda out: out.sum() + weight.sum()) != \
        step_fingerprint(model, (X,), lambda out: out.sum() + copy.sum())


def scaled_loss(out, scale=2, *, shift=0):
    return out.sum() * scale + shift


class LossA:
    def loss(self, out):
        return out.sum()


class LossB:
    def loss(self, out):
        return out.sum()


class CallableLoss:
    def __call__(self, out):
        return out.sum()


def test_each_kind_of_loss_is_part_of_the_key():
    model = Holder()
    factor = 2
    losses = {
        "none": None, "a function": scaled_loss, "its constant": lambda out: out.sum() * 3,
        "another constant": lambda out: out.sum() * 4,
        "an inner function's constant": lambda out: (lambda t: t * 2)(out).sum(),
        "another inner constant": lambda out: (lambda t: t * 5)(out).sum(),
        "a default": lambda out, k=2: out.sum() * k, "another default": lambda out, k=3: out.sum() * k,
        "a closure": lambda out: out.sum() * factor,
        "a partial's argument": functools.partial(scaled_loss, scale=3),
        "another partial argument": functools.partial(scaled_loss, scale=4),
        "a partial's positional": functools.partial(scaled_loss, scale=3, shift=1),
        "a partial of a partial": functools.partial(functools.partial(scaled_loss), 5),
        "a method": LossA().loss, "another class's method": LossB().loss,
        "a builtin": torch.sum, "another builtin": torch.mean, "a callable object": CallableLoss(),
        "a loss module": nn.MSELoss(), "its reduction": nn.MSELoss(reduction="sum"), "another module": nn.L1Loss(),
    }
    prints = {what: step_fingerprint(model, (X,), loss) for what, loss in losses.items()}
    assert sorted(prints.values()) == sorted(set(prints.values()))
    factor = 3  # the closure's cell is read when the fingerprint is taken
    assert step_fingerprint(model, (X,), losses["a closure"]) != prints["a closure"]
    assert step_fingerprint(model, (X,), CallableLoss()) == prints["a callable object"]
    assert step_fingerprint(model, (X,), functools.partial(scaled_loss, scale=3)) == prints["a partial's argument"]


class LossBase:
    def loss(self, out):
        return out.sum()

    def other(self, out):
        return out.sum()


class LossOne(LossBase):
    pass


class LossTwo(LossBase):
    pass


class OtherCallableLoss:
    def __call__(self, out):
        return out.sum()


def two_tensor_loss(out, first, second):
    return out.sum() + first.sum() + second.sum()


def test_what_a_loss_wraps_and_which_tensors_it_shares():
    """Each way a loss can hold tensors (a partial's arguments and keywords, a function's closure and defaults, a
    method's, a loss module's buffer) is read with the tensors' sharing: one tensor twice is not two tensors."""
    model = Holder()
    t, u = torch.ones(4), torch.ones(4)

    def fp(loss):
        return step_fingerprint(model, (X,), loss)
    partial = functools.partial
    assert fp(partial(two_tensor_loss, t, t)) != fp(partial(two_tensor_loss, t, u))
    assert fp(partial(two_tensor_loss, first=t, second=t)) != fp(partial(two_tensor_loss, first=t, second=u))
    assert fp(partial(scaled_loss, 4)) != fp(partial(scaled_loss, 5))
    assert fp(partial(scaled_loss, 4)) != fp(partial(two_tensor_loss, 4))  # the wrapped function
    same, apart = t, u
    assert fp(lambda out: out.sum() + same.sum() + t.sum()) != fp(lambda out: out.sum() + apart.sum() + t.sum())
    assert fp(lambda out, a=t: out.sum() + a.sum()) == fp(lambda out, a=t: out.sum() + a.sum())
    assert fp(lambda out, a=t, b=t: (out + a + b).sum()) != fp(lambda out, a=t, b=u: (out + a + b).sum())
    assert fp(lambda out, *, a=t, b=t: (out + a + b).sum()) != fp(lambda out, *, a=t, b=u: (out + a + b).sum())
    assert fp(lambda out, *, k=2: out.sum() * k) != fp(lambda out, *, k=3: out.sum() * k)  # keyword-only defaults
    assert fp(lambda out, *, k=2: out.sum() * k) == fp(lambda out, *, k=2: out.sum() * k)

    def closing(out):
        return out.sum() + t.sum()
    assert fp(partial(closing)) == fp(partial(closing))  # its closure's tensor read, as any function's

    class Weighted:
        def loss(self, out, weight=t):
            return (out * weight).sum()
    assert fp(Weighted().loss) == fp(Weighted().loss)
    assert fp(LossOne().loss) != fp(LossTwo().loss)  # one function, bound to two classes
    assert fp(LossOne().loss) != fp(LossOne().other)
    assert fp(CallableLoss()) != fp(OtherCallableLoss())
    assert fp(nn.CrossEntropyLoss(weight=torch.ones(4))) != fp(nn.CrossEntropyLoss(weight=torch.ones(5)))


def test_configurations_and_the_torch_version_are_part_of_the_key(monkeypatch):
    import torch._dynamo.config as dynamo_config
    import torch._inductor.config as inductor_config

    model = Holder()
    base = step_fingerprint(model, (X,))
    with dynamo_config.patch(suppress_errors=not dynamo_config.suppress_errors):
        assert step_fingerprint(model, (X,)) != base
    with inductor_config.patch(max_autotune=not inductor_config.max_autotune):
        assert step_fingerprint(model, (X,)) != base
    assert "verbose" in dynamo_config._compile_ignored_keys
    with dynamo_config.patch(verbose=not dynamo_config.verbose):  # what dynamo's own hash ignores
        assert step_fingerprint(model, (X,)) == base
    monkeypatch.setattr(torch, "__version__", "0.0.0")
    assert step_fingerprint(model, (X,)) != base


def test_configuration_values_are_written_in_one_order():
    assert fingerprint._ordered({"b", "a"}) == ["'a'", "'b'"]
    assert fingerprint._ordered({2: {"y", "x"}, 1: (3, [4])}) == [["1", ["3", ["4"]]], ["2", ["'x'", "'y'"]]]
    assert fingerprint._ordered(frozenset({frozenset({2}), frozenset({1})})) == [["1"], ["2"]]
    assert fingerprint._ordered(None) == "None"
    assert fingerprint._ordered({"a", frozenset({1})}) == ["'a'", ["1"]]  # by repr: a list and a string compare


MODEL_SOURCE = '''
import torch


class Edited(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.linear(x){tail}


def loss(out):
    return out.sum()
'''


def test_a_class_whose_source_file_changes_gets_another_key(tmp_path, monkeypatch):
    """The module's file edited after import (a notebook's edit, as the fingerprint's cache expects): another key;
    the same length with a later modification time is read again; a file gone leaves the class's name only."""
    import importlib

    path = tmp_path / "edited_model.py"
    path.write_text(MODEL_SOURCE.format(tail=" * 1"))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(__import__("sys").modules, "edited_model", raising=False)
    module = importlib.import_module("edited_model")
    model = module.Edited()
    first = step_fingerprint(model, (X,))
    assert step_fingerprint(model, (X,)) == first
    path.write_text(MODEL_SOURCE.format(tail=" * 2"))  # the same size
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    second = step_fingerprint(model, (X,))
    assert second != first
    path.write_text(MODEL_SOURCE.format(tail=" * 20"))
    assert step_fingerprint(model, (X,)) not in (first, second)
    third = step_fingerprint(model, (X,))
    loss_key = step_fingerprint(Holder(), (X,), module.loss)  # the loss's code is unchanged by each edit below
    previous = path.stat()
    path.write_text(MODEL_SOURCE.format(tail=" * 200"))  # one byte longer, at the same modification time
    os.utime(path, ns=(previous.st_atime_ns, previous.st_mtime_ns))
    assert step_fingerprint(model, (X,)) not in (first, second, third)
    assert step_fingerprint(Holder(), (X,), module.loss) != loss_key
    path.unlink()
    gone = step_fingerprint(model, (X,))
    assert gone == step_fingerprint(model, (X,)) and gone not in (first, second)
    monkeypatch.delitem(__import__("sys").modules, "edited_model")


NESTED_LOSS = "def loss(out):\n    return (lambda t: t * 2)(out).sum()\n"


def test_code_without_a_source_file_is_keyed_by_its_code():
    """Functions made by exec have no file: their code alone keys them, so two made from one text (two code objects,
    an inner one each, at other addresses, as in another process) are equal."""
    namespace: dict = {}
    exec("def loss(out):\n    return out.sum() * 2\n", namespace)  # no file behind it
    exec("def other(out):\n    return out.sum() * 3\n", namespace)
    model = Holder()
    assert step_fingerprint(model, (X,), namespace["loss"]) == step_fingerprint(model, (X,), namespace["loss"])
    first, second = {}, {}
    exec(NESTED_LOSS, first)
    exec(NESTED_LOSS, second)
    assert repr(first["loss"].__code__.co_consts) != repr(second["loss"].__code__.co_consts)  # two addresses
    assert step_fingerprint(model, (X,), first["loss"]) == step_fingerprint(model, (X,), second["loss"])
    assert step_fingerprint(model, (X,), namespace["loss"]) != step_fingerprint(model, (X,), namespace["other"])
    assert fingerprint._source_hash(namespace["loss"]) is None and fingerprint._source_hash(len) is None


def relu_step(x):
    return torch.relu(x)


def gelu_step(x):
    return torch.nn.functional.gelu(x)


def test_dynamo_graph_hash_reads_the_graph_and_its_inputs():
    """Graphs traced by torch.fx from two functions: the hash follows the code and each input's shape, strides,
    dtype, device and requires_grad, and not the inputs' values."""
    relu = torch.fx.symbolic_trace(relu_step)
    again = torch.fx.symbolic_trace(relu_step)
    gelu = torch.fx.symbolic_trace(gelu_step)
    x = torch.zeros(2, 4)
    base = dynamo_graph_hash(relu, [x])
    assert dynamo_graph_hash(again, [torch.ones(2, 4)]) == base
    others = [dynamo_graph_hash(gelu, [x]), dynamo_graph_hash(relu, [torch.zeros(4, 2)]),
              dynamo_graph_hash(relu, [torch.zeros(4, 2).t()]), dynamo_graph_hash(relu, [x.double()]),
              dynamo_graph_hash(relu, [x.to("meta")]), dynamo_graph_hash(relu, [torch.zeros(2, 4, requires_grad=True)]),
              dynamo_graph_hash(relu, [torch.zeros(2, 4), 3])]
    assert len({base, *others}) == 1 + len(others)
