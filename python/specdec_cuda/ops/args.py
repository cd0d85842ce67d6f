"""Argument coercion shared by the ops and models: user values to the tensors the kernels read.

Three functions, one per kind of argument:

- :func:`tensor`: an argument that must already be a tensor (activations, logits, cache blocks).
- :func:`index_tensor`: integer indices or lengths (``parents``, ``cu_num_nodes``, ``lengths``).
- :func:`per_row`: a per-row parameter given as a scalar or one value per row (``temperature``,
  ``top_k``, ``seed``, ``position``, ``cache_len``, ``max_nodes``).

The rules every op follows: an integer parameter is never truncated from a float, a bool is not
a number, and every error names the argument. Errors a user can cause are ``TypeError`` (wrong
kind or dtype) or ``ValueError`` (wrong shape, or an int that does not fit the parameter's dtype).

This module depends on torch only, so any part of the package can import it.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

__all__ = ["tensor", "index_tensor", "per_row"]

_INDEX_DTYPES = (torch.int64, torch.int32)


def tensor(value, name: str) -> torch.Tensor:
    """``value`` itself, checked to be a ``torch.Tensor``.

    Accepts: a tensor of any dtype, shape and device. Returns: the same object (no copy, no
    conversion; the caller checks dtype and shape). Raises: ``TypeError`` "<name> must be a
    tensor, got <type>" for anything else.
    """
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a tensor, got {type(value).__name__}")
    return value


def _describe(dtypes: Optional[Sequence[torch.dtype]]) -> str:
    if dtypes is None:
        return "integers (an integer tensor or a list of ints)"
    names = " or ".join(str(d).removeprefix("torch.") for d in dtypes)
    return f"an {names} tensor"


def _not_truncated(name: str, dtype: torch.dtype) -> str:
    # the explanation appended to a dtype error: both phrasings the ops have used
    if dtype == torch.bool:
        return " (a bool is not a number)"
    if dtype.is_floating_point or dtype.is_complex:
        return f" ({name} must hold integers; a float is never truncated)"
    return ""


def index_tensor(value, name: str, device: Optional[torch.device] = None,
                 dtypes: Optional[Sequence[torch.dtype]] = _INDEX_DTYPES) -> torch.Tensor:
    """``value`` (a tensor, a list of ints, a NumPy array) as a contiguous int64 tensor.

    Accepts: anything ``torch.as_tensor`` takes whose dtype is one of ``dtypes`` (default int64 or
    int32); ``dtypes=None`` accepts every integer dtype (int8 ... uint8 too) but never a bool,
    floating or complex one. Any shape; the caller checks it.
    Returns: the same shape, int64, contiguous, on ``device`` (``None``: where ``value`` is, the CPU
    for a list); ``value`` itself when it already is all of that.
    Raises: ``TypeError`` "<name>: expected an int64 or int32 tensor, got <what>" (or "expected
    integers") naming the rejected type or dtype; a float dtype adds "<name> must hold integers".
    """
    want = _describe(dtypes)
    try:
        t = torch.as_tensor(value, device=device)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise TypeError(f"{name}: expected {want}, got {type(value).__name__} ({exc})") from None
    if dtypes is None:
        ok = not (t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool)
    else:
        ok = t.dtype in dtypes
    if not ok:
        raise TypeError(f"{name}: expected {want}, got {t.dtype}{_not_truncated(name, t.dtype)}")
    return t.to(torch.int64).contiguous()


def _check_kind(t: torch.Tensor, name: str, dtype: torch.dtype) -> None:
    if dtype.is_floating_point:
        if t.dtype == torch.bool or t.dtype.is_complex:
            raise TypeError(f"{name}: expected real numbers, got {t.dtype}{_not_truncated(name, t.dtype)}")
    elif t.dtype == torch.bool or t.dtype.is_floating_point or t.dtype.is_complex:
        raise TypeError(f"{name}: expected integers, got {t.dtype}{_not_truncated(name, t.dtype)}")


def per_row(value, name: str, rows: int, dtype: torch.dtype,
            device: Optional[torch.device] = None) -> torch.Tensor:
    """A per-row parameter as a contiguous ``[rows]`` tensor of ``dtype`` on ``device``.

    Accepts: a Python int or float (not a bool), a 0-d tensor (both broadcast to every row), or a
    ``[rows]`` tensor, list or NumPy array. For an integer ``dtype`` the values must be integers
    already (any integer dtype; a float is an error, never truncated); for a floating ``dtype``
    any real, non-bool dtype.
    Returns: ``[rows]`` ``dtype``, contiguous, on ``device`` (``None``: where ``value`` is, the CPU
    for a Python value). A tensor that already is all of that is returned as is, without a copy
    (the decoding loop passes its per-row parameters every step).
    Raises: ``TypeError`` for a bool, a non-number, or a float / bool / complex dtype where
    integers are expected ("<name>: expected integers" / "<name> must be an integer" / "<name> must
    hold integers"); ``ValueError`` "<name>: expected shape (rows,) ... <name> must be a scalar or
    have shape [rows]" for any other shape, and for an int that does not fit ``dtype``. A tensor's
    values are not range-checked (that would read the device).
    """
    if isinstance(value, torch.Tensor):
        if (value.dtype == dtype and value.shape == (rows,) and (device is None or value.device == device)
                and value.is_contiguous()):
            return value  # the decoding loop's per-row parameters: nothing to convert
        t = value
    elif isinstance(value, bool):
        raise TypeError(f"{name} must be a number or a tensor, got bool (a bool is not a number)")
    elif isinstance(value, (int, float)):
        if isinstance(value, float) and not dtype.is_floating_point:
            raise TypeError(f"{name}: expected integers, got {value!r} ({name} must be an integer; a float is "
                            f"never truncated)")
        try:
            return torch.full((rows,), value, dtype=dtype, device=device)
        except RuntimeError:
            raise ValueError(f"{name} = {value} does not fit in {str(dtype).removeprefix('torch.')}") from None
    else:
        try:
            t = torch.as_tensor(value)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise TypeError(f"{name} must be a number or a tensor, got {type(value).__name__} ({exc})") from None
    _check_kind(t, name, dtype)
    if t.dim() == 0:
        t = t.expand(rows)
    if t.shape != (rows,):
        raise ValueError(f"{name}: expected shape ({rows},), got {tuple(t.shape)} ({name} must be a scalar or have "
                         f"shape [{rows}], one value per row)")
    return t.to(device=device, dtype=dtype).contiguous()
