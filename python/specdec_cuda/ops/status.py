"""Per-row status codes of every op: the Python mirror of ``csrc/kernels/common/status.h``.

Kernels never raise (that would synchronise with the host); they write one ``int32`` code per batch
row into a ``status`` output, and a flagged row emits nothing (tokens -1, nothing accepted or
moved). This module is the only Python copy of the table (``tests/test_status.py`` holds it equal
to the C++ header); ops and the decoding loop turn codes into messages with :func:`describe` and
:func:`raise_for`.

====  ===============================  ==========================================================
code  name                             meaning (ops that write it)
====  ===============================  ==========================================================
0     ``STATUS_OK``                    ok
1     ``STATUS_NONFINITE_LOGITS``      a logit row held NaN or +inf (after the temperature) or
                                       only -inf (sample, verify_chain, verify_tree); NaN / +inf
                                       among a row's top-K log-probs (ddtree_build)
2     ``STATUS_DRAFT_OUT_OF_RANGE``    a draft token outside [0, vocab), or unusable
                                       ``cu_num_draft`` entries (verify_chain, verify_tree)
3     ``STATUS_BAD_PARAMS``            temperature < 0 or NaN, or top_p outside (0, 1]
                                       (sample, verify_chain, verify_tree)
4     ``STATUS_MALFORMED_TREE``        a tree row is not a valid tree (build_tree, verify_tree),
                                       a bad guess length or cache_len (lookahead_mask)
5     ``STATUS_BAD_COMPACTION``        not a valid compaction request (compact_kv)
====  ===============================  ==========================================================
"""

from __future__ import annotations

import torch

__all__ = [
    "STATUS_OK",
    "STATUS_NONFINITE_LOGITS",
    "STATUS_DRAFT_OUT_OF_RANGE",
    "STATUS_BAD_PARAMS",
    "STATUS_MALFORMED_TREE",
    "STATUS_BAD_COMPACTION",
    "STATUS_NAMES",
    "STATUS_MESSAGES",
    "describe",
    "flagged_rows",
    "raise_for",
]

STATUS_OK = 0
STATUS_NONFINITE_LOGITS = 1
STATUS_DRAFT_OUT_OF_RANGE = 2
STATUS_BAD_PARAMS = 3
STATUS_MALFORMED_TREE = 4
STATUS_BAD_COMPACTION = 5

# The C++ enumerator of each code (csrc/kernels/common/status.h), for messages and the mirror test.
STATUS_NAMES = {
    STATUS_OK: "kStatusOk",
    STATUS_NONFINITE_LOGITS: "kStatusNonFiniteLogits",
    STATUS_DRAFT_OUT_OF_RANGE: "kStatusDraftTokenOutOfRange",
    STATUS_BAD_PARAMS: "kStatusBadSamplingParams",
    STATUS_MALFORMED_TREE: "kStatusMalformedTree",
    STATUS_BAD_COMPACTION: "kStatusBadCompaction",
}

STATUS_MESSAGES = {
    STATUS_OK: "ok",
    STATUS_NONFINITE_LOGITS: "a logit row held NaN or +inf (after temperature) or only -inf",
    STATUS_DRAFT_OUT_OF_RANGE: "a draft token is outside [0, vocab) or the row's cu_num_draft "
    "entries are unusable",
    STATUS_BAD_PARAMS: "bad sampling parameters: temperature < 0 or NaN, or top_p outside (0, 1]",
    STATUS_MALFORMED_TREE: "the draft tree is malformed (a parent not below its node, a root parent "
    "other than -1, an empty row or more than max_nodes nodes; build_tree with an hf_mask: cache_len "
    "outside [0, max_prefix]; lookahead_mask: a guess length outside [0, guess_len] or cache_len < 0)",
    STATUS_BAD_COMPACTION: "not a valid KV compaction (accepted nodes must increase, num_accepted "
    "must fit the path, dst_start <= src_start, every slot inside the cache)",
}


def describe(code: int) -> str:
    """The meaning of one status code, e.g. ``describe(3)`` -> ``"bad sampling parameters: ..."``.

    Unknown codes are named as such (with the number), never mistaken for another meaning.
    """
    code = int(code)
    return STATUS_MESSAGES.get(code, f"unknown status code {code}")


def flagged_rows(status: torch.Tensor | list[int]) -> list[tuple[int, int]]:
    """``(row, code)`` of every row whose code is not ``STATUS_OK`` (reads the device once).

    Shape: status [N] int32 (an op's ``status`` output), or a list of ints already on the host.
    """
    if isinstance(status, torch.Tensor):
        # tolist reads any device: ~1 us on the CPU, where detach / flatten / cpu first added ~4
        status = (status if status.dim() == 1 else status.reshape(-1)).tolist()
    return [(row, int(code)) for row, code in enumerate(status) if code != STATUS_OK]


def raise_for(status: torch.Tensor | list[int], what: str, *, exc: type[Exception] = ValueError,
              most: int = 8) -> None:
    """Raise ``exc`` naming every flagged row (up to ``most`` of them) with its code and meaning.

    Shape: status [N] int32 (an op's ``status`` output), or a list of ints already on the host.
    ``what`` names the operation in the message, e.g. ``"verify_chain"`` or ``"sampling the first
    token"``. Returns silently when every row is ok. Reading a device tensor synchronises with it.

    Example
    -------
    >>> raise_for([0, 3], "sample")
    Traceback (most recent call last):
    ...
    ValueError: sample: 1 row(s) flagged:
      row 1: status 3 (bad sampling parameters: temperature < 0 or NaN, or top_p outside (0, 1])
    """
    bad = flagged_rows(status)
    if not bad:
        return
    lines = [f"row {row}: status {code} ({describe(code)})" for row, code in bad[:most]]
    more = f" (and {len(bad) - most} more)" if len(bad) > most else ""
    raise exc(f"{what}: {len(bad)} row(s) flagged{more}:\n  " + "\n  ".join(lines))
