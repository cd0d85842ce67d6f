# TEMPORARY (loop branch): thin wrappers over reference.sampling until the issue-2 ops are merged.
import collections

import pytest
import torch

from specdec_cuda import ops
from specdec_cuda.reference import sampling as ref
from specdec_cuda.reference.philox import Purpose

SampleResult = collections.namedtuple("SampleResult", "tokens status")
VerifyResult = collections.namedtuple("VerifyResult", "tokens num_accepted accepted status")


def _rows(x, n, dtype):
    t = torch.as_tensor(x, dtype=dtype).reshape(-1).cpu()
    return t.expand(n) if t.numel() == 1 else t


def _sample(logits, temperature=1.0, top_k=0, top_p=1.0, seed=0, position=0, *, purpose=Purpose.SAMPLE, substream=0):
    n = logits.shape[0]
    t, s = ref.sample(logits, _rows(temperature, n, torch.float64), _rows(top_k, n, torch.int64),
                      _rows(top_p, n, torch.float64), _rows(seed, n, torch.int64), _rows(position, n, torch.int64),
                      purpose, substream)
    return SampleResult(t.to(logits.device), s.to(logits.device))


def _verify(draft_tokens, cu_num_draft, target_logits, draft_logits, temperature=0.0, top_k=0, top_p=1.0, seed=0,
            position=0, *, typical=False, typical_epsilon=0.3, typical_alpha=0.09, strategy="auto", max_draft=None):
    b = cu_num_draft.numel() - 1
    out = ref.verify_chain(draft_tokens, cu_num_draft, target_logits, draft_logits, _rows(temperature, b, torch.float64),
                           _rows(top_k, b, torch.int64), _rows(top_p, b, torch.float64), _rows(seed, b, torch.int64),
                           _rows(position, b, torch.int64), typical, typical_epsilon, typical_alpha)
    tokens, num_accepted, accepted, status = out
    if max_draft is not None and tokens.shape[1] < max_draft + 1:
        tokens = torch.nn.functional.pad(tokens, (0, max_draft + 1 - tokens.shape[1]), value=-1)
        accepted = torch.nn.functional.pad(accepted, (0, max_draft - accepted.shape[1]), value=-1)
    return VerifyResult(tokens, num_accepted, accepted, status)


if not hasattr(ops, "sample"):
    ops.sample = _sample
    ops.verify_chain = _verify
