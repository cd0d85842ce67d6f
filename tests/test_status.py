"""The one status table: csrc/kernels/common/status.h and its Python mirror agree, and every op
reports its own code from it (compact_kv's is not another op's)."""

from __future__ import annotations

import pathlib
import re

import pytest
import torch

import specdec_cuda.ops as ops
from specdec_cuda.ops import status as st
from specdec_cuda.reference import sampling as ref_sampling
from specdec_cuda.reference import tree as ref_tree

pytestmark = pytest.mark.kernels  # the compiled ops against their references (make cpu-only-check)

HEADER = pathlib.Path(__file__).resolve().parents[1] / "csrc/kernels/common/status.h"


def header_table() -> dict[int, str]:
    """{code: enumerator} parsed from the C++ enum RowStatus."""
    body = re.search(r"enum RowStatus : int32_t \{(.*?)\};", HEADER.read_text(), re.S).group(1)
    found = re.findall(r"^\s*(kStatus\w+)\s*=\s*(\d+)\s*,", body, re.M)
    return {int(code): name for name, code in found}


def test_python_mirror_equals_header():
    table = header_table()
    assert table == st.STATUS_NAMES
    assert len(set(table.values())) == len(table)  # one meaning per code, one code per meaning
    assert set(st.STATUS_MESSAGES) == set(table)


def test_reference_constants_are_the_table():
    assert (ref_sampling.STATUS_OK, ref_sampling.STATUS_NONFINITE_LOGITS,
            ref_sampling.STATUS_DRAFT_OUT_OF_RANGE, ref_sampling.STATUS_BAD_PARAMS) == (
        st.STATUS_OK, st.STATUS_NONFINITE_LOGITS, st.STATUS_DRAFT_OUT_OF_RANGE, st.STATUS_BAD_PARAMS)
    assert ref_tree.STATUS_MALFORMED_TREE == st.STATUS_MALFORMED_TREE
    assert ops.STATUS_BAD_PARAMS == st.STATUS_BAD_PARAMS and ops.STATUS_MESSAGES is st.STATUS_MESSAGES


def test_describe_and_raise_for():
    assert st.describe(0) == "ok"
    assert "top_p" in st.describe(torch.tensor(3, dtype=torch.int32))
    assert st.describe(99) == "unknown status code 99"
    st.raise_for(torch.zeros(4, dtype=torch.int32), "sample")  # nothing flagged: no error
    with pytest.raises(ValueError, match=r"(?s)verify_tree: 2 row\(s\) flagged.*row 1: status 4 "
                       r"\(the draft tree is malformed.*row 3: status 5 \(not a valid KV compaction"):
        st.raise_for(torch.tensor([0, 4, 0, 5], dtype=torch.int32), "verify_tree")
    with pytest.raises(RuntimeError, match=r"\(and 2 more\)"):
        st.raise_for([1] * 10, "x", exc=RuntimeError)
    assert st.flagged_rows([0, 2, 0, 1]) == [(1, 2), (3, 1)]


def test_compact_kv_has_its_own_code():
    """An invalid compaction is STATUS_BAD_COMPACTION (5), not code 1 (non-finite logits)."""
    k = torch.zeros(2, 1, 8, 2)
    status = ops.compact_kv([k], torch.tensor([[0, 3, 2], [0, 1, 2]]), torch.tensor([2, 2]),
                            torch.tensor([0, 0]), check=False)
    assert status.tolist() == [st.STATUS_BAD_COMPACTION, st.STATUS_OK]
    with pytest.raises(ValueError, match="row 0: .* is not a valid KV compaction"):
        ops.compact_kv([k], torch.tensor([[0, 3, 2]] * 2), torch.tensor([2, 2]), torch.tensor([0, 0]))
