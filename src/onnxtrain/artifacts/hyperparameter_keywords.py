"""generate_artifacts' answer to hyper-parameters passed as keywords it does not have.

Some apps pass ``optimizer_config={"lr": ..., "weight_decay": ...}`` (or ``lr=...``) to generate_artifacts.
onnxruntime-training 1.19.2's has no such keyword and no ``**extra_options``, so Python raises a TypeError there;
onnxtrain raises the same TypeError and says where the values go: the learning rate to the Optimizer at training
time, the others to the optimizer block, with the call the given values make.
"""

from __future__ import annotations

import functools
import inspect
import numbers
from collections.abc import Mapping

from onnxtrain.blocks import optim
from onnxtrain.builtins import OptimType

__all__ = ["hyperparameters_where_they_go"]


# keywords that carry optimizer hyper-parameters in other trainers' APIs: a dict of them, or one each
_HYPERPARAMETER_DICTS = frozenset({"optimizer_config", "optimizer_options", "optimizer_params", "optimizer_kwargs",
                                   "optimizer_args"})
_HYPERPARAMETERS = frozenset({"lr", "learning_rate", "weight_decay", "betas", "eps", "momentum", "nesterov",
                              "dampening"})
_LEARNING_RATE = ("lr", "learning_rate")


def _literal(value):
    """``value`` as written in a call: a list of numbers as a tuple (betas), a numpy number as a Python one."""
    if isinstance(value, (list, tuple)):
        return tuple(_literal(v) for v in value)
    return value.item() if hasattr(value, "item") and isinstance(value, numbers.Number) else value


def _hyperparameters_hint(keyword: str, value, optimizer) -> str:
    """Where the hyper-parameters given as ``keyword=value`` go: the learning rate to the Optimizer at training
    time, the others to the optimizer block's arguments; with the call they make when they are known."""
    block = (optimizer.name if isinstance(optimizer, OptimType) else
             type(optimizer).__name__ if type(optimizer) in (optim.AdamW, optim.Adam, optim.SGD) else "AdamW")
    text = ("; generate_artifacts takes no hyper-parameters (nor does onnxruntime-training's): set the learning "
            "rate at training time with onnxtrain.api.Optimizer.set_learning_rate(lr) or an LR scheduler "
            "(onnxtrain.api.LinearLRScheduler, CosineLRScheduler, StepLRScheduler), and pass the others to the "
            "optimizer block: optimizer=onnxtrain.blocks.AdamW(betas=..., eps=..., weight_decay=...), "
            "Adam(betas=..., eps=..., weight_decay=...) or SGD(momentum=..., nesterov=..., weight_decay=...)")
    given = dict(value) if keyword in _HYPERPARAMETER_DICTS and isinstance(value, Mapping) else \
        {keyword: value} if keyword in _HYPERPARAMETERS else {}
    if not given or not all(isinstance(k, str) for k in given):
        return text
    accepted = inspect.signature(getattr(optim, block).__init__).parameters
    arguments = ", ".join(f"{k}={_literal(v)!r}" for k, v in given.items() if k in accepted and k != "self")
    lr = [given[k] for k in _LEARNING_RATE if k in given]
    others = [k for k in given if k not in accepted and k not in _LEARNING_RATE]
    steps = ([f"optimizer=onnxtrain.blocks.{block}({arguments})"] if arguments or not lr else []) + \
        ([f"Optimizer.set_learning_rate({_literal(lr[0])!r})"] if lr else [])
    text += "; here: " + ", then ".join(steps)
    if others:
        text += (f" ({', '.join(map(repr, others))}: not {'an argument' if len(others) == 1 else 'arguments'} of "
                 f"onnxtrain.blocks.{block})")
    return text


def hyperparameters_where_they_go(function):
    """``function`` (generate_artifacts, whose signature it keeps) raising, for an unexpected keyword that carries
    optimizer hyper-parameters (``optimizer_config={"lr": ..., "weight_decay": ...}``), Python's TypeError, as
    the peer does, that also says where they go."""
    parameters = inspect.signature(function).parameters

    @functools.wraps(function)
    def checked(*args, **kwargs):
        keyword = next((k for k in kwargs if k not in parameters), None)
        if keyword in _HYPERPARAMETER_DICTS or keyword in _HYPERPARAMETERS:
            optimizer = kwargs.get("optimizer", args[4] if len(args) > 4 else None)
            raise TypeError(f"{function.__name__}() got an unexpected keyword argument {keyword!r}"
                            f"{_hyperparameters_hint(keyword, kwargs[keyword], optimizer)}")
        return function(*args, **kwargs)

    return checked
